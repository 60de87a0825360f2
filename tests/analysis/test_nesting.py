"""Interval nesting per thread, on hand-written intervals with the answers worked out by hand."""

from __future__ import annotations

import numpy as np

from tracestory.analysis.nesting import nest_intervals


def _run(intervals, points):
    """intervals: (start, end, thread); points: (time, thread)."""
    s, e, th = (np.array(c, dtype=np.int64) for c in zip(*intervals))
    pt, pth = (np.array(c, dtype=np.int64) for c in zip(*points))
    return nest_intervals(s, e, th, pt, pth, np.arange(len(intervals)))


def test_depth_parent_root_and_innermost():
    # thread 0: A [0, 100) > B [10, 50) > C [20, 30); D [60, 90) in A; thread 1: E [0, 100)
    nest, inner = _run([(0, 100, 0), (10, 50, 0), (20, 30, 0), (60, 90, 0), (0, 100, 1)],
                       [(25, 0), (40, 0), (55, 0), (70, 0), (100, 0), (25, 1), (25, 2)])
    row = {int(r): "ABCDE"[int(r)] for r in nest.source_row}
    by_name = {row[i]: i for i in range(len(row))}
    assert {row[i]: int(nest.depth[i]) for i in range(5)} == {"A": 0, "B": 1, "C": 2, "D": 1, "E": 0}
    assert {row[i]: (row[int(p)] if p >= 0 else None) for i, p in enumerate(nest.parent)} == \
        {"A": None, "B": "A", "C": "B", "D": "A", "E": None}
    assert row[int(nest.root[by_name["C"]])] == "A"
    # 25 in C, 40 in B (C ended), 55 in A (B ended, D not begun), 70 in D, 100 in nothing
    # (end is exclusive), thread 1 in E, thread 2 has no interval
    assert [row[int(i)] if i >= 0 else None for i in inner] == ["C", "B", "A", "D", None, "E", None]


def test_equal_starts_nest_the_longer_outside_and_empty_intervals_hold_nothing():
    nest, inner = _run([(0, 10, 0), (0, 50, 0), (5, 5, 0)], [(5, 0), (20, 0)])
    rows = nest.source_row.tolist()
    assert rows == [1, 0]  # the empty interval [5, 5) is dropped; the longer one sorts first
    assert nest.parent.tolist() == [-1, 0]
    assert [rows[i] for i in inner] == [0, 1]


def test_times_too_far_apart_to_pack_use_ranks():
    big = 1 << 61  # a span times the thread count past 2**62: ranks instead of offsets
    nest, inner = _run([(0, big, 0), (big - 10, big - 5, 0), (0, big, 1)], [(big - 7, 0), (big - 7, 1), (big - 1, 0)])
    rows = nest.source_row.tolist()
    assert [rows[i] for i in inner] == [1, 2, 0]
