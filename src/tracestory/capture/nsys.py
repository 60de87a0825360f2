"""Nsight Systems runbook as argv: ``nsys profile`` then ``nsys export --type sqlite``.

The profile command follows the capture runbooks: ``--trace=cuda,nvtx,osrt`` (+``mpi``),
``--cuda-memory-usage=true``, ``--sample=none``, ``--force-overwrite=true``. With ``--range
NAME`` the capture is bounded by the first NVTX range NAME (``--capture-range=nvtx
--nvtx-capture=NAME --capture-range-end=stop``; ``NSYS_NVTX_PROFILER_REGISTER_ONLY=0`` so
unregistered range names match, as the runbooks do). With ``--skip K`` (K > 0) nsys itself
cannot skip occurrences, so the workload runs under ``python -m tracestory.capture.runner
--profiler-api`` which brackets occurrence K with cudaProfilerStart/Stop, and nsys uses
``--capture-range=cudaProfilerApi``. The same runner brackets the first matching occurrence
under ``--load``, where the server's regions are named ``iteration N`` and nsys's exact NVTX
name match would miss them.

Only the argv is built here; running and recording is :mod:`.pipeline`'s job. nsys could not
be run on the project's device machine (it is not installed there), so these commands are
tested by their argv only.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from .runner import build_argv as runner_argv
from .torch import TorchOptions
from .workload import Workload

INSTALL_HINT = ("install NVIDIA Nsight Systems (https://developer.nvidia.com/nsight-systems, "
                "or the CUDA toolkit's nsight-systems package) and put `nsys` on PATH")


def uses_profiler_api(v: Mapping[str, Any]) -> bool:
    """A range that the profiler's own NVTX filter cannot express: occurrences to skip, or a
    server's ``iteration N`` regions (``--load``), bracketed by the runner instead."""
    return bool(v.get("range") and (v.get("skip") or v.get("load") is not None))


def workload_argv(w: Workload, v: Mapping[str, Any], staging: str) -> list[str]:
    """The profiled command: plain, torchrun-wrapped, and/or under the profiler-API runner."""
    if uses_profiler_api(v):
        inner = ["-m", "tracestory.capture.runner",
                 *runner_argv(staging, TorchOptions(range=v["range"], skip=v["skip"], count=1),
                              profiler_api=True), "--", *w.target, *w.args]
        if v.get("torchrun"):
            return ["torchrun", f"--nproc_per_node={v['torchrun']}", *inner]
        return [w.python or sys.executable, *inner]
    if v.get("torchrun"):
        return w.torchrun_argv(v["torchrun"])
    return w.argv()


def trace_list(v: Mapping[str, Any]) -> str:
    items = [t.strip() for t in str(v.get("trace") or "cuda,nvtx,osrt").split(",") if t.strip()]
    if v.get("mpi") and "mpi" not in items:
        items.append("mpi")
    return ",".join(items)


def profile_argv(w: Workload, v: Mapping[str, Any], out_base: str, staging: str) -> list[str]:
    """``nsys profile ...``; the report is ``<out_base>.nsys-rep``."""
    argv = ["nsys", "profile", f"--output={out_base}", "--force-overwrite=true",
            f"--trace={trace_list(v)}",
            f"--cuda-memory-usage={'true' if v.get('cuda_memory_usage', True) else 'false'}",
            f"--sample={v.get('sample') or 'none'}"]
    if v.get("range"):
        if uses_profiler_api(v):
            argv += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
        else:
            argv += ["--capture-range=nvtx", f"--nvtx-capture={v['range']}",
                     "--capture-range-end=stop", "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0"]
    return argv + workload_argv(w, v, staging)


def export_argv(out_base: str) -> list[str]:
    """``nsys export`` of the report to ``<out_base>.sqlite``."""
    return ["nsys", "export", "--type=sqlite", "--force-overwrite=true",
            f"--output={out_base}.sqlite", f"{out_base}.nsys-rep"]
