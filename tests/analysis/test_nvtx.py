"""nvtx_tree on the real 2022 export (NVTX push/pop around memcpy/memset/kernels): the GPU
time projected into each range is recomputed with one direct SQL query on the same file."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from conftest import NSYS_2022

from tracestory.analysis.categories import Rule, Taxonomy, classify
from tracestory.analysis.nvtx import _grouped_union, nvtx_tree
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

# Every GPU op with its launch call (same correlation id and process), joined to every NVTX
# push/pop range of the launching thread that holds the launch start.
GPU_OPS = """
    SELECT start, end, correlationId, globalPid, 1 AS is_kernel FROM CUPTI_ACTIVITY_KIND_KERNEL
    UNION ALL SELECT start, end, correlationId, globalPid, 0 FROM CUPTI_ACTIVITY_KIND_MEMCPY
    UNION ALL SELECT start, end, correlationId, globalPid, 0 FROM CUPTI_ACTIVITY_KIND_MEMSET"""
PER_RANGE = f"""
    SELECT n.text, n.start, n.end - n.start, IFNULL(sum(g.end - g.start), 0), IFNULL(sum(g.is_kernel), 0), count(g.start)
    FROM NVTX_EVENTS n
    LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
      ON r.globalTid = n.globalTid AND r.start >= n.start AND r.start < n.end AND r.eventClass IN (0, 1)
    LEFT JOIN ({GPU_OPS}) g ON g.correlationId = r.correlationId AND g.globalPid = (r.globalTid & ~16777215)
    WHERE n.eventType = 59
    GROUP BY n.rowid ORDER BY n.start"""


@pytest.fixture(scope="module")
def trace():
    t, = load_nsys_sqlite(NSYS_2022)
    return t


@pytest.fixture(scope="module")
def tree(trace):
    return nvtx_tree(trace)


def test_every_range_gpu_time_matches_sql(tree):
    con = sqlite3.connect(NSYS_2022)
    expected = con.execute(PER_RANGE).fetchall()
    con.close()
    nodes = sorted(tree.walk(), key=lambda n: (n.start_ns, n.depth))
    assert tree.range_count == len(nodes) == len(expected) == 76
    got = [(n.name, n.start_ns, n.cpu_ns, n.gpu_time_ns, n.kernel_count, n.kernel_count + n.memop_count) for n in nodes]
    assert got == [tuple(e) for e in expected]
    assert any(n.gpu_time_ns > 0 for n in nodes)


def test_tree_follows_the_names(tree):
    # The fixture's range names spell their path ("main->test_max_par->phase").
    assert [r.name for r in tree.roots] == ["main"]
    for node in tree.walk():
        for child in node.children:
            assert child.name.rsplit("->", 1)[0] == node.name
            assert child.depth == node.depth + 1


def test_children_gpu_time_is_included_in_parent(tree):
    for node in tree.walk():
        assert node.gpu_time_ns >= sum(c.gpu_time_ns for c in node.children)
        assert node.gpu_busy_ns <= node.gpu_time_ns


def test_root_totals_against_sql(tree):
    con = sqlite3.connect(NSYS_2022)
    (total, n), = con.execute(f"SELECT sum(end - start), count(*) FROM ({GPU_OPS})").fetchall()
    con.close()
    root = tree.roots[0]
    # every GPU op in this program is launched inside "main"
    assert (root.gpu_time_ns, root.kernel_count + root.memop_count) == (total, n)
    assert tree.unattributed_op_count == 0 and tree.gpu_op_count == n


def test_grouped_union_by_hand():
    g = np.array([0, 0, 0, 1, 1, 2])
    s = np.array([0, 5, 20, 100, 100, 7])
    e = np.array([10, 15, 30, 150, 120, 7])
    # group 0: [0,15) + [20,30) = 25; group 1: [100,150) = 50; group 2: empty = 0; group 3: nothing
    assert _grouped_union(g, s, e, 4).tolist() == [25, 50, 0, 0]


def test_range_rule_uses_nvtx_ranges(trace):
    """A category rule that tests the enclosing NVTX range (B's Rule.range) on nsys input."""
    tax = Taxonomy(name="t", categories=("phase2_kernels", "other"),
                   rules=(Rule(category="phase2_kernels", kernel="test", range=r"->phase2$"),))
    cls = classify(trace, tax)
    con = sqlite3.connect(NSYS_2022)
    (n,), = con.execute("""
        SELECT count(DISTINCT k.rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
        JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND r.start >= n.start AND r.start < n.end
        WHERE n.eventType = 59 AND n.text LIKE '%->phase2'""").fetchall()
    con.close()
    assert n > 0
    assert int((cls.kernel_category == 0).sum()) == n
