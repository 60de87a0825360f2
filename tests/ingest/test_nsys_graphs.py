"""CUDA graph replays in Nsight Systems SQLite exports, against direct SQL on the exports.

``tests/data/nsys_graphs/`` holds the same small program exported twice (synthetic: see its
README): with node tracing (``--cuda-graph-trace=node``: every node a kernel row sharing its
``cudaGraphLaunch``'s correlation id) and with nsys's default graph-level tracing (one
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row per launch, the nodes absent). Every expected number
below is a SQL query on the file, not the reader's output.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

import tracestory
from tracestory.analysis.graphs import DIRECT, GRAPH, graph_replays, kernel_origins
from tracestory.ingest import nsys_sqlite
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

DATA = Path(__file__).resolve().parents[1] / "data" / "nsys_graphs"
NODES, WHOLE = DATA / "graph_nodes.sqlite", DATA / "graph_whole.sqlite"


def sql(path: Path, query: str):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def launched_by(path: Path, call: str, table: str = "CUPTI_ACTIVITY_KIND_KERNEL") -> tuple[int, int, int]:
    """(rows, distinct launch calls, summed duration) of the rows whose correlation id is a call
    named ``call`` (nsys's version suffix included)."""
    (n, calls, ns), = sql(path, f"""
        SELECT count(*), count(DISTINCT k.correlationId), coalesce(sum(k.end - k.start), 0)
        FROM {table} k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
        JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE '{call}%'""")
    return n, calls, ns


@pytest.fixture(params=[True, False], ids=["page-reader", "sqlite"])
def reader(request, monkeypatch):
    monkeypatch.setattr(nsys_sqlite, "_PAGE_READER", request.param)


def test_node_kernels_are_attributed_to_their_graph_launch(reader):
    (t,) = load_nsys_sqlite(NODES)
    (n_kernels,), = sql(NODES, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    (n_nodes, n_graphs), = sql(NODES, "SELECT count(*), count(DISTINCT graphId) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                      "WHERE graphNodeId IS NOT NULL")
    graph_rows, graph_calls, graph_ns = launched_by(NODES, "cudaGraphLaunch")
    direct_rows, _, direct_ns = launched_by(NODES, "cudaLaunchKernel")
    (most,), = sql(NODES, "SELECT max(c) FROM (SELECT count(*) AS c FROM CUPTI_ACTIVITY_KIND_KERNEL "
                          "WHERE graphNodeId IS NOT NULL GROUP BY correlationId)")
    (launch_calls,), = sql(NODES, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                                  "ON s.id = r.nameId WHERE s.value LIKE 'cudaGraphLaunch%'")
    assert (n_kernels, n_nodes, graph_rows) == (46, 40, 40)  # the fixture as built; the rest follows SQL
    g = graph_replays(t)
    assert len(t.kernels) == n_kernels
    assert (g.graph_launches, g.graph_kernels, g.graph_kernel_time_ns) == (launch_calls, graph_rows, graph_ns)
    assert (g.direct_kernels, g.direct_kernel_time_ns) == (direct_rows, direct_ns)
    assert g.unlinked_kernels == 0 and g.other_kernels == 0
    assert g.max_kernels_per_graph_launch == most
    assert graph_calls == launch_calls
    assert t.meta.extra["cuda_graphs"] == {"trace_mode": "node", "node_kernels": n_nodes,
                                           "graphs_with_node_kernels": n_graphs, "whole_graph_launches": 0}
    # the rows a graph launch replayed are exactly the rows with a graph node id
    origins = kernel_origins(t)
    (node_starts,) = zip(*sql(NODES, "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL"))
    assert sorted(t.kernels["start_ns"][origins == GRAPH].tolist()) == sorted(node_starts)
    assert int((origins == DIRECT).sum()) == direct_rows


def test_node_export_facts_and_advice_behave_as_on_kineto():
    run = tracestory.analyze(str(NODES)).runs[0]
    graph_rows, graph_calls, _ = launched_by(NODES, "cudaGraphLaunch")
    assert run.facts.in_use.graphs == f"{graph_rows} kernels from {graph_calls} graph launches"
    replay = next(f for f in run.findings if f.rule == "graph_replay")
    assert f"{graph_calls} graph launches" in replay.title
    # a minority of kernel time replayed is still told as replayed (it read "no graph replays")
    mode = run.kernel_facts.execution_mode
    assert f"replayed from {graph_calls} graph launches" in mode and "no graph replays" not in mode
    # the launch call's CPU time is read from the directly launched kernels only: its p50 is the
    # median of (call end - call start) over the cudaLaunchKernel rows that launched a kernel
    lat = sorted(e - s for s, e in sql(NODES, """
        SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
        ON r.correlationId = k.correlationId JOIN StringIds s ON s.id = r.nameId
        WHERE s.value LIKE 'cudaLaunchKernel%'"""))
    idle = next(f for f in run.findings if f.rule == "gpu_idle")
    p50 = next(e.value for e in idle.evidence if e.label.startswith("launch call CPU time p50"))
    assert p50 == pytest.approx((lat[len(lat) // 2 - 1] + lat[len(lat) // 2]) / 2)
    text = " ".join(f"{f.title} {f.recommendation}" for f in run.findings)
    assert "cudaStreamBeginCapture" not in text  # no advice to start using graphs
    assert not any(lim.analysis == "graph replays" for lim in tracestory.analyze(str(NODES)).limitations)


def test_graph_level_export_keeps_each_replay_as_one_opaque_row(reader):
    (t,) = load_nsys_sqlite(WHOLE)
    rows = sql(WHOLE, "SELECT start, end, correlationId, graphId FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE ORDER BY start")
    (n_kernels,), = sql(WHOLE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert (len(rows), n_kernels) == (8, 6)
    assert len(t.kernels) == n_kernels + len(rows)
    names = [t.name(int(c)) for c in t.kernels["name"]]
    replay = [i for i, nm in enumerate(names) if nm.startswith(nsys_sqlite.GRAPH_REPLAY_PREFIX)]
    got = [(int(t.kernels["start_ns"][i]), int(t.kernels["end_ns"][i]), int(t.kernels["correlation"][i]))
           for i in replay]
    assert got == [(s, e, c) for s, e, c, _ in rows]
    assert {names[i] for i in replay} == {f"CUDA graph {g} replay, nodes not traced" for *_, g in rows}
    g = graph_replays(t)
    _, graph_calls, graph_ns = launched_by(WHOLE, "cudaGraphLaunch", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    assert (g.graph_launches, g.graph_kernels, g.graph_kernel_time_ns) == (graph_calls, len(rows), graph_ns)
    assert t.meta.extra["cuda_graphs"]["trace_mode"] == "graph"
    assert t.meta.extra["cuda_graphs"]["whole_graph_launches"] == len(rows)


def test_graph_level_export_says_replays_are_opaque_and_how_to_capture_them():
    results = tracestory.analyze(str(WHOLE))
    (n,), = sql(WHOLE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    lim = [x for x in results.limitations if x.analysis == "graph replays"]
    assert len(lim) == 1
    assert f"{n} CUDA graph launches were traced whole" in lim[0].reason
    assert "--cuda-graph-trace=node" in lim[0].reason
    # the replays' GPU time is busy time, not idle: busy = the union of kernel and replay rows,
    # which do not overlap in this program (checked by SQL: each starts after the previous ends)
    spans = sorted(sql(WHOLE, "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                              "SELECT start, end FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE"))
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))
    idle = next(f for f in results.runs[0].findings if f.rule == "gpu_idle")
    busy = next(e.value for e in idle.evidence if e.label == "GPU busy (union)")
    assert busy == sum(e - s for s, e in spans)


def test_graph_rows_without_times_are_dropped_and_counted(tmp_path):
    path = tmp_path / "g.sqlite"
    shutil.copy(WHOLE, path)
    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_GRAPH_TRACE SET start = 0, end = 0 WHERE rowid = 1")
    con.commit()
    con.close()
    (t,) = load_nsys_sqlite(path)
    (n,), = sql(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE WHERE start != 0 OR end != 0")
    assert t.meta.extra["cuda_graphs"]["whole_graph_launches"] == n == 7
    assert any("1 of 8 graph launches without times" in w for w in t.meta.stated_warnings)


def test_exports_without_graph_columns_read_as_before():
    path = DATA.parent / "public" / "nsys_2022.1_gtx1060_concurrent_nvtx.sqlite"
    (t,) = load_nsys_sqlite(path)
    (n,), = sql(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert len(t.kernels) == n
    assert t.meta.extra["cuda_graphs"] == {"trace_mode": None, "node_kernels": 0,
                                           "graphs_with_node_kernels": None, "whole_graph_launches": 0}
