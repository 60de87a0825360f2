"""Kernels that start before the kernel ahead of them on their stream has ended (analysis.stream_overlap),
on a hand-made trace whose overlaps are worked out below, and the limitation it gives."""

from __future__ import annotations

from tracestory.analysis import analyze
from tracestory.analysis.limitations import limitations
from tracestory.analysis.stream_overlap import stream_overlap, tells
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

META = TraceMeta(source_format="kineto", source_path="pdl.json")

# stream 7: A [1000,2000)  B [1500,1600) inside A: overlap 100 (clipped to B's own length)
#           C [1800,2600): the latest end ahead is A's 2000 (not B's 1600): overlap 200
#           D [2600,2700): starts when C ends: none
# stream 8: E [1000,5000)  F [4000,6000): overlap 1000; G [9000,9100) none
# device 1, stream 7 (another GPU): H [1500,1700) after nothing on its stream: none
KERNELS = [("A", 0, 7, 1000, 2000), ("B", 0, 7, 1500, 1600), ("C", 0, 7, 1800, 2600), ("D", 0, 7, 2600, 2700),
           ("E", 0, 8, 1000, 5000), ("F", 0, 8, 4000, 6000), ("G", 0, 8, 9000, 9100), ("H", 1, 7, 1500, 1700)]
# summed kernel time: 1000 + 100 + 800 + 100 + 4000 + 2000 + 100 + 200 = 8300


def _trace(kernels=KERNELS, meta=META):
    pool = StringPool()
    names, dev, st, s, e = zip(*kernels)
    k = make_table("kernels", name=pool.encode(list(names)), device=dev, stream=st, start_ns=s, end_ns=e,
                   correlation=list(range(len(kernels))))
    return build_trace(meta, pool, kernels=k)


def test_overlap_by_hand():
    o = stream_overlap(_trace())
    assert (o.kernels, o.early, o.overlap_ns, o.kernel_ns) == (8, 3, 1300, 8300)
    assert o.most == (("F", 1000), ("C", 200), ("B", 100))
    assert tells(o)     # 1300 / 8300 = 15.7%


def test_limitation_names_the_overlap_and_the_kernels():
    t = _trace()
    (lim,) = [x for x in limitations([t], [analyze(t)], has_kernel_metrics=True, platforms=["CUDA"])
              if x.analysis == "kernel times"]
    assert lim.reason.startswith("3 of 8 kernels start before the kernel ahead of them on their stream has ended "
                                 "(programmatic dependent launch): 1.30 us (15.7% of the summed kernel time)")
    assert "(most: `F` 1.00 us, `C` 200 ns, `B` 100 ns)" in lim.reason
    # not a CUDA trace: the cause is not named
    (lim,) = [x for x in limitations([t], [analyze(t)], has_kernel_metrics=True, platforms=["ROCm"])
              if x.analysis == "kernel times"]
    assert "programmatic" not in lim.reason


def test_below_one_percent_is_not_told():
    # one 1 ns overlap (clock rounding) among long kernels: 100,000 + 100,001 = 200,001 ns summed
    t = _trace([("A", 0, 7, 0, 100_000), ("B", 0, 7, 99_999, 200_000)])
    o = stream_overlap(t)
    assert (o.early, o.overlap_ns, o.kernel_ns) == (1, 1, 200_001) and not tells(o)
    assert not [x for x in limitations([t], [analyze(t)], has_kernel_metrics=True) if x.analysis == "kernel times"]


def test_the_tp2_capture_states_its_pdl_overlap():
    """tests/data/tp_serve_gpu (the engine launches its Triton kernels with PDL): the overlap read
    from rank 0's JSON in plain Python (per stream in start order, each kernel's part before the
    latest end ahead of it, in ns as the reader rounds microseconds) against the limitation."""
    import gzip
    import json
    from collections import defaultdict

    from conftest import TEST_DATA

    from tracestory.ingest import load_inputs

    path = TEST_DATA / "tp_serve_gpu" / "torch" / "rank0.trace.json.gz"
    ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("cat") == "kernel"]
    streams = defaultdict(list)
    for e in ev:
        s = round(e["ts"] * 1000)
        streams[(e["args"]["device"], e["args"]["stream"])].append((s, s + round(e["dur"] * 1000)))
    early = over = total = 0
    for ks in streams.values():
        latest = None
        for s, e in sorted(ks):
            total += e - s
            if latest is not None and latest > s:
                early += 1
                over += min(latest, e) - s
            latest = e if latest is None else max(latest, e)
    o = stream_overlap(load_inputs([path]).traces[0])
    assert (o.kernels, o.early, o.overlap_ns, o.kernel_ns) == (len(ev), early, over, total)
    assert o.most[0][0] == "_silu_mul_kernel" and tells(o)
