"""The columns the issue asked of the existing tables: the CPU op under each gap (``gaps``), the
per-op roofline table, the bandwidth of ``collectives``.

Second sources: hand-built traces whose answers are written down from the construction, and the
report's own gap causes (``RunFacts.gaps``, what the Observations print) for the real trace.
"""

from __future__ import annotations

import pytest

from tracestory.analysis import analyze
from tracestory.analysis.tables import table
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table


def _gap_trace():
    """One host thread. Kernel A [0, 50) launched by call 1; kernel B [1200, 1300) launched by
    call 2 [1050, 1100). CPU: 'step' [0, 2000) holds everything (a container), 'slow_op'
    [100, 1000) runs during the gap, 'launcher' [1040, 1150) holds call 2.
    The gap is [50, 1200); the host's part of it ends when call 2 returns: [50, 1100), 1050 ns,
    of which slow_op covers 900 (>= half): the CPU op under the gap is slow_op. 'within' is the
    innermost range around call 2 lasting at least half the gap (575 ns): launcher lasts 110,
    so it is 'step' (2000)."""
    pool = StringPool()
    code = pool.code
    kernels = make_table("kernels", start_ns=[0, 1200], end_ns=[50, 1300], name=[code("A"), code("B")],
                         correlation=[1, 2], device=[0, 0], stream=[7, 7])
    api = make_table("api", start_ns=[0, 1050], end_ns=[10, 1100], name=[code("cudaLaunchKernel")] * 2,
                     correlation=[1, 2], pid=[1, 1], tid=[1, 1], kind=[0, 0])
    ops = make_table("ops", start_ns=[0, 100, 1040], end_ns=[2000, 1000, 1150],
                     name=[code("step"), code("slow_op"), code("launcher")], pid=[1, 1, 1], tid=[1, 1, 1])
    return build_trace(TraceMeta(source_path="built", source_format="kineto"), pool, kernels=kernels, api=api,
                       ops=ops)


def test_gaps_table_names_the_cpu_op_under_the_gap():
    t = table("gaps", analyze(_gap_trace()))
    assert t.rows() == [(50, 1150, 1050, 100, "A", "B", "slow_op", 900, "step")]


def test_gaps_table_has_no_cpu_op_when_the_launch_came_before_the_gap():
    """Kernel B launched at [5, 10), before the gap [50, 1200) began: the GPU waited on something
    else, no CPU op is the cause (None, never a made-up name)."""
    pool = StringPool()
    code = pool.code
    kernels = make_table("kernels", start_ns=[0, 1200], end_ns=[50, 1300], name=[code("A"), code("B")],
                         correlation=[1, 2], device=[0, 0], stream=[7, 8])
    api = make_table("api", start_ns=[0, 5], end_ns=[4, 10], name=[code("cudaLaunchKernel")] * 2,
                     correlation=[1, 2], pid=[1, 1], tid=[1, 1], kind=[0, 0])
    ops = make_table("ops", start_ns=[100], end_ns=[1000], name=[code("slow_op")], pid=[1], tid=[1])
    trace = build_trace(TraceMeta(source_path="built", source_format="kineto"), pool, kernels=kernels, api=api,
                        ops=ops)
    t = table("gaps", analyze(trace))
    assert t.rows() == [(50, 1150, 0, 1150, "A", "B", None, None, None)]


def test_gaps_table_agrees_with_the_reports_gap_causes():
    from conftest import H200_LLAMA

    from tracestory.analysis.results import analyze_inputs
    from tracestory.ingest import load_inputs

    results = analyze_inputs(load_inputs([H200_LLAMA]))
    run = results.runs[0]
    t = results.table("gaps")
    by_start = {r[0]: r for r in t.rows()}
    causes = run.gap_causes
    assert len(causes) >= 15
    for c in causes:
        row = by_start[c.start_ns]
        assert (row[1], row[2], row[6], row[7], row[8]) == (c.dur_ns, c.launch_wait_ns, c.op_name, c.op_dur_ns,
                                                            c.within)
    # the 15 longest gaps of this trace are cuDNN plan building (the report's finding)
    longest = sorted(t.rows(), key=lambda r: -r[1])[:15]
    assert {r[6] for r in longest} == {"aten::_cudnn_attention_forward"}


@pytest.mark.parametrize("name", ["gaps"])
def test_new_columns_are_typed(name):
    from tracestory.analysis.tables import column_kind

    assert column_kind("cpu_op") == "str" and column_kind("within") == "str" and column_kind("cpu_op_dur_ns") == "int"


