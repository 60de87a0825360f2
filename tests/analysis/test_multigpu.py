"""Multi-rank analysis: rank discovery, per-rank summaries, clock alignment, stragglers and
the report section.

The only public multi-GPU trace at hand is one rank of a 2-rank DDP job (``A100_NCCL``), so the
2- and 4-rank sets are BUILT from it here, in pytest's tmp_path: every rank is a copy of rank 0
(without the ``cpu_op`` events and flow arrows, which these analyses do not read, to keep the
files small), with ``distributedInfo`` and the group arguments rewritten, all timestamps shifted
by a known per-rank clock offset, and on one rank every k-th all-reduce kernel made to start a
known delay later (same end: collectives finish together) while the compute kernel before it
runs that much longer: a staged straggler. The tests assert that alignment recovers the
offsets, that the straggler is the delayed rank and that the waits are the staged ones; per-rank
compute / communication numbers are checked against plain interval unions of the raw events.

The real 2- and 4-GPU H200 captures in ``tests/data/multigpu`` (tensor-parallel Llama layers,
one rank given extra GEMMs, see the README there) are checked the same way: collective counts
and bytes against the raw events, and the report must name the rank that was given more work.
"""

from __future__ import annotations

import copy
import gzip
import json
import pickle

import numpy as np
import pytest
from conftest import A100_NCCL, NSYS_2024, REPO, TEST_DATA

from tracestory.analysis.multigpu import rank_summary
from tracestory.analysis.results import multigpu_of
from tracestory.errors import UsageError
from tracestory.ingest.ranks import load_ranks, rank_from_name, rank_sources
from tracestory.analysis.findings.multigpu import headline, multigpu_findings
from tracestory.render.multigpu import (
    display_window,
    lanes,
    multigpu_json,
    plot_multigpu,
    render_multigpu_section,
    render_timeline,
)

KEEP = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "user_annotation",
        "gpu_user_annotation"}


@pytest.fixture(scope="module")
def base_doc():
    doc = json.load(gzip.open(A100_NCCL, "rt"))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") in KEEP or e.get("ph") == "M"]
    return doc


