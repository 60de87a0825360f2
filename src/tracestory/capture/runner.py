"""``python -m tracestory.capture.runner``: the per-process side of a capture.

Used where the workload runs in another process than ``tracestory capture``: every rank of
``torchrun --nproc_per_node=N -m tracestory.capture.runner ...`` (each writes
``rank<r>.trace.json.gz``), and the child of nsys/ncu when a range must skip occurrences
(``--profiler-api``: occurrence K between cudaProfilerStart/Stop, never torch.profiler).

Each process writes ``rank<r>.status.json`` beside its trace so the parent can record what
happened, and keeps it current, each time atomically: ``{"state": "running"}`` before the
workload starts, then ``trace_path`` and ``complete`` as soon as a trace is written (a range
is written when it closes), then the whole :class:`TorchCaptureResult` with ``"state":
"done"``. A process killed part-way (SIGKILL, SIGSEGV) leaves the last of these, so the
parent knows whether a complete trace was written before it died. The exit code is the
workload's (``128 + signal`` when a stop signal ended it).

A rank of a multi-process run (``WORLD_SIZE`` > 1) that used CUDA ends with ``os._exit`` once its
status says ``done`` (its trace is written by then): the interpreter's teardown of NCCL
communicators, CUDA graphs that captured collectives and compile workers has nothing left to
write and can block (a TP=2 serving capture on two H100s had ranks that did not exit within
torchrun's 30 s), and the launcher needs every rank to exit for its own exit code 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from ..outputs import write_text

RUNNER_ENV = "TRACESTORY_CAPTURE_RUNNER"   # set in a workload run by this module
from .torch import TorchOptions, _rank, capture_in_process
from .workload import parse_workload


def build_argv(out_dir: str, opts: TorchOptions, *, profiler_api: bool = False) -> list[str]:
    """Arguments of this module (after ``-m tracestory.capture.runner``), workload excluded."""
    argv = ["--out-dir", out_dir]
    if profiler_api:
        argv.append("--profiler-api")
    for f in dataclasses.fields(TorchOptions):
        v = getattr(opts, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(v, bool):
            if v:
                argv.append(flag)
        elif v is not None and v != f.default:
            argv += [flag, str(v)]
    return argv


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tracestory.capture.runner")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--profiler-api", action="store_true")
    for f in dataclasses.fields(TorchOptions):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, action="store_true")
        elif f.name == "range":
            p.add_argument(flag)
        else:
            p.add_argument(flag, type=int, default=f.default)
    p.add_argument("workload", nargs=argparse.REMAINDER)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    opts = TorchOptions(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(TorchOptions)})
    workload = parse_workload(ns.workload)
    rank = _rank()
    os.environ[RUNNER_ENV] = "1"        # the workload knows its process ends here (serve: no exit of its own)
    Path(ns.out_dir).mkdir(parents=True, exist_ok=True)
    status = Path(ns.out_dir) / f"rank{rank}.status.json"

    def record(**fields) -> None:
        write_text(status, json.dumps({"rank": rank, "pid": os.getpid(), **fields}, indent=1))

    record(state="running")
    result = capture_in_process(workload, opts, ns.out_dir, force_profiler_api=ns.profiler_api,
                                on_trace=lambda path, complete: record(state="running", trace_path=path,
                                                                       complete=complete))
    record(state="done", **dataclasses.asdict(result))
    if result.error:
        sys.stderr.write(result.error.rstrip() + "\n")  # the rank's only channel to the user
    if _hard_exit_wanted():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(result.exit_code)
    return result.exit_code


def _hard_exit_wanted() -> bool:
    """A rank of a multi-process run that initialised CUDA (module docstring)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False
    torch = sys.modules.get("torch")
    return world > 1 and torch is not None and bool(torch.cuda.is_initialized())


if __name__ == "__main__":
    sys.exit(main())
