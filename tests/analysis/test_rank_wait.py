"""Waiting inside collectives: the part of an NCCL kernel that runs before the last rank
arrives is not GPU work (MultiGpu.rank_wait_ns, RankBalance.spin_ns / spin_exposed_ns,
CollectiveStat.spin_ns) and the multi-GPU findings say so.

Hand-built two-process nsys exports with the waits worked out in the comments, one real rank
alone (nothing is said), and the real 2-GPU H200 capture checked against a plain JSON reading."""

from __future__ import annotations

import gzip
import json

from conftest import A100_NCCL, TEST_DATA

import tracestory
from tracestory.analysis.findings.multigpu import headline, multigpu_findings
from tracestory.analysis.multigpu import combine, rank_summary
from tracestory.ingest.ranks import load_ranks
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
US = 1000


def _proc(rank, kernels):
    """One process of a hand-built nsys export (one clock): kernels (start, end, name)."""
    pool = StringPool()
    k = make_table("kernels", start_ns=[a for a, _, _ in kernels], end_ns=[b for _, b, _ in kernels],
                   name=pool.encode([n for _, _, n in kernels]), device=[rank] * len(kernels),
                   stream=[7] * len(kernels))
    meta = TraceMeta(source_path="run.sqlite", source_format="nsys-sqlite", rank=rank, world_size=2)
    return build_trace(meta, pool, kernels=k)


def _two_ranks():
    # all-reduce 1: rank 0 arrives at 100 us, rank 1 at 300 us (after a longer gemm); both end at 400.
    #   rank 0 spins 200 us; a small gemm [150, 200) us runs beside it on rank 0: 150 us exposed.
    # all-reduce 2: rank 1 arrives at 500 us, rank 0 at 520 us; both end at 600: rank 1 spins 20 us.
    # all-reduce 3: rank 0 arrives at 700 us, rank 1 at 900 us, but rank 0's kernel lasts only
    #   50 us (ends 750): its spin is capped at its duration, 50 us.
    p0 = _proc(0, [(0, 100 * US, "gemm"), (100 * US, 400 * US, AR), (150 * US, 200 * US, "gemm_small"),
                   (400 * US, 520 * US, "gemm"), (520 * US, 600 * US, AR),
                   (600 * US, 700 * US, "gemm"), (700 * US, 750 * US, AR)])
    p1 = _proc(1, [(0, 300 * US, "gemm"), (300 * US, 400 * US, AR),
                   (400 * US, 500 * US, "gemm"), (500 * US, 600 * US, AR),
                   (600 * US, 900 * US, "gemm"), (900 * US, 950 * US, AR)])
    return combine([rank_summary(p0), rank_summary(p1)])


def test_spin_per_collective_and_per_rank():
    r = _two_ranks()
    assert r.alignment.offsets_ns == (0, 0)
    assert [c.spin_ns for c in r.collectives] == [(200 * US, 0), (0, 20 * US), (50 * US, 0)]
    assert [c.wait_ns for c in r.collectives][2] == (200 * US, 0)  # the wait itself is not capped
    assert r.rank_wait_ns == {0: 250 * US, 1: 20 * US}
    b0, b1 = r.per_rank
    assert (b0.spin_ns, b0.spin_exposed_ns) == (250 * US, 200 * US)  # 50 us of gemm_small beside the wait
    assert (b1.spin_ns, b1.spin_exposed_ns) == (20 * US, 20 * US)
    # busy = union of every GPU op: rank 0 [0, 750) us, rank 1 [0, 950) us
    assert (b0.busy_ns, b1.busy_ns) == (750 * US, 950 * US)


def test_findings_subtract_the_wait():
    r = _two_ranks()
    f = {x.rule: x for x in multigpu_findings(r)}
    w = f["multigpu_rank_wait"]
    # rank 0: 200 us exposed wait of 750 us busy = 26.7%; it waited only for GPU 1
    assert w.title == ("GPU 0's NCCL kernels wait 250 us for GPU 1 before any data moves: 26.7% of its GPU busy "
                       "time is waiting, not work")
    assert w.severity == "medium"
    assert "busy 73.3% of its GPU window (not 100.0%)" in w.implication
    c = f["multigpu_communication"]
    # communication: rank 0 [100, 400) + [520, 600) + [700, 750) = 430 us, rank 1 100 + 100 + 50 = 250 us;
    # waiting 250 + 20 = 270 us of 680 us = 39.7%
    ev = {e.label: e.value for e in c.evidence}
    assert ev["waiting for a late GPU inside collectives (all GPUs)"] == 270 * US
    assert abs(ev["waiting share of communication time (all GPUs)"] - 270 / 680) < 1e-12
    assert "39.7% of it is waiting for a late GPU" in c.title
    assert "40% of it waiting for a late GPU" in headline(r)


