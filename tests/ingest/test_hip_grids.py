"""Grids of AMD kernels counted in workgroups: hipExtModuleLaunchKernel passes the global work size
in work-items (HIP's API), which Kineto copies as the kernel's grid. Expected values are worked out
from the JSON here: the launching call's name by correlation id, then ceil(grid / block)."""

import gzip
import json
from pathlib import Path

import numpy as np

from tracestory.ingest.kineto import load_kineto

TRACE = (Path(__file__).resolve().parents[1] / "data" / "corpus" / "tracelens_hta"
         / "AMD-AGI_TraceLens__mi300x_xdit_flux1_sage_attention.json.gz")


def test_work_item_grids_become_workgroups_and_block_grids_stay():
    events = json.load(gzip.open(TRACE))["traceEvents"]
    calls = {e["args"]["correlation"]: e["name"] for e in events
             if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    expected = {}
    launched_by = {}
    for e in events:
        if e.get("cat") == "kernel" and "grid" in e["args"]:
            corr = e["args"]["correlation"]
            call = calls.get(corr)
            grid, block = e["args"]["grid"], e["args"]["block"]
            if call == "hipExtModuleLaunchKernel":
                grid = [-(-g // b) for g, b in zip(grid, block, strict=True)]
            expected[corr] = grid
            launched_by[corr] = call
    # the trace mixes the three launch calls: 1123 + 430 + 13 kernels with a grid
    assert sorted(set(launched_by.values())) == ["hipExtModuleLaunchKernel", "hipLaunchKernel", "hipModuleLaunchKernel"]
    k = load_kineto(TRACE).kernels
    got = {int(c): [int(k["grid_x"][i]), int(k["grid_y"][i]), int(k["grid_z"][i])]
           for i, c in enumerate(k["correlation"]) if k["grid_x"][i] >= 0}
    assert got == expected
    # a Tensile GEMM read by hand: grid [61440, 1, 1] of work-items, block [256, 1, 1] -> 240 workgroups
    assert expected[17384] == [240, 1, 1] and launched_by[17384] == "hipExtModuleLaunchKernel"
    assert np.count_nonzero(k["grid_x"] >= 0) == 1123 + 430 + 13
