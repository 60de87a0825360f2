"""Tests of analyze.phases: hand-built traces with hand-computed numbers, and the real Kineto
fixtures checked against a plain json computation written here."""

from __future__ import annotations

import dataclasses
import gzip
import json
import statistics

import numpy as np
import pytest

from conftest import A100_NCCL, H100_BERT, H200_LLAMA
from tracestory.analysis.phases import FamilyTrend, Outlier, phases, split_step
from tracestory.trace import CPU_SIDE, GPU_SIDE, StringPool, TraceMeta, build_trace, make_table

KINETO = TraceMeta(source_path="hand.json", source_format="kineto")

# GPU ops: (name, launch start or None, gpu start, gpu end, is_memop)
OPS = [
    ("gemm", 50, 500, 700, False),  # prefill
    ("gemm", 150, 800, 900, False),  # prefill
    ("attn", 1500, 1600, 4600, False),  # decode_0: span 3000
    ("attn", 2500, 4700, 5700, False),  # decode_1
    ("copy", 2600, 5800, 5900, True),  # decode_1: span 4700..5900 = 1200, busy 1100
    ("attn", 3500, 6000, 7000, False),  # decode_2: span 1000
    ("late", 5000, 8000, 8100, False),  # launched after every range: unassigned
    ("lost", None, 8200, 8300, False),  # no launch call: unassigned
]
STEPS = [("prefill", 0, 1000), ("decode_0", 1000, 2000), ("decode_1", 2000, 3000), ("decode_2", 3000, 4000)]


def _trace(ranges, ops=OPS, meta=KINETO):
    """ranges: (name, start, end, side, tid, depth)."""
    pool = StringPool()
    k = [o for o in ops if not o[4]]
    m = [o for o in ops if o[4]]
    corr = iter(range(1, 100))
    tables, api = {}, []
    for kind, rows in (("kernels", k), ("memops", m)):
        if not rows:
            continue
        cs = []
        for name, launch, s, e, _ in rows:
            c = next(corr)
            cs.append(c if launch is not None else -1)
            if launch is not None:
                api.append((c, launch))
        tables[kind] = make_table(kind, name=pool.encode([r[0] for r in rows]), start_ns=[r[2] for r in rows],
                                  end_ns=[r[3] for r in rows], correlation=cs, device=[0] * len(rows),
                                  stream=[7] * len(rows))
    if api:
        tables["api"] = make_table("api", correlation=[a[0] for a in api], start_ns=[a[1] for a in api],
                                   end_ns=[a[1] + 5 for a in api], tid=[1] * len(api), pid=[10] * len(api),
                                   name=pool.encode(["cudaLaunchKernel"] * len(api)))
    if ranges:
        names, s, e, side, tid, depth = zip(*ranges)
        tables["ranges"] = make_table("ranges", name=pool.encode(list(names)), start_ns=s, end_ns=e, side=side,
                                      tid=tid, pid=[10] * len(s), depth=depth)
    return build_trace(meta, pool, **tables)


def _annotated(depth_known=True):
    ranges = [(n, s, e, CPU_SIDE, 1, 0 if depth_known else -1) for n, s, e in STEPS]
    ranges.append(("inner", 100, 200, CPU_SIDE, 1, 1 if depth_known else -1))  # nested in prefill
    ranges.append(("gpu_side", 0, 9000, GPU_SIDE, 7, 0))  # gpu_user_annotation: never a phase
    return _trace(ranges)


