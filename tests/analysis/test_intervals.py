"""Interval union, union length and gaps against a plain Python merge (sort by start, extend the
current interval while the next one starts at or before the latest end so far), on random intervals (touching,
nested, empty and, for the length, reversed ones) and on the kernels and memops of the 2024.5
nsys fixture read straight from SQLite."""

from __future__ import annotations

import sqlite3

import numpy as np
from conftest import NSYS_2024

from tracestory.analysis import intervals


def _merge(starts, ends) -> list[list[int]]:
    # reach: the latest end seen so far (for well-formed intervals, the current interval's end;
    # a reversed row, end < start, cannot pull it back)
    out: list[list[int]] = []
    reach = None
    for s, e in sorted(zip(starts, ends), key=lambda p: p[0]):   # Python's sort is stable too
        if out and s <= reach:
            reach = max(reach, e)
            out[-1][1] = reach
        else:
            reach = e if reach is None else max(reach, e)
            out.append([s, reach])
    return out


def test_random_intervals_match_a_plain_merge():
    rng = np.random.default_rng(7)
    for trial in range(3000):
        n = int(rng.integers(0, 15))
        s = rng.integers(-20, 60, n)
        d = rng.integers(0, 12, n)
        if trial % 2:
            s = np.sort(s)   # the no-sort path
        e = s + d
        merged = _merge(s.tolist(), e.tolist())
        us, ue = intervals.union(s, e)
        assert [[int(a), int(b)] for a, b in zip(us, ue)] == merged
        assert us.dtype == ue.dtype == np.int64
        assert intervals.union_length(s, e) == sum(b - a for a, b in merged)
        g0, g1 = intervals.gaps(s, e)
        assert list(zip(g0.tolist(), g1.tolist())) == [(a[1], b[0]) for a, b in zip(merged, merged[1:])]


def test_union_length_is_the_merged_sum_also_for_reversed_intervals():
    # a damaged row with end < start: the length is still that of the merge walk above
    rng = np.random.default_rng(11)
    for _ in range(3000):
        n = int(rng.integers(1, 12))
        s = rng.integers(0, 40, n)
        e = s + rng.integers(-6, 10, n)
        assert intervals.union_length(s, e) == sum(b - a for a, b in _merge(s.tolist(), e.tolist()))


def test_nsys_fixture_busy_time_matches_a_plain_merge():
    con = sqlite3.connect(NSYS_2024)
    rows = con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL "
                       "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
    con.close()
    s = np.array([r[0] for r in rows], dtype=np.int64)
    e = np.array([r[1] for r in rows], dtype=np.int64)
    merged = _merge(s.tolist(), e.tolist())
    assert len(rows) > 1000 and len(merged) > 100
    assert intervals.union_length(s, e) == sum(b - a for a, b in merged)
    us, ue = intervals.union(s, e)
    assert us.tolist() == [a for a, _ in merged] and ue.tolist() == [b for _, b in merged]
