"""Findings rule engine on the real fixtures. Expected numbers come from plain JSON reads of the
Kineto traces, the csv module on the ncu raw export, or hand calculations written here."""

import gzip
import json
from functools import lru_cache

import numpy as np
import pytest
from conftest import A100_NCCL, H100_BERT, H200_LLAMA, KINETO_FIXTURES, NCU_RAW, NCU_REP, TEST_DATA

from tracestory.analysis import analyze
import tracestory
from tracestory.analysis.claims import derive_findings
from tracestory.analysis.facts import facts_for
from tracestory.analysis.findings import SEVERITIES, gap_causes
from tracestory.ingest.kineto import load_kineto


@lru_cache(maxsize=None)
def _analysis(path):
    return analyze(load_kineto(path))


@lru_cache(maxsize=None)
def _events(path):
    return json.load(gzip.open(path))["traceEvents"]


def _gpu_intervals(path):
    out = []
    for e in _events(path):
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            s = round(float(e["ts"]) * 1000)
            out.append((s, s + round(float(e["dur"]) * 1000)))
    return sorted(out)


def _merge(iv):
    merged = []
    for s, e in iv:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _by_rule(path, rule):
    return [f for f in derive_findings(facts_for(_analysis(path))) if f.rule == rule]


def _ev(finding, label):
    return next(e.value for e in finding.evidence if e.label == label)


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name[:20])
def test_severity_order_and_fields(path):
    fs = derive_findings(facts_for(_analysis(path)))
    assert fs, "every fixture has at least the dominant-category finding"
    ranks = [SEVERITIES.index(f.severity) for f in fs]
    assert ranks == sorted(ranks)
    for f in fs:
        assert f.title and f.implication and f.recommendation and f.evidence


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name[:20])
def test_idle_share_matches_a_plain_union(path):
    iv = _gpu_intervals(path)
    merged = _merge(iv)
    window = max(e for _, e in iv) - iv[0][0]
    busy = sum(e - s for s, e in merged)
    (f,) = _by_rule(path, "gpu_idle")
    assert _ev(f, "GPU window") == window
    assert _ev(f, "GPU busy (union)") == busy
    assert _ev(f, "idle share of window") == pytest.approx((window - busy) / window)


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name[:20])
def test_dominant_category_share_and_amdahl(path):
    total = sum(e - s for s, e in _gpu_intervals(path))   # plain sum of GPU op durations
    (f,) = _by_rule(path, "dominant_category")
    share = _ev(f, "share of GPU op time")
    assert share == pytest.approx(_ev(f, "time") / total)
    # One ceiling, on the GPU window (plain JSON: last end - first start), counting only the time no
    # other category runs: W / (W - exposed); the what-if shortens that exposed time 2x.
    iv = _gpu_intervals(path)
    window = max(e for _, e in iv) - iv[0][0]
    exposed = _ev(f, "exposed time (no other category running)")
    assert 0 < exposed <= _ev(f, "time")
    assert _ev(f, "ceiling on the GPU window if it cost nothing (exposed time only)") == pytest.approx(
        window / (window - exposed))
    assert _ev(f, "GPU window if it ran 2x faster (exposed time only)") == pytest.approx(
        window / (window - exposed / 2))
    assert not [e for e in f.evidence if "Amdahl" in e.label]   # one ceiling per category


def test_h200_cpu_stall_is_the_cudnn_plan_build():
    """Every GPU gap >= 1 ms in the H200 decode run sits inside aten::_cudnn_attention_forward
    on the CPU (checked on the raw events: the op's span covers the gap's end)."""
    merged = _merge(_gpu_intervals(H200_LLAMA))
    gaps = [(a[1], b[0]) for a, b in zip(merged, merged[1:]) if b[0] - a[1] >= 1_000_000]
    ops = [(round(float(e["ts"]) * 1000), round(float(e["ts"]) * 1000) + round(float(e["dur"]) * 1000))
           for e in _events(H200_LLAMA)
           if e.get("cat") == "cpu_op" and e["name"] == "aten::_cudnn_attention_forward"]
    inside = [(g0, g1) for g0, g1 in gaps if any(s <= g1 - 50_000 and e >= g1 - 50_000 for s, e in ops)]
    assert len(inside) == len(gaps) == 15
    (f,) = _by_rule(H200_LLAMA, "cpu_stall")
    assert "aten::_cudnn_attention_forward" in f.title
    assert _ev(f, "gaps") == 15
    assert _ev(f, "idle time in them") == sum(g1 - g0 for g0, g1 in gaps)
    assert f.severity == "high"


