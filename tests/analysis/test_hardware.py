"""Hardware interpretations and the rendered section."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import H200_LLAMA, NCU_DETAILS, NCU_RAW, NCU_REP, TEST_DATA

from tracestory.analysis.hardware import analyze_kernel, hardware_analysis, waves
from tracestory.analysis.results import KernelMetricsResults
from tracestory.analysis.ncu_join import join_ncu
from tracestory.analysis.roofline import roofline
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.ncu import KernelRecord, load_ncu
from tracestory.render.hardware import render_hardware_section, render_warp_stalls_ascii
from tracestory.specs import peaks_for

H200 = peaks_for("NVIDIA H200")


def test_rules_fire_on_hand_built_numbers():
    k = KernelRecord(id=0, name="k", theoretical_occupancy_pct=50.0, achieved_occupancy_pct=20.0,
                     occupancy_limit_registers=4.0, occupancy_limit_shared_mem=2.0, occupancy_limit_warps=8.0,
                     occupancy_limit_blocks=32.0, occupancy_limiters=("shared memory",), grid_size=132,
                     sm_count=132, sm_throughput_pct=15.0, memory_throughput_pct=85.0, dram_throughput_pct=82.0,
                     l2_hit_rate_pct=30.0, warp_stall_pct={"long_scoreboard": 60.0, "barrier": 25.0, "wait": 15.0})
    h = analyze_kernel(k)
    text = " ".join(h.occupancy + h.compute + h.memory + h.stalls)
    assert "limited by shared memory" in text and "well below theoretical" in text
    assert waves(k) == pytest.approx(132 / (132 * 2))  # 0.5 wave -> tail effect
    assert "fill 50% of one wave" in text
    assert "memory-bound on DRAM" in text and "little reuse in L2" in text
    assert h.dominant_stall == "long_scoreboard" and "global" in h.stalls[0]
    assert any("barrier 25%" in s and "synchronization" in s for s in h.stalls)
    # 2.5 waves -> last wave half full is not flagged, 2.25 is
    assert not any("last wave" in s for s in analyze_kernel(replace(k, grid_size=660)).occupancy)
    assert any("25% full" in s for s in analyze_kernel(replace(k, grid_size=594)).occupancy)


def test_missing_metrics_produce_no_claims():
    h = analyze_kernel(KernelRecord(id=0, name="k"))
    assert h.occupancy == h.compute == h.memory == h.stalls == ()
    assert h.verdict.startswith("n/a")


def test_gemm_interpretation_from_the_rep():
    km = load_ncu(NCU_REP)
    r = roofline(km, H200)
    hs = hardware_analysis(km, None, r, H200)
    big = next(h for h in hs if h.kernel_id == 0)
    assert "compute-bound" in big.verdict and "bf16 peak" in big.verdict
    assert big.dominant_stall == "gmma"  # 3.30 of 11.47 stall cycles/issue in the report
    assert any("tensor cores well fed" in s for s in big.compute)


def test_warp_stall_chart_width_and_legend():
    km = load_ncu(NCU_RAW)
    for k in km:
        text = render_warp_stalls_ascii(k)
        assert all(len(line) <= 100 for line in text.splitlines())
        assert "legend" in text and "% of stall cycles" in text
    first = render_warp_stalls_ascii(km[0]).splitlines()
    assert first[1].split()[0] == "long_scoreboard" and first[1].endswith("54.6%")
    assert "n/a" in render_warp_stalls_ascii(load_ncu(NCU_DETAILS)[0])


def _hardware(path, trace, km, peaks):
    join, rf = join_ncu(trace, km), roofline(km, peaks)
    return KernelMetricsResults(str(path), km, km.device_name, peaks, None, join, rf,
                                hardware_analysis(km, join, rf, peaks), tuple(waves(k) for k in km.kernels))


@pytest.mark.parametrize("path", [NCU_RAW, NCU_DETAILS, NCU_REP] + sorted((TEST_DATA / "ncu").glob("*.gz")),
                         ids=lambda p: p.name)
def test_section_renders_on_every_fixture(path):
    trace = load_kineto(H200_LLAMA)
    km = load_ncu(path)
    peaks = peaks_for(km.device_name or "NVIDIA H200")
    h = _hardware(path, trace, km, peaks)
    md = render_hardware_section(h)
    assert "**Occupancy**" in md and "**Compute utilization**" in md and "**Memory behavior**" in md
    assert "**Warp stall reasons**" in md and "### Roofline" in md
    assert not md.startswith("## ")
    k = km[0]
    if k.duration_ns is not None and k.flops is None:
        assert "FLOPs: n/a" in md  # absent metrics print n/a, never 0
    chart_lines = md.split("```")[1::2]
    assert all(len(line) <= 100 for block in chart_lines for line in block.splitlines())
    assert md == render_hardware_section(_hardware(path, trace, km, peaks))  # deterministic
