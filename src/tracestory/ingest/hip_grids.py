"""Launch grids of AMD kernels in Kineto traces, counted in workgroups (blocks) like every other grid.

Kineto's ROCm backend copies a kernel's ``grid`` and ``block`` from the arguments of the HIP call
that launched it (matched by correlation id). The HIP calls disagree on what the grid counts:
``hipLaunchKernel`` and ``hipModuleLaunchKernel`` take it in workgroups, as CUDA does, but
``hipExtModuleLaunchKernel`` and ``hipHccModuleLaunchKernel`` take the **global work size in
work-items** (threads). rocBLAS and hipBLASLt (Tensile ``Cijk_*`` GEMMs) launch through the
extended call, so their recorded grid is ``block`` times too large: a GEMM of 240 workgroups of
256 work-items shows ``grid [61440, 1, 1]``.

The tables' ``grid_*`` columns count blocks everywhere (blocks per SM/CU, small-grid findings), so
a kernel launched by a work-item call has each dimension divided by its block size, rounded up
(HIP allows a global size that is not a multiple of the workgroup size: the last workgroup is
partial). A kernel whose launching call is unknown, or whose block size is not recorded, is left
as read. Limits: only the two call names above are known to count work-items; a trace of another
tool that already divides would be divided twice (Kineto as of 2024-2026 does not).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..trace import Trace

WORK_ITEM_LAUNCHES = ("hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel")


def grids_in_workgroups(trace: Trace) -> Trace:
    """``trace`` with the grids of kernels launched by a work-item call (see the module
    docstring) counted in workgroups; the same object when there are none."""
    k, api = trace.kernels, trace.api
    codes = [c for n in WORK_ITEM_LAUNCHES if (c := trace.code_of(n)) >= 0]
    if not codes or not len(k) or not len(api) or "grid_x" not in k:
        return trace
    ext = np.isin(api["name"], codes)
    corr = api["correlation"][ext]
    if not corr.size:
        return trace
    corr = np.sort(corr)
    at = np.minimum(np.searchsorted(corr, k["correlation"]), corr.size - 1)
    hit = (corr[at] == k["correlation"]) & (k["correlation"] >= 0)
    if not hit.any():
        return trace
    cols = {}
    for d in ("x", "y", "z"):
        grid, block = k[f"grid_{d}"].astype(np.int64), k[f"block_{d}"].astype(np.int64)
        fix = hit & (grid > 0) & (block > 0)
        out = grid.copy()
        out[fix] = -(-grid[fix] // block[fix])  # ceiling division
        cols[f"grid_{d}"] = out.astype(k[f"grid_{d}"].dtype)
    return dataclasses.replace(trace, kernels=k.with_columns(**cols))
