"""Interval arithmetic on sorted arrays: the union of intervals, never a sum of per-stream times.

All functions take ``starts``/``ends`` as int64 nanosecond arrays of equal length, in any
order, and are vectorized (one sort, one cumulative max).
"""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping or touching intervals. Returns sorted disjoint ``(starts, ends)``."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if starts.size == 0:
        return starts.copy(), ends.copy()
    if bool((starts[1:] >= starts[:-1]).all()):
        s, e = starts, ends   # already in start order (the usual case): no sort, no copies
    else:
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # A new merged interval begins where the start is past every earlier end.
    brk = np.flatnonzero(s[1:] > run_end[:-1])   # interval brk[i] ends one, brk[i] + 1 starts the next
    first = np.empty(brk.size + 1, dtype=np.int64)
    first[0] = 0
    first[1:] = brk + 1
    last = np.empty(brk.size + 1, dtype=np.int64)
    last[:-1] = brk
    last[-1] = s.size - 1
    return s[first], run_end[last]


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length covered by at least one interval."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length covered by both interval sets (each given as any intervals; merged first)."""
    sa, ea = union(*a)
    sb, eb = union(*b)
    if sa.size == 0 or sb.size == 0:
        return 0
    # |A ∩ B| = |A| + |B| - |A ∪ B|
    both_s = np.concatenate([sa, sb])
    both_e = np.concatenate([ea, eb])
    return int((ea - sa).sum() + (eb - sb).sum() - union_length(both_s, both_e))


def gaps(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Idle gaps between merged intervals (not before the first or after the last)."""
    s, e = union(starts, ends)
    return e[:-1], s[1:]


def clip(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals clipped to ``[lo, hi)``; empty ones dropped."""
    s = np.clip(starts, lo, hi)
    e = np.clip(ends, lo, hi)
    keep = e > s
    return s[keep], e[keep]
