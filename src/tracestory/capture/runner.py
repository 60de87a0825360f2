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
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