def test_one_rank_says_nothing_about_waiting():
    r = combine([rank_summary(load_ranks([A100_NCCL])[0])])
    assert r.rank_wait_ns is None and r.per_rank[0].spin_ns is None and r.per_rank[0].spin_exposed_ns is None
    assert all(sum(c.spin_ns) == 0 for c in r.collectives)
    text = " ".join(f"{x.title} {x.implication} {x.recommendation} {[e.label for e in x.evidence]}"
                    for x in multigpu_findings(r)) + (headline(r) or "")
    assert "wait" not in text.lower()


def _linked_nccl(path):
    """NCCL kernels linked to a record_param_comms op (the matched collectives), in start order,
    as (start, end) in ns: from the raw events."""
    with gzip.open(path, "rt") as f:
        ev = json.load(f)["traceEvents"]
    launch_ext = {e["args"]["correlation"]: e["args"].get("External id") for e in ev
                  if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    ops = {e["args"]["External id"] for e in ev if e.get("name") == "record_param_comms"}
    ks = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")
          and launch_ext.get(e["args"]["correlation"]) in ops]
    return sorted((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in ks)


def test_real_tp2_capture_waits_match_the_json():
    # Rank 1 runs extra GEMMs before each all-reduce; rank 0 spins in all 16. Both ranks share
    # one baseTimeNanoseconds (one host), so the JSON times compare directly. Spin per all-reduce
    # = min(max(other's start - own start, 0), own duration); the spins of one rank do not overlap
    # (one all-reduce at a time), so the sum is the union. Tolerance: 1 ns rounding per kernel.
    folder = TEST_DATA / "multigpu" / "tp2_uneven"
    traces = load_ranks([folder])
    r = combine([rank_summary(t) for t in traces])
    k0, k1 = (_linked_nccl(t.meta.source_path) for t in traces)
    assert len(k0) == len(k1) == 16
    want0 = sum(min(max(b[0] - a[0], 0), a[1] - a[0]) for a, b in zip(k0, k1))
    want1 = sum(min(max(a[0] - b[0], 0), b[1] - b[0]) for a, b in zip(k0, k1))
    assert abs(r.rank_wait_ns[0] - want0) <= 2 * 16 and abs(r.rank_wait_ns[1] - want1) <= 2 * 16
    assert want0 > 4_000_000 and want1 == 0  # 4.7 ms on GPU 0, none on GPU 1
    f = {x.rule: x for x in multigpu_findings(r)}
    assert f["multigpu_rank_wait"].title.startswith("GPU 0's NCCL kernels wait 4.71 ms for GPU 1")
    assert "Most of it is waiting, not transfer" in f["multigpu_communication"].recommendation


def test_the_communication_advice_follows_the_program():
    """Gradient bucketing is training advice: the TP=2 serving capture (inference; NCCL all-reduce
    and all-gather kernels, tests/data/tp_serve_gpu/README.md) is told its all-reduces sit between
    dependent layers, the DDP capture (training; EXPECT.toml's reading) keeps the gradient terms,
    and a run of unknown mode gets neither."""
    serving = tracestory.analyze([TEST_DATA / "tp_serve_gpu"])
    rec = next(f.recommendation for f in serving.multigpu_findings if f.rule == "multigpu_communication")
    assert rec.startswith("The collectives sit between dependent layers (tensor parallel)")
    assert "bucketing" not in rec and "gradient" not in rec
    # "the straggler" is named only where a straggler finding names one
    rules = {f.rule for f in serving.multigpu_findings}
    assert ("remove the straggler first" in rec) is ("multigpu_straggler" in rules)
    assert ("no one GPU is the straggler" in rec) is ("multigpu_straggler" not in rules)
    ddp = tracestory.analyze([TEST_DATA / "corpus" / "h100" / "ddp_resnet50_train"])
    rec = next(f.recommendation for f in ddp.multigpu_findings if f.rule == "multigpu_communication")
    assert rec.endswith("overlap, bucketing or less gradient volume shorten only the transfer part.")
    unknown = {f.rule: f for f in multigpu_findings(serving.multigpu)}["multigpu_communication"].recommendation
    assert "bucketing" not in unknown and "tensor parallel" not in unknown
