"""Result tables: the ``kernels`` table against a direct SQL computation on a real Nsight Systems
export (what ``nsys stats --report cuda_gpu_kern_sum`` computes), the other tables against sums
read straight from the source files, and the Table type's outputs.

Second sources: SQLite queries on the export's CUPTI tables (GROUP BY the demangled name, the
report's default grouping), Python's ``statistics`` module for the median and the sample
standard deviation (``statistics.stdev``, ddof=1, the one nsys prints), a plain-Python merge of
busy intervals for the idle gaps, and ``json.load`` of the Kineto files.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sqlite3
import statistics

import pytest
from conftest import A100_NCCL, H200_LLAMA, NSYS_2024

from tracestory.analysis import analyze
from tracestory.analysis.operators import OUTSIDE_OPS
from tracestory.analysis.tables import TABLES, Table, kernels_table, table
from tracestory.errors import ToolNotFound, UsageError
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table


@pytest.fixture(scope="module")
def cloverleaf():
    (trace,) = load_nsys_sqlite(NSYS_2024)
    return analyze(trace)


@pytest.fixture(scope="module")
def llama():
    return analyze(load_kineto(H200_LLAMA))


def _sql(query: str) -> list[tuple]:
    with sqlite3.connect(NSYS_2024) as db:
        return db.execute(query).fetchall()


def test_kernels_table_is_cuda_gpu_kern_sum_computed_in_sql(cloverleaf):
    durations = {}
    for name, d in _sql("SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                        "JOIN StringIds s ON s.id = k.demangledName"):
        durations.setdefault(name, []).append(d)
    summary = _sql("SELECT s.value, count(*), sum(k.end - k.start), avg(k.end - k.start), min(k.end - k.start), "
                   "max(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
                   "GROUP BY s.value ORDER BY 3 DESC, 2, 1")
    grand = sum(r[2] for r in summary)
    t = table("kernels", cloverleaf)
    assert len(t) == len(summary) == 102  # distinct demangled names; shortName has only 3
    assert _sql("SELECT count(DISTINCT shortName) FROM CUPTI_ACTIVITY_KIND_KERNEL") == [(3,)]
    for row, (name, count, total, avg, mn, mx) in zip(t.rows(), summary):
        d = durations[name]
        want = (name, count, total, total / grand, avg, statistics.median(d), mn, mx,
                statistics.stdev(d) if len(d) > 1 else 0.0)
        assert row[:4] == want[:4]
        assert row[4:] == pytest.approx(want[4:], rel=1e-12)
    assert float(sum(t["share"])) == pytest.approx(1.0)


def test_kernels_table_stddev_and_median_as_nsys_prints_them():
    """Numbers printed by ``nsys stats`` for a two-call row (an osrt_sum row published in the
    README of github.com/ayush-os/nsight-systems-deep-dive: ``sem_wait``, 2 calls, 2,971,823 and
    333,015,608 ns -> Med 167,993,715.5, StdDev 233,376,198.5; the nsys stats reports share the
    same ``median`` and ``stdev`` SQL functions) and 0.0 for a one-instance row (its nvtx_sum)."""
    pool = StringPool()
    two, one = pool.code("two_call_kernel"), pool.code("one_call_kernel")
    kernels = make_table("kernels", start_ns=[0, 10_000_000_000, 20_000_000_000],
                         end_ns=[2_971_823, 10_333_015_608, 20_000_000_500], name=[two, two, one])
    trace = build_trace(TraceMeta(source_path="built", source_format="kineto"), pool, kernels=kernels)
    rows = {r[0]: r for r in kernels_table(trace).rows()}
    assert round(rows["two_call_kernel"][5], 1) == 167_993_715.5
    assert round(rows["two_call_kernel"][8], 1) == 233_376_198.5
    assert rows["one_call_kernel"][1:] == (1, 500, pytest.approx(500 / 335_987_931), 500.0, 500.0, 500, 500, 0.0)
    assert list(rows) == ["two_call_kernel", "one_call_kernel"]


def test_op_tables_keep_the_gpu_time_no_op_can_take(cloverleaf):
    """CloverLeaf has no NVTX ranges and no CPU ops: every kernel and memcpy is in the one
    'launched outside every CPU op' row, none dropped."""
    (k_n, k_ns), = _sql("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    (m_n, m_ns), = _sql("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    for name in ("ops", "leaf_ops"):
        t = table(name, cloverleaf)
        assert t.rows() == [(OUTSIDE_OPS, "none", None, None, None, None, k_n + m_n, None, k_ns + m_ns, 1.0, None)]


def test_ops_table_shares_sum_to_one_and_match_the_json(llama):
    t = table("leaf_ops", llama)
    with gzip.open(H200_LLAMA, "rt") as f:
        events = json.load(f)["traceEvents"]
    total = sum(round(e["dur"] * 1000) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert int(sum(t["total_ns"])) == total
    assert float(sum(t["share"])) == pytest.approx(1.0)
    assert t["name"][0] == "aten::mm"


def test_gaps_table_matches_a_plain_merge_of_the_busy_intervals(cloverleaf):
    spans = sorted(_sql("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                        "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
    gaps = []
    cur_end = spans[0][1]
    for s, e in spans[1:]:
        if s > cur_end:
            gaps.append((cur_end, s - cur_end))
        cur_end = max(cur_end, e)
    t = table("gaps", cloverleaf)
    assert list(zip(t["start_ns"].tolist(), t["dur_ns"].tolist())) == gaps
    assert (t["launch_wait_ns"] + t["other_ns"] == t["dur_ns"]).all()
    assert (t["launch_wait_ns"] >= 0).all()


def test_collectives_table_counts_every_collective_kernel_of_the_json():
    with gzip.open(A100_NCCL, "rt") as f:
        events = json.load(f)["traceEvents"]
    coll = [e for e in events if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    t = table("collectives", analyze(load_kineto(A100_NCCL)))
    assert int(sum(t["count"])) == len(coll) == 21
    assert int(sum(t["total_ns"])) == sum(round(e["dur"] * 1000) for e in coll)
    assert set(t["kind"]) == {e["args"]["Collective name"] for e in coll}


def test_categories_and_phases_tables(llama):
    with gzip.open(H200_LLAMA, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    c = table("categories", llama)
    assert int(sum(c["count"])) == len(gpu)
    assert int(sum(c["total_ns"])) == sum(round(e["dur"] * 1000) for e in gpu)
    p = table("phases", llama)
    marks = sorted(e["name"] for e in events if e.get("cat") == "user_annotation")
    assert sorted(p["name"]) == marks  # prefill and decode_0 .. decode_15
    assert len(p) == 17


def test_table_outputs_and_repr(llama, tmp_path):
    t = table("kernels", llama)
    assert repr(t) == ("Table('kernels', 20 rows: name, count, total_ns, share, mean_ns, median_ns, min_ns, "
                       "max_ns, stddev_ns)")
    path = tmp_path / "k.csv"
    t.to_csv(path)
    with open(path, newline="") as f:
        back = list(csv.reader(f))
    assert back[0] == list(t.columns)
    assert [r[0] for r in back[1:]] == list(t["name"])
    assert [int(r[2]) for r in back[1:]] == t["total_ns"].tolist()
    assert [float(r[8]) for r in back[1:]] == t["stddev_ns"].tolist()  # full precision
    buf = io.StringIO()
    table("leaf_ops", llama).to_csv(buf)
    assert buf.getvalue().splitlines()[0].startswith("name,kind,input_dims,input_types,")
    md = t.to_markdown().splitlines()
    assert md[0] == "| " + " | ".join(t.columns) + " |" and len(md) == len(t) + 2
    df = t.to_pandas()
    assert list(df.columns) == list(t.columns) and df["total_ns"].sum() == t["total_ns"].sum()
    arrow = _arrow(t)
    if arrow is not None:
        assert arrow.num_rows == len(t) and arrow.column("count").to_pylist() == t["count"].tolist()


def _arrow(t: Table):
    """``t.to_arrow()``; without pyarrow installed (an optional package) the call must fail with
    the one-line missing-package error instead, and None is returned."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ToolNotFound, match="pyarrow"):
            t.to_arrow()
        return None
    return t.to_arrow()


