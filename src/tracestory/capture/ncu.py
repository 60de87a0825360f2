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


def profile_argv(w: Workload, v: Mapping[str, Any], out_base: str, staging: str) -> list[str]:
    """``ncu ...``; the report is ``<out_base>.ncu-rep``."""
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
    if v.get("kernel_name"):
        argv += ["--kernel-name", kernel_filter(v["kernel_name"])]
    if v.get("kernel_name_base"):
        argv += ["--kernel-name-base", str(v["kernel_name_base"])]
    if v.get("range"):
        if v.get("load") is None:      # a server's `iteration N` names: the runner's bracket only
            argv += ["--nvtx", "--nvtx-include", f"{v['range']}/"]
        if uses_profiler_api(v):
            argv += ["--profile-from-start", "off"]
    argv += ["--clock-control", str(v.get("clock_control") or "none"), "--export", out_base]
    return argv + workload_argv(w, v, staging)


def import_argv(report: str, page: str) -> list[str]:
    """``ncu --import REPORT --csv --page PAGE`` (stdout is the CSV)."""
    return ["ncu", "--import", report, "--csv", "--page", page]