def test_gap_causes_longest_first():
    causes = gap_causes(_analysis(H200_LLAMA).trace, min_ns=1_000_000, limit=3)
    durs = [c.dur_ns for c in causes]
    merged = _merge(_gpu_intervals(H200_LLAMA))
    plain = sorted((b[0] - a[1] for a, b in zip(merged, merged[1:])), reverse=True)[:3]
    assert durs == plain


def test_step_trend_on_h200_decode():
    (f,) = _by_rule(H200_LLAMA, "step_trend")
    assert _ev(f, "steps") == 16   # decode_0 .. decode_15 user annotations
    assert "no linear trend" in f.title
    # GPU busy share is tiny: step time is host time
    assert _ev(f, "GPU busy share of step time") < 0.05
    assert "host time" in f.implication


def test_communication_on_a100_nccl():
    nccl = [(round(float(e["ts"]) * 1000), round(float(e["dur"]) * 1000)) for e in _events(A100_NCCL)
            if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")]
    total = sum(e - s for s, e in _gpu_intervals(A100_NCCL))
    # communication is the top category here, so the dominant-category finding tells it (one finding per fact)
    assert not _by_rule(A100_NCCL, "communication")
    (f,) = _by_rule(A100_NCCL, "dominant_category")
    assert f.title.startswith("communication kernels hold")
    assert _ev(f, "ops") == len(nccl)
    assert _ev(f, "time") == sum(d for _, d in nccl)
    assert _ev(f, "share of GPU op time") == pytest.approx(sum(d for _, d in nccl) / total)
    assert 0 <= _ev(f, "overlapped with compute") <= 1


def test_eager_fusion_counts_no_triton():
    for path in (H200_LLAMA, H100_BERT):
        names = [e["name"] for e in _events(path) if e.get("cat") == "kernel"]
        assert not any(n.startswith("triton_") for n in names)
        (f,) = _by_rule(path, "eager_fusion")
        assert f.title.startswith("Eager run")
        assert _ev(f, "Triton kernel launches") == 0


def test_memory_peak_from_memory_events():
    peak = max(int(e["args"]["Total Allocated"]) for e in _events(H200_LLAMA)
               if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {}))
    (f,) = _by_rule(H200_LLAMA, "memory")
    assert _ev(f, "peak allocated") == peak


# ------------------------------------------------------------------ steps: first step, ITL vs KV


