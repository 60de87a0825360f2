"""Per-category breakdown and Amdahl ceilings.

Tiny traces have durations chosen so every expected number is a hand calculation; the real
Kineto fixtures are checked against a plain ``json.load(gzip.open(...))`` sum of
``round(dur * 1000)`` over kernel / gpu_memcpy / gpu_memset events.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import H200_LLAMA, KINETO_FIXTURES

from tracestory.analysis.breakdown import amdahl, breakdown
from tracestory.analysis.categories import classify, taxonomy
from tracestory.errors import UsageError
from tracestory.ingest.kineto import load_kineto
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

NVJET = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
XMMA = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
)
DTOD = "Memcpy DtoD (Device -> Device)"
MEMSET = "Memset (Device)"


def _trace(kernels, memops=()):
    """kernels / memops: lists of (name, duration_ns), laid end to end from t=1000."""
    pool = StringPool()
    t, cols = 1000, {}
    for kind, rows in (("kernels", kernels), ("memops", memops)):
        starts, ends = [], []
        for _, d in rows:
            starts.append(t)
            ends.append(t + d)
            t += d + 5
        cols[kind] = make_table(kind, start_ns=starts, end_ns=ends, name=pool.encode([n for n, _ in rows]))
    meta = TraceMeta(source_path="tiny.json", source_format="kineto")
    return build_trace(meta, pool, **cols)


def _tiny():
    # gemm 10 + 30 + 12 = 52, elementwise 20 + 8 = 28, memcpy 15, memset 5: total 100 ns.
    return _trace(
        [(NVJET, 10), (ADD, 20), (NVJET, 30), (XMMA, 12), (ADD, 8)],
        [(DTOD, 15), (MEMSET, 5)],
    )


def test_totals_and_category_order():
    b = breakdown(_tiny())
    assert b.taxonomy == "llm"
    assert b.speedup_factor == 2.0
    assert (b.kernel_count, b.kernel_time_ns) == (5, 80)
    assert (b.memop_count, b.memop_time_ns) == (2, 20)
    assert b.total_time_ns == 100
    assert [(c.name, c.time_ns, c.count) for c in b.categories] == [
        ("gemm", 52, 3),
        ("elementwise", 28, 2),
        ("memcpy", 15, 1),
        ("memset", 5, 1),
    ]
    assert [c.percent for c in b.categories] == pytest.approx([52.0, 28.0, 15.0, 5.0])
    assert b.categories[0].mean_ns == pytest.approx(52 / 3)
    assert b.categories[1].mean_ns == pytest.approx(14.0)


def test_amdahl_by_hand():
    gemm, elementwise = breakdown(_tiny()).categories[:2]
    # p = 0.52: infinitely fast gemm -> 1 / 0.48; twice as fast -> 1 / (0.48 + 0.52 / 2).
    assert gemm.amdahl_max_speedup == pytest.approx(2.0833333, rel=1e-6)
    assert gemm.whatif_speedup == pytest.approx(1 / (0.48 + 0.26))
    assert gemm.whatif_speedup == pytest.approx(1.3513514, rel=1e-6)
    # p = 0.28 with k = 4: 1 / 0.72 and 1 / (0.72 + 0.07).
    e4 = breakdown(_tiny(), k=4).categories[1]
    assert e4.name == "elementwise"
    assert e4.amdahl_max_speedup == pytest.approx(1 / 0.72)
    assert e4.whatif_speedup == pytest.approx(1 / 0.79)
    assert elementwise.whatif_speedup == pytest.approx(1 / (0.72 + 0.14))


def test_amdahl_helper_edges():
    assert amdahl(0.0, 2.0) == (1.0, 1.0)
    max_speedup, whatif = amdahl(1.0, 3.0)
    assert max_speedup is None
    assert whatif == pytest.approx(3.0)


def test_single_category_is_unbounded():
    b = breakdown(_trace([(NVJET, 7), (XMMA, 3)]), k=4)
    (only,) = b.categories
    assert (only.name, only.time_ns, only.percent) == ("gemm", 10, 100.0)
    assert only.amdahl_max_speedup is None
    assert only.whatif_speedup == pytest.approx(4.0)


def test_kernel_stats_per_name():
    b = breakdown(_tiny(), top=1, top_overall=2)
    gemm = b.categories[0]
    assert len(gemm.top_kernels) == 1
    nv = gemm.top_kernels[0]
    assert (nv.name, nv.category, nv.time_ns, nv.count, nv.min_ns, nv.max_ns) == (NVJET, "gemm", 40, 2, 10, 30)
    assert nv.mean_ns == pytest.approx(20.0)
    assert nv.percent == pytest.approx(40.0)
    assert [(k.name, k.time_ns) for k in b.kernels] == [(NVJET, 40), (ADD, 28)]
    full = breakdown(_tiny())
    assert [(k.name, k.time_ns) for k in full.categories[0].top_kernels] == [(NVJET, 40), (XMMA, 12)]
    assert [k.name for k in full.kernels] == [NVJET, ADD, DTOD, XMMA, MEMSET]


def test_moe_taxonomy_counts_memops_as_other():
    tiny = _tiny()
    b = breakdown(tiny, classify(tiny, taxonomy("moe")))
    assert b.taxonomy == "moe"
    assert [(c.name, c.time_ns) for c in b.categories] == [("gate_gemm", 52), ("other", 48)]


def test_empty_trace():
    b = breakdown(_trace([]))
    assert (b.kernel_count, b.memop_count, b.total_time_ns) == (0, 0, 0)
    assert b.categories == () and b.kernels == ()


def test_bad_arguments():
    with pytest.raises(UsageError):
        breakdown(_tiny(), k=0)
    with pytest.raises(UsageError):
        breakdown(_tiny(), top=-1)
    other = _trace([(NVJET, 5)])
    with pytest.raises(UsageError, match="classification"):
        breakdown(_tiny(), classify(other, taxonomy()))


# ------------------------------------------------------------------ real fixtures


def _json_gpu_ops(path):
    doc = json.load(gzip.open(path))
    return [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name)
def test_categories_sum_exactly_to_gpu_op_time(path):
    events = _json_gpu_ops(path)
    expected_total = sum(round(e["dur"] * 1000) for e in events)
    expected_kernels = sum(1 for e in events if e["cat"] == "kernel")
    b = breakdown(load_kineto(path))
    assert b.total_time_ns == expected_total
    assert b.kernel_count == expected_kernels
    assert b.memop_count == len(events) - expected_kernels
    assert sum(c.time_ns for c in b.categories) == b.total_time_ns
    assert sum(c.count for c in b.categories) == len(events)
    assert sum(c.percent for c in b.categories) == pytest.approx(100.0)


def _h200_expected(mapping):
    """Per-category (time_ns, count) from plain json, by name substrings written here."""
    out = {}
    for e in _json_gpu_ops(H200_LLAMA):
        cat = next(c for needle, c in mapping if needle in e["name"])
        t, n = out.get(cat, (0, 0))
        out[cat] = (t + round(e["dur"] * 1000), n + 1)
    return out


def test_h200_llm_breakdown_matches_json():
    # Every kernel of the H200 Llama decode fixture, by what it is.
    expected = _h200_expected([
        ("nvjet_", "gemm"),
        ("splitKreduce_kernel", "gemm"),  # cuBLAS split-K epilogue
        ("_sdpa_", "attention"),  # cuDNN SDPA
        ("lean_reduction_kernel", "attention"),  # cuDNN launches it inside SDPA
        ("reduce_kernel", "reduction"),  # the mean of the eager RMSNorm
        ("elementwise_kernel", "elementwise"),
        ("Memcpy", "memcpy"),
        ("Memset", "memset"),
    ])
    b = breakdown(load_kineto(H200_LLAMA))
    got = {c.name: (c.time_ns, c.count) for c in b.categories}
    assert got == expected
    times = [c.time_ns for c in b.categories]
    assert times == sorted(times, reverse=True)


def test_h200_moe_breakdown_matches_json():
    expected = _h200_expected([
        ("nvjet_", "gate_gemm"),
        ("splitKreduce_kernel", "gate_gemm"),
        ("_sdpa_", "attention_gemm"),
        ("lean_reduction_kernel", "attention_gemm"),  # cuDNN launches it inside SDPA
        ("", "other"),
    ])
    trace = load_kineto(H200_LLAMA)
    b = breakdown(trace, classify(trace, taxonomy("moe")), k=3)
    got = {c.name: (c.time_ns, c.count) for c in b.categories}
    assert got == expected
    gate = next(c for c in b.categories if c.name == "gate_gemm")
    total = sum(t for t, _ in expected.values())
    p = expected["gate_gemm"][0] / total
    assert gate.amdahl_max_speedup == pytest.approx(1 / (1 - p))
    assert gate.whatif_speedup == pytest.approx(1 / ((1 - p) + p / 3))