def test_missing_values_stay_missing_in_every_output(cloverleaf):
    t = table("ops", cloverleaf)  # input dims and calls are unknown on the remainder row
    buf = io.StringIO()
    t.to_csv(buf)
    assert buf.getvalue().splitlines()[1].split(",")[2:6] == ["", "", "", ""]
    assert t.to_pandas()["calls"].isna().all()
    assert str(t.to_pandas()["calls"].dtype) == "Int64"  # a nullable integer, not floats
    arrow = _arrow(t)
    assert arrow is None or str(arrow.schema.field("calls").type) == "int64"


def test_columns_keep_their_types_in_an_empty_table(llama):
    t = table("modules", llama)  # this trace was taken without with_stack: no module calls
    assert len(t) == 0
    assert [str(t.to_pandas()[c].dtype) for c in ("depth", "total_ns", "share")] == ["int64", "int64", "float64"]
    arrow = _arrow(t)
    assert arrow is None or [str(arrow.schema.field(c).type) for c in ("path", "depth", "total_ns", "share")] == \
        ["string", "int64", "int64", "double"]


def test_every_table_builds_and_unknown_names_are_refused(llama):
    for name in TABLES:
        t = table(name, llama)
        assert isinstance(t, Table) and t.name == name
        assert len({len(v) for v in t.columns.values()}) == 1
    with pytest.raises(UsageError, match="unknown table 'kernel'"):
        table("kernel", llama)