def _h200_decode_steps():
    """(name, GPU span ns, KV length) per decode_i range, from the raw events: GPU ops whose
    launch call starts inside the range; KV length = the key's sequence dim of the range's
    aten::scaled_dot_product_attention calls (Input Dims[1] is [B, H, S, D])."""
    ev = _events(H200_LLAMA)
    ns = lambda us: round(float(us) * 1000)
    launch = {e["args"]["correlation"]: ns(e["ts"]) for e in ev
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    gpu = [(launch.get(e["args"].get("correlation")), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ev
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    sdpa = [(ns(e["ts"]), e["args"]["Input Dims"][1][2]) for e in ev
            if e.get("cat") == "cpu_op" and e["name"] == "aten::scaled_dot_product_attention"]
    out = []
    for r in sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("decode_")),
                    key=lambda e: e["ts"]):
        a, b = ns(r["ts"]), ns(r["ts"]) + ns(r["dur"])
        mine = [(s, e) for l, s, e in gpu if l is not None and a <= l < b]
        kv = max(k for t, k in sdpa if a <= t < b)
        out.append((r["name"], max(e for _, e in mine) - min(s for s, _ in mine), kv))
    return out


def test_first_decode_step_is_the_surprise_fast_one():
    steps = _h200_decode_steps()
    first, rest = steps[0], [t for _, t, _ in steps[1:]]
    med = float(np.median(rest))
    (f,) = _by_rule(H200_LLAMA, "first_step")
    assert first[0] == "decode_0" and "faster" in f.title
    assert _ev(f, "first step time") == first[1]
    assert _ev(f, "median of the other steps") == med
    assert _ev(f, "median of the rest / first") == pytest.approx(med / first[1])
    assert f"{med / first[1]:.1f}x faster" in f.title
    assert (_ev(f, "first step KV length"), _ev(f, "last step KV length")) == (steps[0][2], steps[-1][2]) == (513, 528)


def test_itl_fit_against_kv_length():
    steps = _h200_decode_steps()
    kv = np.array([k for _, _, k in steps], dtype=float)
    t = np.array([s for _, s, _ in steps], dtype=float)
    slope, intercept = np.polyfit(kv, t, 1)
    r2 = 1 - ((t - (intercept + slope * kv)) ** 2).sum() / ((t - t.mean()) ** 2).sum()
    (f,) = _by_rule(H200_LLAMA, "step_trend")
    assert _ev(f, "step time added per KV token") == pytest.approx(slope)
    assert _ev(f, "r2 of the linear fit") == pytest.approx(r2)
    assert "no linear trend with KV length" in f.title   # r2 ~0.27: the cuDNN plan build dominates
    assert _ev(f, "first step KV length") == 513


def test_gpu_idle_gap_count_and_largest_gap():
    merged = _merge(_gpu_intervals(H200_LLAMA))
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:]) if b[0] > a[1]]
    (f,) = _by_rule(H200_LLAMA, "gpu_idle")
    assert _ev(f, "idle gaps") == len(gaps)
    assert _ev(f, "largest gap") == max(gaps)
    assert _ev(f, "mean gap") == pytest.approx(sum(gaps) / len(gaps))


# ------------------------------------------------------------------ hardware rules


def test_bound_from_the_shape_estimate_names_the_decode_gemv():
    """Without ncu the rule uses the shape estimate; the longest memory-bound kernel is the
    decode GEMV, its time the plain sum of that kernel's durations in the raw events."""
    (f,) = _by_rule(H200_LLAMA, "bound")
    assert "(estimate)" in f.title and _ev(f, "source") == "estimated from op shapes"
    name = _ev(f, "memory-bound #1")
    assert name == "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    total = sum(round(float(e["dur"]) * 1000) for e in _events(H200_LLAMA)
                if e.get("cat") == "kernel" and e["name"] == name)
    assert _ev(f, "memory-bound #1 time") == total
    share = _ev(f, "memory-bound share of placed kernel time")
    assert share + _ev(f, "compute-bound share of placed kernel time") == pytest.approx(1)
    assert share > 0.5 and f.title.startswith("Memory-bound")


def _ncu_raw_rows():
    import csv

    with open(NCU_RAW, newline="") as f:
        rows = list(csv.reader(f))
    h, data = rows[0], rows[2:]   # rows[1] holds the units
    col = lambda name: [r[h.index(name)] for r in data]
    return col("Kernel Name"), [float(x) for x in col("gpu__time_duration.sum")], \
        [float(x) for x in col("sm__warps_active.avg.pct_of_peak_sustained_active")], \
        [float(x) for x in col("sm__maximum_warps_per_active_cycle_pct")], [int(x) for x in col("launch__grid_size")]


