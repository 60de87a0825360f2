"""``python -m tracestory.capture.runner``: the per-process side of a capture.

Used where the workload runs in another process than ``tracestory capture``: every rank of
``torchrun --nproc_per_node=N -m tracestory.capture.runner ...`` (each writes
``rank<r>.trace.json.gz``), and the child of nsys/ncu when a range must skip occurrences
(``--profiler-api``: occurrence K between cudaProfilerStart/Stop, never torch.profiler).

Each process writes ``rank<r>.status.json`` (a :class:`TorchCaptureResult` as JSON) beside
its trace so the parent can record what happened; the exit code is the workload's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

from .torch import TorchOptions, capture_in_process
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
    result = capture_in_process(workload, opts, ns.out_dir, force_profiler_api=ns.profiler_api)
    status = Path(ns.out_dir) / f"rank{result.rank}.status.json"
    status.write_text(json.dumps(dataclasses.asdict(result), indent=1), encoding="utf-8")
    if result.error:
        sys.stderr.write(result.error.rstrip() + "\n")  # the rank's only channel to the user
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
