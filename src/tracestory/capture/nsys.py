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

CUDA graphs: nsys traces a replayed graph as one opaque activity per launch unless told
``--cuda-graph-trace=node`` (its default is ``graph``); with ``node`` every kernel of a replay is
its own row carrying the launch's correlation id, so the report can tell graph replays apart
from eager launches. :func:`graph_trace_support` asks the installed nsys (``nsys profile
--help`` lists the option where it exists) and the profile command passes
``--cuda-graph-trace=node`` when it does; the manifest records the mode under
``tool_options.cuda_graph_trace`` and, without support, a warning that graph replays will be
opaque.

Only the argv is built here (and the help text read); running and recording is
:mod:`.pipeline`'s job. nsys could not be run on the project's device machine (it is not
installed there), so these commands are tested by their argv and a stand-in nsys only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any, Mapping

from .runner import build_argv as runner_argv
from .torch import TorchOptions
from .workload import Workload

INSTALL_HINT = ("install NVIDIA Nsight Systems (https://developer.nvidia.com/nsight-systems, "
                "or the CUDA toolkit's nsight-systems package) and put `nsys` on PATH")


GRAPH_TRACE_OPTION = "--cuda-graph-trace"
NO_GRAPH_TRACE = ("this nsys does not list --cuda-graph-trace in `nsys profile --help`: CUDA graph replays "
                  "will be opaque (one activity per graph launch, the kernels inside not traced); a newer "
                  "Nsight Systems traces each node")


def graph_trace_support(nsys: str = "nsys", timeout_s: float = 30.0) -> bool | None:
    """Whether the installed nsys accepts ``--cuda-graph-trace`` (its ``profile --help`` lists
    it); None when ``nsys`` is not on PATH or its help cannot be read (then nothing is claimed)."""
    exe = shutil.which(nsys)
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "profile", "--help"], capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stdout or b"") + (done.stderr or b"")
    if GRAPH_TRACE_OPTION.encode() in text:
        return True
    # a help text that names other profile options but not this one: an nsys without it
    return False if b"--trace" in text else None


def graph_trace_options(supported: bool | None) -> tuple[list[str], dict[str, Any]]:
    """The profile argv's graph option and what the manifest records of it."""
    if supported:
        return [f"{GRAPH_TRACE_OPTION}=node"], {"cuda_graph_trace": "node"}
    if supported is False:
        return [], {"cuda_graph_trace": "graph", "warning": NO_GRAPH_TRACE}
    return [], {"cuda_graph_trace": None, "warning": "nsys not found or its help unreadable: "
                "--cuda-graph-trace not passed"}


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


def profile_argv(w: Workload, v: Mapping[str, Any], out_base: str, staging: str,
                 graph_trace: bool | None = None) -> list[str]:
    """``nsys profile ...``; the report is ``<out_base>.nsys-rep``. ``graph_trace``: what
    :func:`graph_trace_support` said (True adds ``--cuda-graph-trace=node``)."""
    argv = ["nsys", "profile", f"--output={out_base}", "--force-overwrite=true",
            f"--trace={trace_list(v)}",
            f"--cuda-memory-usage={'true' if v.get('cuda_memory_usage', True) else 'false'}",
            f"--sample={v.get('sample') or 'none'}", *graph_trace_options(graph_trace)[0]]
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
