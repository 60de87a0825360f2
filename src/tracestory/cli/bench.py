"""``tracestory bench <workload>``: the built-in workloads, each next to its roofline.

Every bench module (``tracestory.bench.<x>``) provides ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``main(args) -> int`` and imports torch only inside ``main``.
A module not written yet is skipped (only a ModuleNotFoundError for that exact module).

Common flags: ``--json OUT`` (results), ``--device`` (auto/cpu/cuda[:i]), ``--profile``:

* ``torch``: the timed repetitions shrink to one (:func:`tracestory.bench.timer.set_single_iteration`)
  and torch.profiler records the first ``BENCHMARK`` region (warm-up and compilation stay out);
  the Chrome trace is written gzip-compressed to ``--profile-out``
  (default ``tracestory-bench-<name>.trace.json.gz``).
* ``nsys`` / ``ncu``: the same command is re-executed under the tool with the capture range
  bound to ``cudaProfilerStart/Stop``; the timer runs exactly one repetition between them.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

MODULES = ("llama", "attention", "fp8", "moe")


def _bench_modules():
    mods = []
    for name in MODULES:
        full = f"tracestory.bench.{name}"
        try:
            mods.append(importlib.import_module(full))
        except ModuleNotFoundError as e:
            if e.name == full:
                continue
            raise
    return mods


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="OUT", help="write results as JSON")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N")
    p.add_argument("--profile", choices=("torch", "nsys", "ncu"), help="run under a profiler")
    p.add_argument("--profile-out", metavar="PATH",
                   help="trace/report path (torch: .trace.json.gz; nsys/ncu: output base name)")


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="built-in GPU workloads with roofline numbers",
                                  description=__doc__.split("\n\n")[0])
    sub = bench.add_subparsers(dest="bench", required=True, metavar="WORKLOAD")
    for mod in _bench_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=(mod.__doc__ or "").split("\n\n")[0])
        mod.add_arguments(p)
        _common(p)
        p.set_defaults(func=_runner(mod))


def _runner(mod):
    def run(args) -> int:
        prof = getattr(args, "profile", None)
        if prof == "torch":
            return _run_torch_profiled(mod, args)
        if prof in ("nsys", "ncu"):
            return _reexec(prof, mod, args)
        return int(mod.main(args) or 0)

    return run


def _run_torch_profiled(mod, args) -> int:
    import torch

    from ..bench import timer
    from ..capture import region as _region
    from ..capture.torch import RangeController

    out = Path(args.profile_out or f"tracestory-bench-{mod.NAME}.trace.json.gz")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts, record_shapes=True)

    def stop():
        prof.stop()
        raw = out.with_suffix("") if out.suffix == ".gz" else out.with_suffix(out.suffix + ".raw")
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()

    ctl = RangeController("BENCHMARK", 0, 1, prof.start, stop)
    timer.set_single_iteration(True)
    _region.add_listener(ctl)
    try:
        rc = int(mod.main(args) or 0)
    finally:
        ctl.finish()
        _region.remove_listener(ctl)
        timer.set_single_iteration(False)
    print(f"torch trace ({ctl.captured} BENCHMARK region): {out}" if ctl.captured else "no BENCHMARK region ran: no trace")
    return rc


def _strip_profile(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--profile", "--profile-out"):
            skip = True
            continue
        if a.startswith(("--profile=", "--profile-out=")):
            continue
        out.append(a)
    return out


def profiler_argv(tool: str, out_base: str, bench_argv: list[str]) -> list[str]:
    """The command that re-runs ``tracestory bench ...`` under nsys or ncu."""
    me = [sys.executable, "-m", "tracestory.cli", *bench_argv]
    if tool == "nsys":
        return ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
                "--capture-range-end=stop", "--force-overwrite=true", "-o", out_base, *me]
    return ["ncu", "--profile-from-start", "off", "--set", "full", "--nvtx", "-f", "-o", out_base, *me]


def _reexec(tool: str, mod, args) -> int:
    from ..errors import ToolNotFound

    if shutil.which(tool) is None:
        raise ToolNotFound(tool, f"{tool} is not on PATH: install Nsight {'Systems' if tool == 'nsys' else 'Compute'}")
    argv = sys.argv[1:]
    i = argv.index("bench") if "bench" in argv else 0
    bench_argv = _strip_profile(argv[i:])
    out_base = args.profile_out or f"tracestory-bench-{mod.NAME}"
    cmd = profiler_argv(tool, out_base, bench_argv)
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=dict(os.environ))