@pytest.mark.parametrize("depth_known", [True, False])
def test_user_annotation_phases(depth_known):
    ph = phases(_annotated(depth_known))
    assert ph.source == "user_annotation"
    assert [p.name for p in ph.phases] == ["prefill", "decode_0", "decode_1", "decode_2"]
    assert [p.index for p in ph.phases] == [0, 1, 2, 3]
    assert [(p.family, p.step) for p in ph.phases] == [("prefill", None), ("decode", 0), ("decode", 1), ("decode", 2)]
    assert [(p.start_ns, p.end_ns, p.wall_ns) for p in ph.phases] == [(s, e, e - s) for _, s, e in STEPS]
    assert [p.kernel_count for p in ph.phases] == [2, 1, 1, 1]
    assert [p.memop_count for p in ph.phases] == [0, 0, 1, 0]
    assert [(p.gpu_start_ns, p.gpu_end_ns, p.gpu_span_ns) for p in ph.phases] == [
        (500, 900, 400), (1600, 4600, 3000), (4700, 5900, 1200), (6000, 7000, 1000)]
    assert [p.gpu_busy_ns for p in ph.phases] == [200 + 100, 3000, 1000 + 100, 1000]
    # kernels table is sorted by start: gemm 0, gemm 1, attn 2, attn 3, attn 4, late 5, lost 6
    assert [p.kernel_rows.tolist() for p in ph.phases] == [[0, 1], [2], [3], [4]]
    assert ph.unassigned_kernel_count == 2


def test_family_trend_and_outlier():
    ph = phases(_annotated())
    steps, times = [0, 1, 2], [3000, 1200, 1000]  # gpu spans of decode_0..2
    xm, ym = sum(steps) / 3, sum(times) / 3
    slope = sum((x - xm) * (y - ym) for x, y in zip(steps, times)) / sum((x - xm) ** 2 for x in steps)
    intercept = ym - slope * xm
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(steps, times))
    ss_tot = sum((y - ym) ** 2 for y in times)
    assert slope == pytest.approx(-1000.0)  # hand: sum dx*dy = -2000, sum dx^2 = 2
    assert ph.families == (FamilyTrend(
        family="decode", count=3, mean_ns=pytest.approx(5200 / 3), min_ns=1000, max_ns=3000,
        slope_ns_per_step=pytest.approx(slope), intercept_ns=pytest.approx(intercept),
        r2=pytest.approx(1 - ss_res / ss_tot)),)
    # median 1200; decode_0 at 3000 is 2.5x: the first-iteration outlier
    assert ph.outliers == (Outlier(phase_index=1, name="decode_0", time_ns=3000, family_median_ns=1200.0,
                                   ratio=pytest.approx(2.5)),)


def test_outermost_repeated_level_is_chosen():
    # one wrapping "generate" range at depth 0 says nothing about steps: depth 1 is taken
    ranges = [("generate", 0, 5000, CPU_SIDE, 1, -1)] + [(n, s, e, CPU_SIDE, 1, -1) for n, s, e in STEPS]
    ph = phases(_trace(ranges))
    assert [p.name for p in ph.phases] == ["prefill", "decode_0", "decode_1", "decode_2"]


def test_thread_with_most_enclosed_launches_wins():
    # thread 2 has two ranges that enclose no launch; thread 1's ranges enclose 6 launches
    ranges = [(n, s, e, CPU_SIDE, 1, 0) for n, s, e in STEPS]
    ranges += [("nccl:all_reduce", 4000, 4500, CPU_SIDE, 2, 0), ("nccl:all_reduce", 6000, 6500, CPU_SIDE, 2, 0)]
    ph = phases(_trace(ranges))
    assert [p.name for p in ph.phases] == ["prefill", "decode_0", "decode_1", "decode_2"]


def test_range_of_another_process_takes_no_launch():
    ranges = [(n, s, e, CPU_SIDE, 1, 0) for n, s, e in STEPS]
    tr = _trace(ranges)
    # the launch calls are in pid 10; move the ranges to pid 11
    moved = tr.ranges.with_columns(pid=np.full(len(tr.ranges), 11, dtype=np.int64))
    ph = phases(dataclasses.replace(tr, ranges=moved))
    # The ranges then hold none of the kernels: not the step structure (coverage 0% < 50%), so
    # the whole trace is the one phase and the reason says why.
    assert ph.source == "none" and [p.name for p in ph.phases] == ["whole trace"]
    assert "hold 0% of the kernel time" in ph.reason
    assert ph.phases[0].kernel_count + ph.phases[0].memop_count == 8


