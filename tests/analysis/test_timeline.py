"""Tests of analyze.timeline: hand-built traces with hand-computed numbers, and the real Kineto
fixtures checked against a plain json computation written here."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import A100_NCCL, H100_BERT, H200_LLAMA, KINETO_FIXTURES
from tracestory.analysis.timeline import Distribution, Gap, StreamStat, timeline
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

META = TraceMeta(source_path="hand.json", source_format="kineto")


def _trace(kernels, memops=(), api=(), meta=META):
    """kernels/memops: (name, device, stream, start, end, corr); api: (corr, start, end) of a
    cudaLaunchKernel, or (corr, start, end, call name)."""
    pool = StringPool()
    tables = {}
    for kind, rows in (("kernels", kernels), ("memops", memops)):
        if rows:
            names, dev, st, s, e, corr = zip(*rows)
            tables[kind] = make_table(kind, name=pool.encode(list(names)), device=dev, stream=st,
                                      start_ns=s, end_ns=e, correlation=corr)
    if api:
        corr, s, e, call = zip(*[a if len(a) == 4 else (*a, "cudaLaunchKernel") for a in api])
        tables["api"] = make_table("api", correlation=corr, start_ns=s, end_ns=e, name=pool.encode(list(call)))
    return build_trace(meta, pool, **tables)


# Two overlapping streams, three gaps of known length and cause:
#   A [100,200) s7   B [150,300) s8        -> busy [100,300)
#   C [1300,1400) s7                         gap1 [300,1300)    1000 ns
#   D [21400,31400) s7, M [21450,21600) s9 (memop, inside D), E [31400,31405) s7 (touches D)
#                                            gap2 [1400,21400) 20000 ns
#   F [31905,32005) s7                       gap3 [31405,31905)   500 ns
KERNELS = [
    ("A", 0, 7, 100, 200, 1),
    ("B", 0, 8, 150, 300, 2),
    ("C", 0, 7, 1300, 1400, 3),
    ("D", 0, 7, 21400, 31400, 4),
    ("E", 0, 7, 31400, 31405, -1),  # no launch call known
    ("F", 0, 7, 31905, 32005, 7),
]
MEMOPS = [("Memset", 0, 9, 21450, 21600, 5)]
API = [
    (1, 0, 50),
    (2, 60, 100),
    (3, 1000, 1100),  # returns 800 ns into gap1 -> 800 ns launch wait
    (4, 100, 130),  # D launched long before gap2 -> 0 ns launch wait
    (5, 21300, 21420, "cudaMemsetAsync"),
    (7, 31000, 32500),  # returns after F started -> the whole gap3 (500 ns) is launch wait
]


@pytest.fixture(scope="module")
def hand():
    return timeline(_trace(KERNELS, MEMOPS, API))


def test_hand_busy_sum_idle(hand):
    assert hand.start_ns == 100
    assert hand.end_ns == 32005
    assert hand.window_ns == 32005 - 100
    # union: [100,300) + [1300,1400) + [21400,31405) + [31905,32005)
    assert hand.busy_ns == 200 + 100 + 10005 + 100
    assert hand.sum_ns == 100 + 150 + 100 + 10000 + 150 + 5 + 100
    assert hand.idle_ns == 1000 + 20000 + 500
    assert hand.idle_fraction == pytest.approx(21500 / 31905)
    assert hand.gap_count == 3


def test_hand_idle_split(hand):
    assert hand.idle_launch_wait_ns == 800 + 0 + 500
    assert hand.idle_other_ns == 21500 - 1300
    # 1300 / 21500 of the idle time is launch wait: not launch-bound
    assert hand.launch_bound is False


def test_hand_gaps_and_histogram(hand):
    assert hand.largest_gaps == (
        Gap(start_ns=1400, dur_ns=20000, before="C", after="D", launch_wait_ns=0),
        Gap(start_ns=300, dur_ns=1000, before="B", after="C", launch_wait_ns=800),
        Gap(start_ns=31405, dur_ns=500, before="E", after="F", launch_wait_ns=500),
    )
    assert hand.gap_histogram == (
        ("<1us", 1, 500),
        ("1-10us", 1, 1000),  # 1000 ns exactly falls in the upper bin
        ("10-100us", 1, 20000),
        ("100us-1ms", 0, 0),
        (">=1ms", 0, 0),
    )


def test_hand_launch_latency(hand):
    # GPU start - launch start, E has no launch: A 100, B 90, C 300, D 21300, M 150, F 905
    lat = sorted([100, 90, 300, 21300, 150, 905])
    assert hand.launch_api.count == hand.launch_queue.count == 6
    assert hand.launch_to_start == Distribution(
        count=6,
        mean_ns=pytest.approx(sum(lat) / 6),
        p50_ns=pytest.approx((lat[2] + lat[3]) / 2),
        p90_ns=pytest.approx(lat[4] + 0.5 * (lat[5] - lat[4])),  # rank 0.9 * 5 = 4.5
        p99_ns=pytest.approx(lat[4] + 0.95 * (lat[5] - lat[4])),  # rank 4.95
        min_ns=90,
        max_ns=21300,
    )


def test_hand_kernel_rates_and_streams(hand):
    assert hand.kernels_per_ms == pytest.approx(6 / (31905 / 1e6))
    assert hand.short_kernel_ns == 10_000
    assert hand.short_kernel_share == pytest.approx(5 / 6)  # D lasts exactly 10 us: not short
    assert hand.streams == (
        StreamStat(device=0, stream=7, busy_ns=100 + 100 + 10005 + 100, op_count=5),
        StreamStat(device=0, stream=8, busy_ns=150, op_count=1),
        StreamStat(device=0, stream=9, busy_ns=150, op_count=1),
    )


def test_same_stream_number_on_two_devices_is_two_streams():
    tl = timeline(_trace([("a", 0, 7, 0, 100, -1), ("b", 1, 7, 50, 250, -1)]))
    assert tl.busy_ns == 250
    assert tl.sum_ns == 300
    assert tl.streams == (StreamStat(0, 7, 100, 1), StreamStat(1, 7, 200, 1))
    assert tl.gap_count == 0 and tl.idle_ns == 0 and tl.largest_gaps == ()
    for d in (tl.launch_to_start, tl.launch_api, tl.launch_queue):
        assert d == Distribution(0, None, None, None, None, None, None)


def test_launch_bound_when_idle_is_launch_wait():
    # gap [120, 920) = 800 ns; K2's launch returns at 900 -> 780 ns launch wait
    tl = timeline(_trace([("k1", 0, 7, 20, 120, 1), ("k2", 0, 7, 920, 1020, 2)],
                         api=[(1, 0, 10), (2, 500, 900)]))
    assert tl.idle_ns == 800 and tl.idle_launch_wait_ns == 780 and tl.idle_other_ns == 20
    assert tl.idle_fraction == pytest.approx(0.8)
    assert tl.launch_bound is True


def test_gap_after_simultaneous_ops_uses_earliest_launch():
    # x and y both start at 1000 after the gap [100, 1000); y's launch returned first (400)
    tl = timeline(_trace([("w", 0, 7, 0, 100, 1), ("x", 0, 7, 1000, 1100, 2), ("y", 0, 8, 1000, 1050, 3)],
                         api=[(1, 0, 5), (2, 0, 900), (3, 0, 400)]))
    assert tl.largest_gaps == (Gap(start_ns=100, dur_ns=900, before="w", after="y", launch_wait_ns=300),)


def test_launch_bound_fallback_without_launch_calls():
    short = timeline(_trace([("k", 0, 7, 0, 1000, -1), ("k", 0, 7, 5000, 6000, -1)]))
    assert short.idle_fraction == pytest.approx(4000 / 6000)
    assert short.idle_launch_wait_ns == 0  # unknown launches are never counted as launch wait
    assert short.launch_bound is True  # all kernels < 10 us and 2/3 idle
    long = timeline(_trace([("k", 0, 7, 0, 20_000, -1), ("k", 0, 7, 30_000, 50_000, -1)]))
    assert long.launch_bound is False


def test_memop_only_trace_has_no_kernel_share():
    tl = timeline(_trace([], [("Memcpy", 0, 7, 0, 100, -1)]))
    assert tl.short_kernel_share is None
    assert tl.kernels_per_ms == 0.0
    assert tl.busy_ns == 100


def test_none_without_gpu_ops_or_timestamps():
    assert timeline(_trace([], api=[(1, 0, 10)])) is None
    meta = TraceMeta(source_path="sum.csv", source_format="nsys-csv", has_timeline=False)
    assert timeline(_trace(KERNELS, meta=meta)) is None


# ----------------------------------------------------------------------------- real fixtures
def _plain(path):
    """GPU op intervals and launch-call end times from a plain json read (ns, as round(us*1000))."""
    events = json.load(gzip.open(path))["traceEvents"]
    ops, launch_end = [], {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            start = round(e["ts"] * 1000)
            ops.append((start, start + round(e["dur"] * 1000), e.get("args", {}).get("correlation", -1)))
        elif cat in ("cuda_runtime", "cuda_driver"):
            start = round(e["ts"] * 1000)
            launch_end[e["args"]["correlation"]] = start + round(e["dur"] * 1000)
    return ops, launch_end


def _plain_gaps(ops, launch_end):
    """Merge intervals in plain Python; per gap (start, end, launch wait)."""
    ops = sorted(ops)
    merged = [[ops[0][0], ops[0][1]]]
    for s, e, _ in ops[1:]:
        if s > merged[-1][1]:
            merged.append([s, e])
        else:
            merged[-1][1] = max(merged[-1][1], e)
    by_start: dict[int, list[int]] = {}
    for s, _, c in ops:
        by_start.setdefault(s, []).append(c)
    gaps = []
    for (_, g0), (g1, _) in zip(merged, merged[1:]):
        ends = [launch_end[c] for c in by_start[g1] if c in launch_end]
        wait = min(max(min(ends) - g0, 0), g1 - g0) if ends else 0
        gaps.append((g0, g1, wait))
    return merged, gaps


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name)
def test_fixture_against_plain_json(path):
    from tracestory.ingest.kineto import load_kineto

    tl = timeline(load_kineto(path))
    ops, launch_end = _plain(path)
    merged, gaps = _plain_gaps(ops, launch_end)
    assert tl.busy_ns == sum(e - s for s, e in merged)
    assert tl.sum_ns == sum(e - s for s, e, _ in ops)
    assert tl.window_ns == max(e for _, e, _ in ops) - min(s for s, _, _ in ops)
    assert tl.idle_ns == sum(g1 - g0 for g0, g1, _ in gaps)
    assert tl.gap_count == len(gaps)
    assert tl.idle_launch_wait_ns == sum(w for _, _, w in gaps)
    assert sum(c for _, c, _ in tl.gap_histogram) == len(gaps)
    longest = sorted(gaps, key=lambda g: (-(g[1] - g[0]), g[0]))[:5]
    assert [(g.start_ns, g.dur_ns, g.launch_wait_ns) for g in tl.largest_gaps] == \
        [(g0, g1 - g0, w) for g0, g1, w in longest]
    assert tl.launch_to_start.count == sum(1 for _, _, c in ops if c in launch_end)


def test_launch_latency_is_one_definition_for_kernels_and_copies():
    """Kernels launched by a kernel-launch call and copies submitted by a copy call count; a kernel
    replayed by cudaGraphLaunch, one whose call is not a launch, and an unlinked one do not. The
    idle finding reports the same p50 as the timeline (the Appendix)."""
    from tracestory.analysis import analyze
    from tracestory.analysis.facts import facts_for
    from tracestory.analysis.findings import rule_gpu_idle

    kernels = [("A", 0, 7, 1_000, 2_000, 1),      # cudaLaunchKernel at 0: 1000 ns
               ("B", 0, 7, 5_000, 6_000, 2),      # cuLaunchKernel at 4_700: 300 ns
               ("G1", 0, 7, 9_000, 9_500, 3),     # replayed by cudaGraphLaunch at 100: left out
               ("G2", 0, 7, 9_500, 9_900, 3),
               ("X", 0, 7, 12_000, 12_100, 4),    # linked to cudaStreamSynchronize: left out
               ("U", 0, 7, 14_000, 14_100, -1)]   # no call: left out
    memops = [("Memcpy HtoD (Pinned -> Device)", 0, 8, 3_000, 3_400, 5)]  # cudaMemcpyAsync at 2_400: 600 ns
    api = [(1, 0, 10, "cudaLaunchKernel"), (2, 4_700, 4_710, "cuLaunchKernel"), (3, 100, 120, "cudaGraphLaunch"),
           (4, 11_000, 11_010, "cudaStreamSynchronize"), (5, 2_400, 2_420, "cudaMemcpyAsync")]
    trace = _trace(kernels, memops, api)
    tl = timeline(trace)
    assert tl.launch_to_start.count == 3
    assert tl.launch_to_start.p50_ns == 600 and tl.launch_to_start.min_ns == 300
    assert tl.launch_to_start.max_ns == 1000
    # split: the call's own time (A 10, B 10, M 20) and GPU start - call end (A 990, B 290, M 580)
    assert (tl.launch_api.p50_ns, tl.launch_api.min_ns, tl.launch_api.max_ns) == (10, 10, 20)
    assert (tl.launch_queue.p50_ns, tl.launch_queue.min_ns, tl.launch_queue.max_ns) == (580, 290, 990)
    findings = rule_gpu_idle(facts_for(analyze(trace)))
    api = [e.value for f in findings for e in f.evidence if e.label.startswith("launch call CPU time p50")]
    assert api and set(api) == {10}


def test_fixture_streams_h100_and_a100():
    from tracestory.ingest.kineto import load_kineto

    for path in (H100_BERT, A100_NCCL):
        events = json.load(gzip.open(path))["traceEvents"]
        per_stream: dict[tuple, int] = {}
        for e in events:
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                key = (e["args"]["device"], e["args"]["stream"])
                per_stream[key] = per_stream.get(key, 0) + 1
        tl = timeline(load_kineto(path))
        assert [(s.device, s.stream, s.op_count) for s in tl.streams] == \
            [(d, s, n) for (d, s), n in sorted(per_stream.items())]


def test_fixture_h200_short_kernels():
    from tracestory.ingest.kineto import load_kineto

    events = json.load(gzip.open(H200_LLAMA))["traceEvents"]
    durs = [round(e["dur"] * 1000) for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    tl = timeline(load_kineto(H200_LLAMA))
    assert tl.short_kernel_share == pytest.approx(sum(d < 10_000 for d in durs) / len(durs))
    assert tl.kernels_per_ms == pytest.approx(len(durs) / (tl.window_ns / 1e6))


def test_launch_latency_on_a_mixed_graph_and_eager_capture_against_plain_json():
    """Plain JSON: 120 kernels replayed by cudaGraphLaunch, 76 launched by cudaLaunchKernel or
    cuLaunchKernelEx, 4 memsets submitted by cudaMemsetAsync; latency = GPU ts - call ts, in ns as
    round(us * 1000); numpy's median over the 80 direct ones. The report's Appendix (timeline) and
    its idle finding read the same number."""
    from pathlib import Path

    import numpy as np

    from tracestory.analysis import analyze
    from tracestory.analysis.facts import facts_for
    from tracestory.analysis.findings import rule_gpu_idle
    from tracestory.ingest.kineto import load_kineto

    path = Path(__file__).parents[1] / "data" / "graphs" / "mixed_graph_eager.trace.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    direct_names = {"cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemsetAsync"}
    lat, replayed = [], 0
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            call = calls.get(e["args"].get("correlation"))
            if call is not None and call["name"] in direct_names:
                lat.append(round(e["ts"] * 1000) - round(call["ts"] * 1000))
            elif call is not None and call["name"] == "cudaGraphLaunch":
                replayed += 1
    assert (len(lat), replayed) == (80, 120)
    trace = load_kineto(path)
    tl = timeline(trace)
    assert tl.launch_to_start.count == tl.launch_api.count == tl.launch_queue.count == 80
    assert tl.launch_to_start.p50_ns == pytest.approx(float(np.median(lat)))
    shown = [e.value for f in rule_gpu_idle(facts_for(analyze(trace))) for e in f.evidence
             if e.label.startswith("launch call CPU time p50")]
    assert shown == [tl.launch_api.p50_ns]


def _queue_below_zero_by_hand(path) -> tuple[int, int]:
    """(ops launched one by one, those whose GPU start precedes their launch call's end), from the
    JSON: GPU ops joined to runtime/driver calls by correlation id, graph launches left out."""
    events = json.load(gzip.open(path))["traceEvents"]
    calls = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    n = below = 0
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            call = calls.get(e["args"].get("correlation"))
            if call is None or "Graph" in call["name"]:
                continue
            n += 1
            below += e["ts"] < call["ts"] + call["dur"]
    return n, below


@pytest.mark.parametrize("name", ["resnet50_graph_capture", "whisper_encoder_infer"])
def test_queue_times_below_zero_are_counted(name):
    from pathlib import Path

    from tracestory.ingest.kineto import load_kineto

    path = Path(__file__).resolve().parents[1] / "data" / "corpus" / "h100" / f"{name}.pt.trace.json.gz"
    n, below = _queue_below_zero_by_hand(path)
    tl = timeline(load_kineto(path))
    assert (tl.launch_queue.count, tl.launch_queue_negative) == (n, below)
    assert below > 0  # (2, 1) and (302, 54) when read by hand
