"""Shape-based estimates kept inside physics: byte counts worked out by hand, and an estimate
above its roof dropped instead of reported."""

from __future__ import annotations

import json

import numpy as np

from tracestory.analysis.roofline import _cost, estimate_roofline
from tracestory.specs import Peaks
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table


def test_fp32_to_bf16_copy_moves_six_bytes_per_element():
    # copy_(dst bf16 [1024, 1024], src fp32 [1024, 1024]): 2 bytes written + 4 read per element.
    flops, nbytes, _ = _cost("aten::copy_", json.dumps([[1024, 1024], [1024, 1024]]).encode(),
                             json.dumps(["c10::BFloat16", "float"]).encode(), float("nan"))
    assert (flops, nbytes) == (0.0, 6.0 * 1024 * 1024)


def _mm_trace(kernel_ns):
    """One aten::mm of [4096, 4096] x [4096, 4096] bf16 (2 * 4096^3 = 137.4 GFLOP) whose kernel
    took ``kernel_ns``."""
    pool = StringPool()
    ops = make_table("ops", name=pool.encode(["aten::mm"]), start_ns=[0], end_ns=[10_000_000], external_id=[7],
                     tid=[1], pid=[1], flops=[np.nan],
                     input_dims=np.array([json.dumps([[4096, 4096], [4096, 4096]]).encode()], dtype=object),
                     input_types=np.array([json.dumps(["c10::BFloat16", "c10::BFloat16"]).encode()], dtype=object))
    k = make_table("kernels", name=pool.encode(["nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_NNN"]), start_ns=[100],
                   end_ns=[100 + kernel_ns], external_id=[7], device=[0], stream=[7], correlation=[1])
    return build_trace(TraceMeta(source_path="hand.json", source_format="kineto"), pool, ops=ops, kernels=k)


PEAKS = Peaks(name="test GPU", flops_per_s={"bf16": 1e15}, dram_bytes_per_s=3e12, source="hand")


def test_estimate_above_the_roof_is_dropped_and_named():
    # 137.4 GFLOP in 1 ms is 137 TFLOP/s: 13.7% of a 1 PFLOP/s roof, kept.
    ok = estimate_roofline(_mm_trace(1_000_000), PEAKS)
    assert len(ok.points) == 1 and abs(ok.points[0].pct_of_roof - 2 * 4096 ** 3 / 1e-3 / 1e15 * 100) < 1e-9
    assert ok.dropped == ()
    # The same shapes in 10 us would be 13.7 PFLOP/s, 1374% of the roof: an estimate error.
    bad = estimate_roofline(_mm_trace(10_000), PEAKS)
    assert bad.points == () and len(bad.dropped) == 1 and bad.dropped[0][1] > 1000
    assert "above the roof dropped as estimate errors" in bad.note
