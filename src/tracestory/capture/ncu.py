"""Nsight Compute runbook as argv: ``ncu ... --export`` then two ``ncu --import --csv``.

The profile command follows the capture runbooks: ``--set full`` (or ``--section S``
per listed section instead), ``--target-processes all``, ``--launch-skip/--launch-count``,
``--kernel-name regex:EXPR``, ``--nvtx --nvtx-include "NAME/"`` for ``--range NAME`` (the
push/pop range of :func:`tracestory.region`), ``--clock-control none`` by default (leave the
GPU's clocks as the workload would see them), ``--force-overwrite``. With ``--skip K`` (K > 0)
the workload runs under the profiler-API runner and ncu gets ``--profile-from-start off``:
kernels of occurrence K of NAME only; under ``--load`` the runner's bracket alone bounds it.

After the export, ``ncu --import X.ncu-rep --csv --page raw`` and ``--page details`` write the
two CSVs the ingest reads (stdout redirected to ``X_raw.csv`` / ``X_details.csv``).

One rank of a torchrun job (``--torchrun N --profile-rank R``): ncu wraps rank R only
(:mod:`.one_rank`: ``torchrun ... -m tracestory.capture.one_rank --rank R ncu ... -- ARGS``), the
other ranks run plain, and NCCL kernels are never profiled on that rank (the kernel filter is
:func:`without_nccl` of ``--kernel-name``, or of every kernel): ncu replays each kernel it
profiles, and a replayed collective would wait for peers that are not replaying it. The
report then holds rank R's kernels only. Without ``--profile-rank`` every rank runs under one
ncu (``ncu ... torchrun ...``), which suits jobs without collectives in the profiled kernels.
"""

from __future__ import annotations

from typing import Any, Mapping

from .nsys import uses_profiler_api, workload_argv
from .workload import Workload

INSTALL_HINT = ("install NVIDIA Nsight Compute (https://developer.nvidia.com/nsight-compute, "
                "or the CUDA toolkit's nsight-compute package) and put `ncu` on PATH")


def kernel_filter(expr: str) -> str:
    """ncu matches ``--kernel-name`` exactly unless prefixed ``regex:``; ours is a regex."""
    return expr if expr.startswith(("regex:", "regex=")) else f"regex:{expr}"


NCCL = "nccl"     # every NCCL kernel's name holds it (ncclDevKernel_*, ncclKernel_*)


def without_nccl(expr: str | None) -> str:
    """An ncu ``regex:`` filter matching ``expr`` (every kernel when None) but no kernel whose
    name contains ``nccl``: a negative look-ahead at the start of the name, and ``expr`` as a
    look-ahead anywhere after it (ECMAScript syntax, which ncu's regex filter accepts)."""
    body = None
    if expr:
        body = expr.split(":", 1)[1] if expr.startswith(("regex:", "regex=")) else expr
    keep = f"(?=.*(?:{body}))" if body else ""
    return f"regex:^(?!.*{NCCL}){keep}.*"


def _ncu_options(v: Mapping[str, Any], out_base: str) -> list[str]:
    """``ncu`` and its options up to ``--export <out_base>``, without the profiled command."""
    argv = ["ncu", "--force-overwrite", "--target-processes", str(v.get("target_processes") or "all")]
    sections = v.get("sections")
    if sections:
        for s in sections:
            argv += ["--section", s]
    else:
        argv += ["--set", str(v.get("set") or "full")]
    if v.get("launch_skip") is not None:
        argv += ["--launch-skip", str(v["launch_skip"])]
    if v.get("launch_count") is not None:
        argv += ["--launch-count", str(v["launch_count"])]
    if v.get("profile_rank") is not None:
        argv += ["--kernel-name", without_nccl(v.get("kernel_name"))]
    elif v.get("kernel_name"):
        argv += ["--kernel-name", kernel_filter(v["kernel_name"])]
    if v.get("kernel_name_base"):
        argv += ["--kernel-name-base", str(v["kernel_name_base"])]
    if v.get("range"):
        if v.get("load") is None:      # a server's `iteration N` names: the runner's bracket only
            argv += ["--nvtx", "--nvtx-include", f"{v['range']}/"]
        if uses_profiler_api(v):
            argv += ["--profile-from-start", "off"]
    return argv + ["--clock-control", str(v.get("clock_control") or "none"), "--export", out_base]


def profile_argv(w: Workload, v: Mapping[str, Any], out_base: str, staging: str) -> list[str]:
    """``ncu ...`` (or, with ``--profile-rank``, ``torchrun ... one_rank ... ncu ...``); the
    report is ``<out_base>.ncu-rep``."""
    ncu = _ncu_options(v, out_base)
    if v.get("profile_rank") is None:
        return ncu + workload_argv(w, v, staging)
    inner = workload_argv(w, v, staging)
    # torchrun's per-rank words, without the launcher: the runner (``-m ...``) or the workload
    i = inner.index(f"--nproc_per_node={v['torchrun']}")
    return [*inner[:i + 1], "-m", "tracestory.capture.one_rank", "--rank", str(v["profile_rank"]),
            *ncu, "--", *inner[i + 1:]]


def import_argv(report: str, page: str) -> list[str]:
    """``ncu --import REPORT --csv --page PAGE`` (stdout is the CSV)."""
    return ["ncu", "--import", report, "--csv", "--page", page]
