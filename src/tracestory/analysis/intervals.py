"""Interval arithmetic on sorted arrays: the union of intervals, never a sum of per-stream times.

All functions take ``starts``/``ends`` as int64 nanosecond arrays of equal length, in any
order, and are vectorized (one sort, one cumulative max).
"""

from __future__ import annotations

import numpy as np


def _in_start_order(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if bool((starts[1:] >= starts[:-1]).all()):
        return starts, ends   # already in start order (the usual case): no sort, no copies
    order = np.argsort(starts, kind="stable")
    return starts[order], ends[order]


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping or touching intervals. Returns sorted disjoint ``(starts, ends)``."""
    if np.size(starts) == 0:
        return np.asarray(starts, dtype=np.int64).copy(), np.asarray(ends, dtype=np.int64).copy()
    s, e = _in_start_order(starts, ends)
    run_end = np.maximum.accumulate(e)
    # A new merged interval begins where the start is past every earlier end: new[i + 1] says
    # interval i starts one (new[0]: the first does), so new[1:] marks the last of each.
    new = np.empty(s.size + 1, dtype=bool)
    new[0] = new[-1] = True
    np.greater(s[1:], run_end[:-1], out=new[1:-1])
    return s[new[:-1]], run_end[new[1:]]


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length covered by at least one interval: in start order, each interval adds the part
    of it past every earlier end, ``max(e_i, E_{i-1}) - max(s_i, E_{i-1})`` with ``E`` the running
    maximum of the ends (the sum telescopes to the merged intervals' lengths; no merged arrays)."""
    if np.size(starts) == 0:
        return 0
    s, e = _in_start_order(starts, ends)
    run_end = np.maximum.accumulate(e)
    lo = np.empty_like(s)
    lo[0] = s[0]
    np.maximum(s[1:], run_end[:-1], out=lo[1:])
    np.subtract(run_end, lo, out=lo)
    return int(lo.sum())


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
