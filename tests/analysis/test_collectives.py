"""NCCL collectives: the Kineto collectives table, kernel-name parsing, NCCL's bandwidth
formulas, matching across ranks and per-collective statistics.

Expected values come from the raw events (plain gzip + json), from NCCL's documented formulas
written out by hand, or from hand-built traces whose numbers are chosen in the test."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from conftest import A100_NCCL

from tracestory.analysis.collectives import (
    busbw_factor,
    canonical_kind,
    collective_stats,
    group_collectives,
    match_collectives,
    parse_nccl_kernel,
    rank_collectives,
)
from tracestory.ingest.kineto import load_kineto
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

# PyTorch dtype name -> bytes, written here for the test (independent of the module's table)
ELEM = {"Float": 4, "Long": 8}


@pytest.fixture(scope="module")
def raw_nccl():
    doc = json.load(gzip.open(A100_NCCL, "rt"))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    return sorted(kernels, key=lambda e: e["ts"])


@pytest.fixture(scope="module")
def a100():
    return load_kineto(A100_NCCL)


def test_kineto_collectives_table_matches_raw_events(a100, raw_nccl):
    c = a100.collectives
    assert len(c) == len(raw_nccl) == 21
    names = Counter(a100.names(c["name"]).tolist())
    assert names == Counter(e["args"]["Collective name"] for e in raw_nccl)
    assert int(c["in_nelems"].sum()) == sum(e["args"]["In msg nelems"] for e in raw_nccl)
    assert int(c["out_nelems"].sum()) == sum(e["args"]["Out msg nelems"] for e in raw_nccl)
    assert set(a100.names(c["pg_ranks"]).tolist()) == {"[0, 1]"}
    assert set(a100.names(c["pg_name"]).tolist()) == {"0"}
    assert set(c["group_size"].tolist()) == {2}
    assert (c["seq"] == -1).all()  # this trace predates the "Seq" arg
    # kernel_index points at the same kernel after build_trace sorted the kernels
    k = a100.kernels
    assert (k["start_ns"][c["kernel_index"]] == c["start_ns"]).all()
    assert all("nccl" in n for n in a100.names(k["name"][c["kernel_index"]]))
    starts = sorted(round(e["ts"] * 1000) for e in raw_nccl)
    assert sorted(c["start_ns"].tolist()) == starts


def test_rank_collectives_counts_and_bytes(a100, raw_nccl):
    rc = rank_collectives(a100)
    assert len(rc) == 21
    assert Counter(rc.kind.tolist()) == Counter({"allreduce": 15, "broadcast": 6})
    want = sorted(max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * ELEM[e["args"]["dtype"]]
                  for e in raw_nccl)
    assert sorted(rc.bytes.tolist()) == want
    by_kind = Counter()
    for e in raw_nccl:
        by_kind[e["args"]["Collective name"]] += e["args"]["In msg nelems"] * ELEM[e["args"]["dtype"]]
    for kind, total in by_kind.items():
        assert int(rc.bytes[rc.kind == kind].sum()) == total
    assert set(rc.algorithm.tolist()) == {"RING"} and set(rc.protocol.tolist()) == {"LL"}
    # no Seq recorded: the sequence is the order of occurrence in the process group
    assert rc.seq.tolist() == list(range(21)) and not rc.seq_from_arg.any()


@pytest.mark.parametrize("name, want", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     ("allreduce", "RING", "LL", "float", "sum")),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     ("broadcast", "RING", "LL", "int8_t", "sum")),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     ("allreduce", "RING", "LL", "bf16", "sum")),
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_LL(ncclDevComm *, unsigned long, ncclWork *)",
     ("allreduce", "TREE", "LL", "f32", "sum")),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_NVLS_TREE_SIMPLE(ncclDevKernelArgsStorage<4096ul>)",
     ("reduce_scatter", "NVLS_TREE", "SIMPLE", "bf16", "sum")),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ("allgather", "RING", "LL", None, None)),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", ("sendrecv", None, None, None, None)),
    ("ncclSymDevKernel_AllReduce_RSxLD_AGxST_sum_bf16", ("allreduce", None, None, "bf16", "sum")),
])
def test_parse_nccl_kernel(name, want):
    p = parse_nccl_kernel(name)
    assert (p.kind, p.algorithm, p.protocol, p.dtype, p.redop) == want


def test_parse_non_nccl_kernel():
    assert parse_nccl_kernel("void at::native::vectorized_elementwise_kernel<4>") is None
    assert parse_nccl_kernel("cross_device_reduce_1stage") is None


@pytest.mark.parametrize("name, kind", [
    ("allreduce", "allreduce"), ("allreduce_coalesced", "allreduce"), ("_allgather_base", "allgather"),
    ("allgather_into_tensor_coalesced", "allgather"), ("_reduce_scatter_base", "reduce_scatter"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter"), ("alltoall_base", "alltoall"),
    ("broadcast", "broadcast"), ("reduce", "reduce"), ("send", "send"), ("recv", "recv"),
    ("barrier", "barrier"), ("ReduceScatter", "reduce_scatter"), ("AllToAllPivot", "alltoall"),
])
def test_canonical_kind(name, kind):
    assert canonical_kind(name) == kind


def test_busbw_factors_from_nccl_doc():
    # NCCL tests PERFORMANCE.md: allreduce 2(n-1)/n, allgather/reducescatter/alltoall (n-1)/n, bcast/reduce 1
    assert busbw_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("allgather", 4) == pytest.approx(3 / 4)
    assert busbw_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert busbw_factor("alltoall", 4) == pytest.approx(3 / 4)
    assert busbw_factor("broadcast", 8) == 1.0 and busbw_factor("reduce", 8) == 1.0
    assert busbw_factor("barrier", 8) is None and busbw_factor("allreduce", None) is None


# ------------------------------------------------------------------ hand-built traces


def _trace(kernels: list[tuple[int, int, str]], colls: list[dict] | None = None, rank: int = 0):
    """A Trace with kernels (start, end, name) in the given (unsorted) order and collectives rows
    whose ``kernel_index`` refers to that order."""
    pool = StringPool()
    k = make_table("kernels", start_ns=[s for s, _, _ in kernels], end_ns=[e for _, e, _ in kernels],
                   name=pool.encode([n for _, _, n in kernels]), device=[0] * len(kernels),
                   stream=[7] * len(kernels))
    tables = {"kernels": k}
    if colls:
        cols = {key: [c[key] for c in colls] for key in colls[0]}
        for key in ("name", "dtype", "pg_name", "pg_ranks"):
            if key in cols:
                cols[key] = pool.encode(cols[key])
        cols["start_ns"] = [kernels[i][0] for i in cols["kernel_index"]]
        cols["end_ns"] = [kernels[i][1] for i in cols["kernel_index"]]
        tables["collectives"] = make_table("collectives", **cols)
    meta = TraceMeta(source_path=f"rank{rank}.json", source_format="kineto", rank=rank)
    return build_trace(meta, pool, **tables)


AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _coll(i, name, seq, nel_in, nel_out, dtype="BFloat16", pg="0", size=2):
    return dict(kernel_index=i, name=name, seq=seq, in_nelems=nel_in, out_nelems=nel_out, dtype=dtype,
                pg_name=pg, pg_ranks="[0, 1]", group_size=size)


def test_build_trace_renumbers_kernel_index():
    # kernels passed out of time order: the collective refers to row 0 (start 500) before sorting
    t = _trace([(500, 900, AR), (100, 200, "gemm"), (300, 400, "gemm")],
               [_coll(0, "allreduce", 3, 1024, 1024)])
    ki = int(t.collectives["kernel_index"][0])
    assert ki == 2 and t.kernels["start_ns"][ki] == 500


def test_name_only_collectives_have_unknown_sizes():
    t = _trace([(100, 200, AR), (300, 450, AG), (500, 600, "gemm")])
    rc = rank_collectives(t)
    assert rc.kind.tolist() == ["allreduce", "allgather"]
    assert rc.bytes.tolist() == [-1, -1] and rc.pg.tolist() == ["", ""]
    assert rc.dtype.tolist() == ["bf16", ""]
    stats = collective_stats([rc], match_collectives([rc], [0]), [0])
    assert [s.bytes for s in stats] == [None, None]
    assert [s.busbw_bytes_per_s for s in stats] == [None, None]
    assert [s.skew_ns for s in stats] == [None, None] and stats[0].transfer_ns == 100


def test_matching_by_seq_and_stats():
    # rank 0 recorded seq 5 then 6; rank 1's trace has them in the same order but also an
    # all-gather only it recorded (seq 7). Rank 1 arrives 300 ns late at seq 5; both end at 1000.
    r0 = _trace([(100, 1000, AR), (2000, 2500, AR)],
                [_coll(0, "allreduce", 5, 4096, 4096), _coll(1, "allreduce", 6, 4096, 4096)], rank=0)
    r1 = _trace([(400, 1000, AR), (2000, 2400, AR), (3000, 3100, AG)],
                [_coll(0, "allreduce", 5, 4096, 4096), _coll(1, "allreduce", 6, 4096, 4096),
                 _coll(2, "_allgather_base", 7, 1024, 2048)], rank=1)
    per = [rank_collectives(r0), rank_collectives(r1)]
    assert per[0].seq_from_arg.all() and per[0].seq.tolist() == [5, 6]
    m = match_collectives(per, [0, 1])
    assert m.keys == (("0", False, 5), ("0", False, 6), ("0", False, 7))
    assert m.rows.tolist() == [[0, 0], [1, 1], [-1, 2]]
    stats = collective_stats(per, m, [0, 0])
    s5, s6, s7 = stats
    assert s5.skew_ns == 300 and s5.last_rank == 1 and s5.wait_ns == (300, 0)
    assert s5.duration_ns == (900, 600) and s5.transfer_ns == 600 and s5.end_spread_ns == 0
    nbytes = 4096 * 2  # bf16
    assert s5.bytes == nbytes
    assert s5.algbw_bytes_per_s == pytest.approx(nbytes / 600e-9)
    assert s5.busbw_bytes_per_s == pytest.approx(nbytes / 600e-9 * 2 * (2 - 1) / 2)
    # all arrived together: nobody is last
    assert s6.skew_ns == 0 and s6.last_rank is None and s6.end_spread_ns == 100
    # one rank only; allgather size is the output (2048 x 2 bytes)
    assert s7.ranks == (1,) and s7.skew_ns is None and s7.bytes == 2048 * 2
    assert s7.busbw_bytes_per_s == pytest.approx(4096 / 100e-9 * 1 / 2)
    # offsets move the arrival: rank 1 shifted by -300 ns arrives with rank 0 at seq 5
    shifted = collective_stats(per, m, [0, -300])
    assert shifted[0].skew_ns == 0 and shifted[0].end_spread_ns == 300
    groups = group_collectives(stats)
    ar = next(g for g in groups if g.kind == "allreduce")
    assert ar.count == 2 and ar.last_rank == 1 and ar.last_rank_count == 1 and ar.total_wait_ns == 300
    assert ar.duration_min_ns == 400 and ar.duration_max_ns == 900


def test_matching_without_seq_uses_order_per_group():
    # no Seq: two process groups; each rank's collectives matched by order within the group
    r0 = _trace([(100, 200, AR), (300, 400, AR), (500, 600, AR)],
                [_coll(0, "allreduce", -1, 8, 8, pg="tp"), _coll(1, "allreduce", -1, 8, 8, pg="dp"),
                 _coll(2, "allreduce", -1, 8, 8, pg="tp")])
    r1 = _trace([(150, 200, AR), (350, 400, AR)],
                [_coll(0, "allreduce", -1, 8, 8, pg="tp"), _coll(1, "allreduce", -1, 8, 8, pg="tp")], rank=1)
    per = [rank_collectives(r0), rank_collectives(r1)]
    assert per[0].seq.tolist() == [0, 0, 1] and per[1].seq.tolist() == [0, 1]
    m = match_collectives(per, [0, 1])
    rows = {k: tuple(v) for k, v in zip(m.keys, m.rows.tolist())}
    assert rows == {("dp", False, 0): (1, -1), ("tp", False, 0): (0, 0), ("tp", False, 1): (2, 1)}


def test_kineto_seq_and_list_ranks(tmp_path):
    """A torch 2.11-style kernel with "Seq" and "Process Group Ranks" as a JSON list (written
    here by hand), next to its record_param_comms CPU op, which is not a collectives row."""
    args = {"Collective name": "_allgather_base", "In msg nelems": 1024, "Out msg nelems": 4096, "Group size": 4,
            "dtype": "BFloat16", "Process Group Name": "1", "Process Group Ranks": [0, 1, 2, 3], "Seq": 12}
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": "3", "world_size": 4},
           "baseTimeNanoseconds": 1700000000000000000, "traceEvents": [
               {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1.0,
                "dur": 2.0, "args": dict(args, **{"External id": 5})},
               {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 5.0, "dur": 1.0,
                "args": {"device": 0, "stream": 7, "correlation": 1}},
               {"ph": "X", "cat": "kernel", "name": AG, "pid": 0, "tid": 9, "ts": 3.0, "dur": 1.5,
                "args": dict(args, device=0, stream=9, correlation=2)}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    t = load_kineto(p)
    assert t.meta.rank == 3 and t.meta.world_size == 4  # a string rank is read as a number
    c = t.collectives
    assert len(c) == 1
    assert c["seq"].tolist() == [12] and t.name(int(c["pg_ranks"][0])) == "[0, 1, 2, 3]"
    assert t.name(int(c["dtype"][0])) == "BFloat16" and c["group_size"].tolist() == [4]
    assert (c["start_ns"][0], c["end_ns"][0]) == (3000, 4500)
    assert t.name(int(t.kernels["name"][c["kernel_index"][0]])) == AG
    rc = rank_collectives(t)
    assert rc.seq_from_arg.tolist() == [True] and rc.kind.tolist() == ["allgather"]
    assert rc.bytes.tolist() == [4096 * 2]


def test_kineto_args_on_record_param_comms(tmp_path):
    """torch 2.11 style (as in tests/data/multigpu): the args sit on the record_param_comms CPU
    op only; its launch call carries the op's External id and the kernel's correlation. A second
    NCCL kernel whose launch is not in the trace keeps no args and is left out of matching."""
    args = {"Collective name": "allreduce", "In msg nelems": 2048, "Out msg nelems": 2048, "Group size": 2,
            "dtype": "BFloat16", "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "External id": 5}
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0,
         "args": args},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "pid": 1, "tid": 1, "ts": 11.0, "dur": 2.0,
         "args": {"correlation": 2, "External id": 5}},
        {"ph": "X", "cat": "kernel", "name": AR, "pid": 0, "tid": 7, "ts": 20.0, "dur": 3.0,
         "args": {"device": 0, "stream": 7, "correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": AR, "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 15.0, "dur": 1.0,
         "args": {"device": 0, "stream": 7, "correlation": 3}},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    t = load_kineto(p)
    c = t.collectives
    assert len(c) == 1 and (c["start_ns"][0], c["end_ns"][0]) == (20000, 23000)
    assert t.kernels["correlation"][c["kernel_index"][0]] == 2
    assert t.name(int(c["name"][0])) == "allreduce" and c["in_nelems"].tolist() == [2048]
    rc = rank_collectives(t)
    assert rc.start_ns.tolist() == [1000, 20000]
    assert rc.seq.tolist() == [-1, 0] and rc.bytes.tolist() == [-1, 2048 * 2]
    m = match_collectives([rc], [0])
    assert m.rows.tolist() == [[1]]