@pytest.fixture(scope="module")
def small_doc(base_doc):
    """Only the first 200 kernels and the metadata: enough for the rank-discovery tests."""
    doc = dict(base_doc)
    kernels = sorted((e for e in base_doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    doc["traceEvents"] = [e for e in base_doc["traceEvents"] if e.get("ph") == "M"] + kernels[:200]
    return doc


def _is_nccl(e) -> bool:
    return e.get("cat") == "kernel" and "nccl" in e["name"].lower()


def _ns(e) -> tuple[int, int]:
    s = round(e["ts"] * 1000)
    return s, s + round(e["dur"] * 1000)


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(iv) -> int:
    return sum(e - s for s, e in _union(iv))


def _expected_totals(doc) -> dict:
    """compute / communication / overlap / idle from the raw events, by plain interval unions."""
    ev = doc["traceEvents"]
    comm = [_ns(e) for e in ev if _is_nccl(e)]
    comp = [_ns(e) for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and not _is_nccl(e)]
    c, m, a = _length(comp), _length(comm), _length(comp + comm)
    allv = comp + comm
    window = max(e for _, e in allv) - min(s for s, _ in allv)
    return dict(compute=c, comm=m, overlap=c + m - a, idle=window - a, window=window)


def _build(base, out_dir, offsets_us, *, slow=None, delay_us=0, every=1, dist=True, base_shift=False,
           names=None, ranks=None):
    """Rank files built from ``base`` (see the module docstring). Returns (paths, delayed count)."""
    n = len(offsets_us)
    ranks = ranks if ranks is not None else list(range(n))
    paths, delayed = [], 0
    for i, off in enumerate(offsets_us):
        r = ranks[i]
        d = copy.deepcopy(base)
        if dist:
            d["distributedInfo"].update(rank=r, world_size=n)
        else:
            d.pop("distributedInfo")
        ev = d["traceEvents"]
        for e in ev:
            a = e.get("args")
            if isinstance(a, dict) and "Group size" in a:
                a["Group size"], a["Process Group Ranks"] = n, str(list(range(n)))
        if r == slow:
            ar = sorted((e for e in ev if _is_nccl(e) and e["args"]["Collective name"] == "allreduce"),
                        key=lambda e: e["ts"])
            compute = [e for e in ev if e.get("cat") == "kernel" and not _is_nccl(e)]
            for j, e in enumerate(ar):
                if j % every:
                    continue
                before = max((k for k in compute if k["ts"] + k["dur"] <= e["ts"]), key=lambda k: k["ts"] + k["dur"])
                before["dur"] += delay_us
                e["ts"] += delay_us
                e["dur"] -= delay_us
                delayed += 1
        for e in ev:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += off  # integer microseconds: exact on these float timestamps
        if base_shift:
            d["baseTimeNanoseconds"] -= off * 1000
        p = out_dir / (names[i] if names else f"trace_{10 + 7 * r}.json.gz")
        with gzip.open(p, "wt", compresslevel=1) as f:
            json.dump(d, f)
        paths.append(p)
    return paths, delayed


OFFSETS = [0, 1500, -700, 3000]  # us
SLOW, DELAY, EVERY = 2, 200, 3


@pytest.fixture(scope="module")
def four(base_doc, tmp_path_factory):
    folder = tmp_path_factory.mktemp("four")
    paths, delayed = _build(base_doc, folder, OFFSETS, slow=SLOW, delay_us=DELAY, every=EVERY)
    traces = load_ranks([folder])
    summaries = [rank_summary(t) for t in traces]
    return dict(folder=folder, paths=paths, delayed=delayed, traces=traces, summaries=summaries,
                result=multigpu_of(summaries))


# ------------------------------------------------------------------ one real rank


def test_rank_summary_matches_raw_unions(base_doc):
    s = rank_summary(load_ranks([A100_NCCL])[0])
    want = _expected_totals(json.load(gzip.open(A100_NCCL, "rt")))
    assert (s.compute_ns, s.comm_ns, s.overlap_ns, s.idle_ns, s.window_ns) == (
        want["compute"], want["comm"], want["overlap"], want["idle"], want["window"])
    assert s.exposed_comm_ns == want["comm"] - want["overlap"]
    steps = sorted(e["name"] for e in base_doc["traceEvents"]
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    assert list(s.steps.names) == steps
    assert s.steps.numbers.tolist() == [int(x.split("#")[1]) for x in steps]
    assert (s.steps.compute_ns <= s.steps.end_ns - s.steps.start_ns).all()
    assert s.rank == 0 and s.world_size == 2 and len(s.collectives) == 21
    # every collective lies in one of the 3 steps (7 each: 2 broadcasts + 5 all-reduces)
    assert np.bincount(s.collectives.step).tolist() == [7, 7, 7]


def test_single_rank_combine_has_no_straggler():
    r = multigpu_of([rank_summary(load_ranks([A100_NCCL])[0])])
    assert r.ranks == (0,) and r.straggler is None
    assert all(c.skew_ns is None for c in r.collectives)
    assert r.alignment.matched_collectives == 0
    assert [f.rule for f in multigpu_findings(r)] == ["multigpu_communication", "multigpu_bandwidth"]


def test_nsys_process_summary():
    from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

    t = load_nsys_sqlite(NSYS_2024)[0]
    s = rank_summary(t)
    assert len(s.collectives) == 0 and s.comm_ns == 0 and s.clock_domain == f"nsys:{NSYS_2024}"
    k = t.kernels
    assert s.compute_ns > 0 and s.compute_ns <= int((k["end_ns"] - k["start_ns"]).sum() + (t.memops.dur_ns).sum())


# ------------------------------------------------------------------ four built ranks


def test_ranks_from_distributed_info(four):
    # file names say trace_10, trace_17, ...: distributedInfo wins over the name
    assert [t.meta.rank for t in four["traces"]] == [0, 1, 2, 3]
    assert [s.rank_hint for s in rank_sources([four["folder"]])] == [0, 1, 2, 3]


def test_alignment_recovers_offsets(four):
    al = four["result"].alignment
    assert al.method == "collective_ends"  # same baseTimeNanoseconds, shifted clocks: rejected
    assert al.offsets_ns == tuple(-1000 * (o - OFFSETS[0]) for o in OFFSETS)
    assert al.residual_median_ns == 0 and al.residual_max_ns == 0 and al.matched_collectives == 21
    assert al.unaligned_ranks == ()


def test_straggler_is_the_delayed_rank(four):
    r, delayed = four["result"], four["delayed"]
    assert delayed == 5  # 15 all-reduces, every 3rd
    s = r.straggler
    assert s.rank == SLOW and s.last_count == delayed and s.compared == 21
    assert s.late_mean_ns == DELAY * 1000
    assert s.wait_caused_ns == s.total_wait_ns == delayed * DELAY * 1000 * (len(OFFSETS) - 1)
    for b in r.per_rank:
        assert b.wait_ns == (0 if b.rank == SLOW else delayed * DELAY * 1000)
        assert b.last_count == (delayed if b.rank == SLOW else 0)
    delayed_colls = [c for c in r.collectives if c.last_rank is not None]
    assert len(delayed_colls) == delayed and all(c.skew_ns == DELAY * 1000 for c in delayed_colls)
    # every step holds a delayed all-reduce: the slow rank has the most compute and caused the wait
    assert s.steps == s.steps_last == 3
    assert all(st.slowest_rank == SLOW and st.last_rank == SLOW for st in r.steps)
    assert r.imbalance_max > 1.0 and s.compute_excess_mean_ns > 0


def test_per_rank_totals_match_raw_unions(four):
    for p, b in zip(four["paths"], four["result"].per_rank):
        want = _expected_totals(json.load(gzip.open(p, "rt")))
        assert (b.compute_ns, b.comm_ns, b.overlap_ns, b.idle_ns) == (
            want["compute"], want["comm"], want["overlap"], want["idle"])
    comp = {b.rank: b.compute_ns for b in four["result"].per_rank}
    assert comp[SLOW] > comp[0] == comp[1] == comp[3]


def test_summaries_pickle_and_combine_identically(four):
    again = [pickle.loads(pickle.dumps(s)) for s in four["summaries"][::-1]]  # any input order
    assert multigpu_json(multigpu_of(again)) == multigpu_json(four["result"])
    assert all(len(pickle.dumps(s)) < 1 << 20 for s in four["summaries"])


def test_lanes_are_on_the_reference_clock(four):
    r = four["result"]
    ls = lanes(r)
    # same kernels shifted by the staged offsets: the aligned compute intervals coincide
    assert np.array_equal(ls[0].compute[0], ls[1].compute[0]) and np.array_equal(ls[0].compute[0], ls[3].compute[0])
    waits = {l.rank: int((l.wait[1] - l.wait[0]).sum()) for l in ls}
    assert waits == {0: 5 * DELAY * 1000, 1: 5 * DELAY * 1000, 2: 0, 3: 5 * DELAY * 1000}
    t0, t1, what = display_window(r)
    assert what == "step ProfilerStep#6" and t1 > t0


def test_report_section(four, tmp_path):
    r = four["result"]
    chart = render_timeline(r)
    assert all(len(line) <= 100 for line in chart)
    lane_rows = [line for line in chart if line.startswith("GPU ")]
    assert [row.split("│")[0].strip() for row in lane_rows] == ["GPU 0", "GPU 1", "GPU 2 *", "GPU 3"]
    assert any(line.startswith("barrier") and "↑" in line for line in chart)
    assert any("legend:" in line for line in chart)
    text = render_multigpu_section(r)
    assert "GPU 2 arrives last at 5 of 21 collectives, 200 us late on average, every step" in text
    assert "the others wait in all-reduce (3.00 ms in total)" in headline(r)
    assert "| all-reduce |" in text and "GPU 2 (" in text
    f = {x.rule: x for x in multigpu_findings(r)}
    assert f["multigpu_straggler"].title.startswith("GPU 2 is the slowest GPU: last at 5 of 21")
    ev = {e.label: e.value for e in f["multigpu_straggler"].evidence}
    assert ev["wait it caused (sum over the other GPUs)"] == 3 * 5 * DELAY * 1000
    # the staged extra compute (0.2-0.4 ms of ~39 ms per step) is below the 5% imbalance threshold
    assert r.imbalance_max < 1.05 and "multigpu_imbalance" not in f and "multigpu_clocks" in f
    doc = json.loads(json.dumps(multigpu_json(r), allow_nan=False))
    assert doc["straggler"]["rank"] == SLOW and len(doc["collectives"]) == 21
    assert doc["alignment"]["offsets_ns"] == [0, -1500000, 700000, -3000000]
    png = plot_multigpu(r, tmp_path / "mg.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ clocks and rank discovery


def test_base_time_alignment(base_doc, tmp_path):
    # recent Kineto: ts relative to baseTimeNanoseconds; a shift compensated in the base time
    paths, _ = _build(base_doc, tmp_path, [0, 2500], base_shift=True)
    r = multigpu_of([rank_summary(t) for t in load_ranks(paths)])
    assert r.alignment.method == "base_time" and r.alignment.offsets_ns == (0, -2_500_000)
    assert r.alignment.residual_max_ns == 0 and r.straggler is None


def test_raw_timestamps_alignment(base_doc, tmp_path):
    # older Kineto: absolute ts on one host clock, different base times
    paths, _ = _build(base_doc, tmp_path, [0, 0])
    doc = json.load(gzip.open(paths[1], "rt"))
    doc["baseTimeNanoseconds"] += 7_000_000_000
    with gzip.open(paths[1], "wt") as f:
        json.dump(doc, f)
    r = multigpu_of([rank_summary(t) for t in load_ranks(paths)])
    assert r.alignment.method == "raw_timestamps" and r.alignment.offsets_ns == (0, 0)


def test_ranks_from_file_names(small_doc, tmp_path):
    paths, _ = _build(small_doc, tmp_path, [0, 0], dist=False, names=["rank1.json.gz", "rank0.json.gz"],
                      ranks=[1, 0])
    traces = load_ranks([str(tmp_path / "rank*.json.gz")])
    assert [t.meta.rank for t in traces] == [0, 1]
    assert [t.meta.source_path for t in traces] == [str(paths[1]), str(paths[0])]


def test_duplicate_and_unknown_ranks_are_rejected(small_doc, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _build(small_doc, a, [0, 0], ranks=[1, 1], names=["x.json.gz", "y.json.gz"])
    with pytest.raises(UsageError, match=r"rank 1 appears more than once: .*x\.json\.gz, .*y\.json\.gz"):
        load_ranks([a])
    _build(small_doc, b, [0, 0], dist=False, names=["first.json.gz", "second.json.gz"])
    with pytest.raises(UsageError, match="cannot tell the rank of"):
        load_ranks([b])


def test_capture_folder(small_doc, tmp_path):
    from tracestory.capture.manifest import SCHEMA

    (tmp_path / "torch").mkdir()
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": SCHEMA}))
    _build(small_doc, tmp_path / "torch", [0, 0], names=["rank0.trace.json.gz", "rank1.trace.json.gz"])
    traces = load_ranks([tmp_path])
    assert [t.meta.rank for t in traces] == [0, 1]


@pytest.mark.parametrize("name, rank", [
    ("rank3.trace.json.gz", 3), ("worker_rank-12.json", 12), ("trace_5.json.gz", 5),
    ("node1_7.pt.trace.json", 7), ("profile.json", None),
])
def test_rank_from_name(name, rank):
    assert rank_from_name(name) == rank


# ------------------------------------------------------------------ real H200 captures

MULTI = TEST_DATA / "multigpu"
BF16 = 2  # bytes per element of the "BFloat16" dtype these captures all-reduce


def _raw_collectives(path):
    """From the raw events: NCCL kernels, and the record_param_comms ops linked to one of them
    (op External id == its launch call's External id; launch correlation == kernel's)."""
    ev = json.load(gzip.open(path, "rt"))["traceEvents"]
    kernels = [e for e in ev if _is_nccl(e)]
    launch_ext = {e["args"]["correlation"]: e["args"].get("External id") for e in ev
                  if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    linked_ext = {launch_ext.get(k["args"]["correlation"]) for k in kernels} - {None}
    ops = [e for e in ev if e.get("name") == "record_param_comms" and e["args"]["External id"] in linked_ext]
    return kernels, ops


@pytest.mark.parametrize("folder, slow", [("tp2_uneven", 1), ("tp4_uneven", 2)])
def test_real_capture_names_the_slow_rank(folder, slow):
    traces = load_ranks([MULTI / folder])
    summaries = [rank_summary(t) for t in traces]
    for t, s in zip(traces, summaries):
        kernels, ops = _raw_collectives(t.meta.source_path)
        assert len(t.collectives) == len(ops) == 16  # 4 steps x 2 layers x 2 all-reduces
        assert len(s.collectives) == len(kernels)
        linked = s.collectives.bytes >= 0
        assert int(linked.sum()) == len(ops) and (s.collectives.seq[linked] >= 0).all()
        assert int(s.collectives.bytes[linked].sum()) == sum(o["args"]["In msg nelems"] * BF16 for o in ops)
        want = _expected_totals(json.load(gzip.open(t.meta.source_path, "rt")))
        assert (s.compute_ns, s.comm_ns, s.idle_ns) == (want["compute"], want["comm"], want["idle"])
    r = multigpu_of(summaries)
    assert r.ranks == tuple(range(len(traces)))
    assert r.alignment.method == "base_time" and r.alignment.residual_max_ns < 50_000
    assert r.straggler.rank == slow and r.straggler.last_count == r.straggler.compared == 16
    f = {x.rule: x for x in multigpu_findings(r)}
    assert f["multigpu_straggler"].title.startswith(f"GPU {slow} is the slowest GPU")
    assert "more GPU work" in f["multigpu_straggler"].implication
    assert f"most on GPU {slow}" in f["multigpu_imbalance"].title
    assert all(st.slowest_rank == slow for st in r.steps) and len(r.steps) == 4
    g = r.groups[0]
    assert (g.kind, g.bytes, g.count, g.group_size) == ("allreduce", 4096 * 2048 * BF16, 16, len(traces))
    assert f"GPU {slow} *" in render_multigpu_section(r)


def test_real_even_control_has_no_compute_imbalance():
    r = multigpu_of([rank_summary(t) for t in load_ranks([MULTI / "tp2_even"])])
    f = {x.rule: x for x in multigpu_findings(r)}
    assert r.imbalance_max < 1.05 and "multigpu_imbalance" not in f
    # whoever arrives last here is not late for lack of GPU work
    assert "more GPU work" not in f.get("multigpu_straggler", multigpu_findings(r)[0]).implication


AR_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _nsys_proc(rank, kernels, world=2):
    """One process of a hand-built nsys export: kernels (start, end, name), no collective args."""
    from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

    pool = StringPool()
    k = make_table("kernels", start_ns=[a for a, _, _ in kernels], end_ns=[b for _, b, _ in kernels],
                   name=pool.encode([n for _, _, n in kernels]), device=[rank] * len(kernels),
                   stream=[7] * len(kernels))
    meta = TraceMeta(source_path="run.sqlite", source_format="nsys-sqlite", rank=rank, world_size=world)
    return build_trace(meta, pool, kernels=k)


def test_nsys_processes_share_a_clock_and_match_by_order():
    """Two processes of one (hand-built) nsys export: NCCL kernels without args, matched by
    order; the export's single clock is used as is. Process 1 reaches the second all-reduce
    40 us late."""
    ar = AR_F32
    us = 1000
    p0 = _nsys_proc(0, [(0, 100 * us, "gemm"), (100 * us, 200 * us, ar), (200 * us, 300 * us, "gemm"),
                        (300 * us, 400 * us, ar)])
    p1 = _nsys_proc(1, [(0, 100 * us, "gemm"), (100 * us, 200 * us, ar), (200 * us, 340 * us, "gemm"),
                        (340 * us, 400 * us, ar)])
    r = multigpu_of([rank_summary(p1), rank_summary(p0)])
    assert r.alignment.method == "shared_clock" and r.alignment.offsets_ns == (0, 0)
    assert r.alignment.residual_max_ns == 0 and r.alignment.matched_collectives == 2
    first, second = r.collectives
    assert first.last_rank is None and second.last_rank == 1 and second.wait_ns == (40 * us, 0)
    assert second.bytes is None and second.algorithm == "RING" and second.dtype == "f32"
    assert r.straggler.rank == 1 and r.straggler.wait_caused_ns == 40 * us
    assert [b.compute_ns for b in r.per_rank] == [200 * us, 240 * us]
    assert [b.comm_ns for b in r.per_rank] == [200 * us, 160 * us]


def test_no_straggler_within_the_noise():
    """Process 1 reaches the all-reduce 400 ns late: under STRAGGLER_MIN_LATE_NS (10 us), so
    arrival order is noise and no GPU is named."""
    ar = AR_F32
    p0 = _nsys_proc(0, [(0, 1000, "gemm"), (1000, 2000, ar)])
    p1 = _nsys_proc(1, [(0, 1400, "gemm"), (1400, 2000, ar)])
    r = multigpu_of([rank_summary(p0), rank_summary(p1)])
    assert r.collectives[0].last_rank == 1 and r.collectives[0].wait_ns == (400, 0)
    assert r.straggler is None


def test_timeline_draws_at_most_16_lanes_and_keeps_the_slowest():
    n = 20
    late = 20_000  # GPU 18 computes 20 us longer and joins the all-reduce that much later
    procs = [_nsys_proc(r, [(0, 100_000 + (late if r == 18 else 0), "gemm"),
                            (150_000 + (late if r == 18 else 0), 300_000, AR_F32)], world=n) for r in range(n)]
    r = multigpu_of([rank_summary(p) for p in procs])
    assert r.straggler.rank == 18 and r.straggler.wait_caused_ns == (n - 1) * late
    chart = render_timeline(r)
    lanes_drawn = [line.split("│")[0].strip() for line in chart if line.startswith("GPU ")]
    assert lanes_drawn == [f"GPU {i}" for i in range(15)] + ["GPU 18 *"]
    assert "(4 more GPUs not drawn: see the per-GPU table)" in chart
    assert all(len(line) <= 100 for line in chart)


@pytest.mark.parametrize("capture, sweep", [("tp2_uneven", "allreduce_2gpu.json"), ("tp4_uneven", "allreduce_4gpu.json")])
def test_trace_bus_bandwidth_agrees_with_a_direct_measurement(capture, sweep):
    """Second source: the 16 MiB all-reduce's bus bandwidth computed from the TP traces alone
    against the same message size timed directly on the same machine type
    (benchmarks/gpu/allreduce_sweep.py, CUDA events over 20 back-to-back all-reduces)."""
    import json

    from tracestory.ingest.ranks import load_ranks

    r = multigpu_of([rank_summary(t) for t in load_ranks([TEST_DATA / "multigpu" / capture])])
    g = next(g for g in r.groups if g.kind == "allreduce" and g.bytes == 16 << 20)
    rows = json.loads((REPO / "benchmarks" / "results" / "h200" / sweep).read_text())["rows"]
    direct = next(x["busbw_bytes_per_s"] for x in rows if x["bytes"] == 16 << 20)
    assert abs(g.busbw_median_bytes_per_s / direct - 1) < 0.05