def test_profiler_step_preferred():
    ranges = [(n, s, e, CPU_SIDE, 1, 1) for n, s, e in STEPS] + [("ProfilerStep#3", 0, 4000, CPU_SIDE, 1, 0)]
    ph = phases(_trace(ranges))
    assert ph.source == "ProfilerStep"
    assert len(ph.phases) == 1
    p = ph.phases[0]
    assert (p.name, p.family, p.step) == ("ProfilerStep#3", "ProfilerStep", 3)
    assert (p.kernel_count, p.memop_count) == (5, 1)
    assert (p.gpu_start_ns, p.gpu_end_ns) == (500, 7000)
    assert p.gpu_busy_ns == 200 + 100 + 3000 + 1000 + 100 + 1000
    assert ph.unassigned_kernel_count == 2
    assert ph.families == () and ph.outliers == ()


def test_nvtx_source_for_nsys():
    meta = TraceMeta(source_path="x.sqlite", source_format="nsys-sqlite")
    ph = phases(_trace([(n, s, e, CPU_SIDE, 1, 0) for n, s, e in STEPS], meta=meta))
    assert ph.source == "nvtx"
    assert len(ph.phases) == 4


def test_no_ranges_gives_whole_trace():
    ph = phases(_trace([("gpu_side", 0, 9000, GPU_SIDE, 7, 0)]))
    assert ph.source == "none"
    assert len(ph.phases) == 1
    p = ph.phases[0]
    assert p.name == "whole trace" and p.step is None
    # every GPU op, also the one without a launch call
    assert (p.kernel_count, p.memop_count) == (7, 1)
    # earliest event: the gpu_side range at 0; latest: the gpu_side range end 9000
    assert (p.start_ns, p.end_ns) == (0, 9000)
    assert ph.unassigned_kernel_count == 0


def test_empty_trace():
    ph = phases(_trace([], ops=[]))
    assert ph.source == "none" and ph.phases == () and ph.unassigned_kernel_count == 0


@pytest.mark.parametrize("name,family,step", [
    ("decode_3", "decode", 3),
    ("ProfilerStep#6", "ProfilerStep", 6),
    ("decode_15", "decode", 15),
    ("layer10", "layer", 10),
    ("iter 2", "iter", 2),
    ("prefill", "prefill", None),
    ("42", "42", None),
])
def test_split_step(name, family, step):
    assert split_step(name) == (family, step)


# ----------------------------------------------------------------------------- real fixtures
def _plain_phases(path, predicate):
    """Per CPU user_annotation range matching ``predicate`` (time order): kernel count, memop
    count, first GPU start and last GPU end of the ops whose launch call starts inside it."""
    events = json.load(gzip.open(path))["traceEvents"]
    ns = lambda us: round(us * 1000)  # noqa: E731  (the loader's rounding)
    launch = {e["args"]["correlation"]: ns(e["ts"]) for e in events
              if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}
    rngs = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]) for e in events
                  if e.get("ph") == "X" and e.get("cat") == "user_annotation" and predicate(e["name"]))
    out = {name: [0, 0, None, None] for _, _, name in rngs}
    unassigned = 0
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        t = launch.get(e["args"].get("correlation"))
        hit = [name for s, end, name in rngs if t is not None and s <= t < end]
        if not hit:
            unassigned += 1
            continue
        row = out[hit[0]]
        row[0 if e["cat"] == "kernel" else 1] += 1
        start = ns(e["ts"])
        end = start + ns(e["dur"])
        row[2] = start if row[2] is None else min(row[2], start)
        row[3] = end if row[3] is None else max(row[3], end)
    return [(name, *out[name]) for _, _, name in rngs], unassigned


def _load(path):
    from tracestory.ingest.kineto import load_kineto

    return load_kineto(path)


