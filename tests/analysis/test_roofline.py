"""Roofline placement from ncu counters and the Kineto-only estimate."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest
from conftest import H200_LLAMA, NCU_RAW, NCU_REP, TEST_DATA

from tracestory.analysis.roofline import estimate_roofline, place, roofline
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.ncu import load_ncu
from tracestory.render.hardware import render_roofline_ascii
from tracestory.specs import peaks_for

H200 = peaks_for("NVIDIA H200")


def test_hand_built_points():
    # 1e12 FLOPs, 1e10 bytes in 2 ms: AI 100 < ridge 790/4.27 = 185 -> memory-bound
    p = place("k", 0, "tensor_bf16", 1e12, 1e10, 2_000_000, H200)
    assert p.arithmetic_intensity == 100
    assert p.achieved_flops_per_s == pytest.approx(5e14) and p.achieved_bytes_per_s == pytest.approx(5e12)
    assert p.ridge_flop_per_byte == pytest.approx(790 / 4.27)
    assert p.bound == "memory" and p.pct_of_roof == pytest.approx(100 * 5e12 / 4.27e12)
    q = place("k", 1, "tensor_fp8", 1e12, 1e9, 2_000_000, H200)  # AI 1000 > 1258/4.27 -> compute
    assert q.bound == "compute" and q.roof_dtype == "fp8" and q.pct_of_roof == pytest.approx(100 * 5e14 / 1258e12)
    n = place("k", 2, None, None, 1e9, 1000, H200)
    assert n.bound is None and n.pct_of_roof is None and n.arithmetic_intensity is None
    z = place("k", 3, "fp32", 1e6, 1e6, 1000, None)  # no peaks: rates only
    assert z.bound is None and z.achieved_flops_per_s == pytest.approx(1e12)


def test_ncu_gemms_on_the_roofline():
    km = load_ncu(NCU_REP)
    r = roofline(km, H200)
    for p, k in zip(r.points, km.kernels):
        # independent: bytes = read + write raw metrics, FLOPs = 2 M N K of the Llama projections
        flops = {0: 2 * 512 * 4096 * 12288, 1: 2 * 512 * 4096 * 4096}[k.id]
        b = k.dram_bytes_read + k.dram_bytes_written
        assert p.flops == flops and p.dram_bytes == b
        assert p.arithmetic_intensity == pytest.approx(flops / b)
        assert p.achieved_flops_per_s == pytest.approx(flops / (k.duration_ns * 1e-9))
        assert p.bound == "compute" and p.roof_dtype == "bf16"
        assert p.pct_of_roof == pytest.approx(100 * flops / (k.duration_ns * 1e-9) / 790e12)
    assert not r.estimate


def test_elementwise_kernels_are_memory_bound():
    r = roofline(load_ncu(NCU_RAW), H200)
    placed = [p for p in r.points if p.bound is not None]
    assert placed and all(p.bound == "memory" for p in placed)
    # kernel 4 (rsqrt of one value) counted no FLOPs: memory by definition, never a 0% compute claim
    assert r.points[4].flops == 0 and r.points[4].bound == "memory"


def test_estimate_from_kineto_shapes():
    t = load_kineto(H200_LLAMA)
    r = estimate_roofline(t, H200)
    assert r.estimate and r.points and all(p.estimate for p in r.points)
    # independent: the prefill QKV GEMM (aten::mm [512,4096]x[4096,12288], bf16) launches
    # nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT; sum its kernel durations from the JSON
    with gzip.open(H200_LLAMA) as f:
        doc = json.load(f)
    dur = defaultdict(float)
    n = defaultdict(int)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            dur[e["name"]] += e["dur"]
            n[e["name"]] += 1
    name = "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT"
    p = next(p for p in r.points if p.label == name)
    assert p.count == n[name]
    flops = n[name] * 2 * 512 * 4096 * 12288
    byts = n[name] * 2 * (512 * 4096 + 4096 * 12288 + 512 * 12288)
    assert p.flops == pytest.approx(flops) and p.dram_bytes == pytest.approx(byts)
    assert p.duration_ns == pytest.approx(dur[name] * 1000, abs=n[name])
    assert p.bound == "compute"


def test_ascii_roofline_fits_100_columns_and_has_legend():
    km = load_ncu(TEST_DATA / "ncu" / "sdpa_flash.ncu-rep.gz")
    text = render_roofline_ascii(roofline(km, H200), H200)
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "legend" in text and "ridge point at AI 185" in text and "A pytorch_flash" not in text
    assert " A " in text.split("legend")[1]
    est = render_roofline_ascii(estimate_roofline(load_kineto(H200_LLAMA), H200), H200)
    assert "ESTIMATE" in est and all(len(line) <= 100 for line in est.splitlines())
    assert "n/a" in render_roofline_ascii(roofline(km, None), None)