def test_collectives_bandwidth_from_the_json_args():
    """algbw = max(in, out) elements x 4 bytes (Float) / the median duration of the group's
    kernels, read from the JSON; busbw = algbw x 2(n-1)/n for all-reduce, x 1 for broadcast
    (n = 2 here, so both factors are 1)."""
    import gzip
    import json
    import statistics

    from conftest import A100_NCCL

    from tracestory.ingest.kineto import load_kineto

    with gzip.open(A100_NCCL, "rt") as f:
        events = json.load(f)["traceEvents"]
    groups: dict[tuple, list[int]] = {}
    for e in events:
        a = e.get("args", {})
        if e.get("cat") == "kernel" and "Collective name" in a:
            size = {"Float": 4, "Long": 8}[a["dtype"]] * max(a["In msg nelems"], a["Out msg nelems"])
            groups.setdefault((a["Collective name"], size, a["Group size"]), []).append(round(e["dur"] * 1000))
    t = table("collectives", analyze(load_kineto(A100_NCCL)))
    assert len(t) == len(groups) == 7
    for row in t.rows():
        kind, nbytes, n = row[0], row[2], row[3]
        med = statistics.median(groups[(kind, nbytes, n)])
        algbw = nbytes / (med * 1e-9)
        factor = {"allreduce": 2 * (n - 1) / n, "broadcast": 1.0}[kind]
        assert row[11] == pytest.approx(algbw, rel=1e-12)
        assert row[12] == pytest.approx(algbw * factor, rel=1e-12)
        assert row[13] == "from the median; bus factor 1 (n=2)"
    assert t.note.startswith("algbw = bytes / median_ns")


def test_collectives_without_sizes_say_so():
    """An nsys-like trace: the collective is known from the kernel name only, no sizes."""
    pool = StringPool()
    name = pool.code("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)")
    kernels = make_table("kernels", start_ns=[0, 1000], end_ns=[400, 1600], name=[name, name], device=[0, 0],
                         stream=[3, 3])
    trace = build_trace(TraceMeta(source_path="built", source_format="nsys-sqlite"), pool, kernels=kernels)
    (row,) = table("collectives", analyze(trace)).rows()
    assert row[0] == "allreduce" and row[2] is None
    assert row[11:] == (None, None, "no sizes recorded (an nsys input names the collective in the kernel name only)")


def test_roofline_table_is_the_jsons_roofline_points():
    """The estimate's points as the JSON document holds them (``roofline_estimate.points``),
    longest first; achieved FLOP/s re-derived by hand from FLOPs / duration."""
    from conftest import H200_LLAMA

    from tracestory.analysis.results import analyze_inputs
    from tracestory.ingest import load_inputs
    from tracestory.render.jsonout import document

    results = analyze_inputs(load_inputs([H200_LLAMA]))
    points = document(results)["traces"][0]["roofline_estimate"]["points"]
    t = results.table("roofline")
    assert len(t) == len(points) == 20
    want = sorted(points, key=lambda p: (-p["duration_ns"], p["label"]))
    for row, p in zip(t.rows(), want, strict=True):
        r = dict(zip(t.columns, row, strict=True))
        assert (r["name"], r["source"], r["count"], r["duration_ns"], r["bound"]) == (
            p["label"], "estimate", p["count"], p["duration_ns"], p["bound"])
        assert r["flops"] == p["flops"] and r["dram_bytes"] == p["dram_bytes"]
        assert r["fraction_of_roof"] == pytest.approx(p["pct_of_roof"] / 100)
        assert r["achieved_flops_per_s"] == pytest.approx(p["flops"] / (p["duration_ns"] * 1e-9))


def test_roofline_table_with_nsight_compute_and_without_shapes():
    from conftest import H200_LLAMA, NCU_RAW, NSYS_2024

    from tracestory.analysis.results import analyze_inputs
    from tracestory.ingest import load_inputs

    results = analyze_inputs(load_inputs([H200_LLAMA, NCU_RAW]))
    t = results.table("roofline")
    # llama1layer_ncu_raw.csv: six profiled kernels (tests/data/PROVENANCE.md)
    assert len(t) == 6 and set(t["source"]) == {"ncu"}
    none = analyze_inputs(load_inputs([NSYS_2024])).table("roofline")
    assert len(none) == 0 and none.missing == "the trace holds no CPU ops to estimate from"
    assert table("roofline", analyze(_gap_trace())).missing.startswith("the roofline needs the GPU's peaks")