def _summary(ph):
    return [(p.name, p.kernel_count, p.memop_count, p.gpu_start_ns, p.gpu_end_ns) for p in ph.phases]


def test_h200_prefill_and_decode_steps():
    ph = phases(_load(H200_LLAMA))
    expected, unassigned = _plain_phases(H200_LLAMA, lambda n: True)
    assert ph.source == "user_annotation"
    assert [e[0] for e in expected] == ["prefill"] + [f"decode_{i}" for i in range(16)]
    assert _summary(ph) == expected
    assert ph.unassigned_kernel_count == unassigned
    decode = [p for p in ph.phases if p.family == "decode"]
    assert [p.step for p in decode] == list(range(16))
    spans = [p.gpu_end_ns - p.gpu_start_ns for p in decode]
    (trend,) = ph.families
    assert (trend.family, trend.count, trend.min_ns, trend.max_ns) == ("decode", 16, min(spans), max(spans))
    assert trend.mean_ns == pytest.approx(sum(spans) / 16)
    median = statistics.median(spans)
    assert [o.name for o in ph.outliers] == [p.name for p, s in zip(decode, spans) if s >= 1.5 * median]


def test_h200_kernel_rows_match_counts_and_order():
    tr = _load(H200_LLAMA)
    ph = phases(tr)
    for p in ph.phases:
        assert len(p.kernel_rows) == p.kernel_count
        assert np.all(np.diff(tr.kernels["start_ns"][p.kernel_rows]) >= 0)


@pytest.mark.parametrize("path,n_steps", [(H100_BERT, 1), (A100_NCCL, 3)], ids=["h100", "a100"])
def test_profiler_steps(path, n_steps):
    ph = phases(_load(path))
    expected, unassigned = _plain_phases(path, lambda n: n.startswith("ProfilerStep#"))
    assert ph.source == "ProfilerStep"
    assert len(expected) == n_steps
    assert _summary(ph) == expected
    assert ph.unassigned_kernel_count == unassigned
    assert all(p.family == "ProfilerStep" for p in ph.phases)


def test_enclosed_by_launch_inside_any_given_cpu_range():
    """links.enclosed_by on the hand-built OPS (launches at 50, 150, 1500, 2500, 2600 (copy),
    3500, 5000 on thread 1, and one kernel with no launch), read by hand against these ranges."""
    from tracestory.analysis.links import enclosed_by

    ranges = [("A", 0, 100, CPU_SIDE, 1, 0), ("B", 100, 1600, CPU_SIDE, 1, 0),  # touching A
              ("G", 120, 130, CPU_SIDE, 1, 1),  # nested in B
              ("C", 2400, 2450, CPU_SIDE, 1, 0),  # no launch inside
              ("D", 3000, 4000, CPU_SIDE, 2, 0),  # 3500 is inside, but on thread 1
              ("E", 4900, 5100, CPU_SIDE, -1, 0),  # unknown thread: any thread's launch at 5000
              ("F", 0, 9000, GPU_SIDE, 7, 0)]  # GPU side: never encloses
    t = _trace(ranges)
    names = [t.name(int(c)) for c in t.ranges["name"]]
    rows = lambda *which: np.array([names.index(w) for w in which])
    kernels = [t.name(int(c)) for c in t.kernels["name"]]
    assert kernels == ["gemm", "gemm", "attn", "attn", "attn", "late", "lost"]  # by GPU start
    assert enclosed_by(t, t.kernels, rows(*"ABGCDEF")).tolist() == [True, True, True, False, False, True, False]
    assert enclosed_by(t, t.memops, rows(*"ABGCDEF")).tolist() == [False]  # copy launched at 2600
    assert enclosed_by(t, t.kernels, rows("B")).tolist() == [False, True, True, False, False, False, False]
    assert enclosed_by(t, t.kernels, rows("C", "D", "F")).tolist() == [False] * 7
    assert enclosed_by(t, t.kernels, rows()).tolist() == [False] * 7