def test_ncu_rules_on_the_decode_kernels():
    _, dur_us, achieved, theoretical, grid = _ncu_raw_rows()
    fs = {f.rule: f for f in tracestory.analyze(NCU_RAW).ncu_findings}
    # elementwise / reduce kernels: well under 1 FLOP per byte, far left of the H200 ridge
    b = fs["bound"]
    assert _ev(b, "memory-bound share of placed kernel time") == 1.0
    i = int(np.argmax(dur_us))
    assert _ev(b, "memory-bound #1 time") == round(dur_us[i] * 1000)
    # every kernel: achieved < 80% of theoretical, and grids of 1-8 blocks on 132 SMs (< 1 wave)
    gap = [a < 0.8 * t for a, t in zip(achieved, theoretical)]
    o = fs["occupancy_achieved"]
    assert _ev(o, "kernels with achieved < 80% of theoretical") == sum(gap) == 6
    assert _ev(o, "of them with a grid smaller than one wave") == sum(g < 132 for g in grid)
    assert _ev(o, "its blocks") == grid[i] and _ev(o, "its achieved occupancy") == pytest.approx(achieved[i] / 100)
    # below one wave the grid caps occupancy, not the limiter: no limiter finding
    assert "occupancy_limiter" not in fs


def test_occupancy_limiter_on_the_gemm_rep():
    """nvjet GEMM: 384 threads x 168 registers = 64512 of the SM's 65536 registers -> 1 block;
    221420 B of dynamic shared memory -> 1 block of the 228 KiB; so 12 warps of 64 resident:
    theoretical occupancy 18.75%, limited by registers and shared memory together."""
    fs = {f.rule: f for f in tracestory.analyze(NCU_REP).ncu_findings}
    f = fs["occupancy_limiter"]
    assert f.title == "Occupancy of the longest limited kernel is capped at 18.8% by registers and shared memory"
    assert _ev(f, "theoretical occupancy") == pytest.approx(12 / 64)
    assert _ev(f, "registers per thread") == 168 and _ev(f, "threads per block") == 384
    assert _ev(f, "blocks per SM allowed by the limiter") == 1
    assert f.severity == "low"   # the kernel still runs at ~90% of the bf16 roof
    assert fs["bound"].title.startswith("Compute-bound")


def test_ncu_with_the_trace_weights_by_trace_time():
    fs = {f.rule: f for f in tracestory.analyze([H200_LLAMA, NCU_RAW, NCU_REP]).runs[0].findings}
    b = fs["bound"]
    assert _ev(b, "source") == "Nsight Compute counters"
    assert _ev(b, "time weights") == "trace time of the joined kernel"
    # the GEMM names are identical in ncu and Kineto: the weight is the plain sum in the trace
    name = _ev(b, "compute-bound #1")
    total = sum(round(float(e["dur"]) * 1000) for e in _events(H200_LLAMA)
                if e.get("cat") == "kernel" and e["name"] == name)
    assert name.startswith("nvjet") and _ev(b, "compute-bound #1 time") == total
    # ncu prints the elementwise kernels without namespaces; joined, they weigh their trace time
    # (thousands of launches), far more than one profiled launch of a few microseconds
    assert _ev(b, "memory-bound #1 time") > 100_000
    assert "occupancy_limiter" in fs and "occupancy_achieved" in fs


def test_a_falling_step_time_is_not_blamed_on_the_kv_cache():
    """Rank 1 of the TP=2 serving capture: its GPU-side 'iteration N' ranges, read from the JSON,
    fall from 4.45 ms (the first traced iteration, right after the profiler's start) to about 3.05 ms.
    A growing KV cache cannot make a step faster, so the finding must not say it does."""
    path = TEST_DATA / "tp_serve_gpu" / "torch" / "rank1.trace.json.gz"
    ev = json.load(gzip.open(path))["traceEvents"]
    gpu = sorted((e for e in ev if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("iteration")),
                 key=lambda e: e["ts"])
    durs = [e["dur"] for e in gpu]
    assert len(durs) == 8 and np.polyfit(np.arange(8), durs, 1)[0] < 0 and durs[0] > 1.4 * durs[-1]
    (f,) = _by_rule(path, "step_trend")
    assert "shrinks" in f.title and f.severity == "low"
    assert "KV length" not in f.implication and "cannot explain a falling step time" in f.implication
