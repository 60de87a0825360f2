"""Nesting of CPU intervals per thread, and the innermost interval holding a point in time.

Model: on one thread, the intervals a profiler records (ops, ``record_function`` ranges, NVTX
push/pop ranges, module calls) nest like a call stack. Sorted by (thread, start ascending, end
descending), an interval's **depth** is the number of intervals begun before it on its thread
and not yet ended at its start; its **parent** is the last interval one level up that starts at
or before it and still runs; its **root** is its depth-0 ancestor. The innermost interval
holding a point ``t`` (``start <= t < end``) is found from the last interval begun at or before
``t``, walking up the parents until one still runs.

Vectorised: (thread, time) is packed into one sortable int64 key (``thread * span + time
offset``, or the rank of the time when the span does not fit), so every step is a sort or a
``searchsorted``; the loops run over nesting levels, never over intervals.

Limits: an interval that overlaps a sibling instead of nesting gets the depth of the sweep;
every answer is checked (a parent must still run at the child's start, the innermost interval
must hold the point), so a bad nesting never hands out an interval that does not contain the
point, it only moves the answer up to an enclosing one. Empty intervals are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Nesting:
    """CPU intervals of one kind, sorted by (thread, start asc, end desc), with their nesting."""

    start: np.ndarray
    end: np.ndarray
    key_start: np.ndarray  # thread * span + time offset: one sortable key per (thread, time)
    key_end: np.ndarray
    span: int
    parent: np.ndarray  # row of the innermost interval enclosing this one, -1
    depth: np.ndarray
    root: np.ndarray  # row of the outermost enclosing interval (itself at depth 0)
    source_row: np.ndarray  # row in the table the intervals came from


def dense_codes(*columns: np.ndarray) -> np.ndarray:
    """Dense int64 codes of the tuples formed by equal-length integer columns (1-D sorts only:
    ``np.unique(axis=...)`` sorts structured rows, tens of times slower)."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    span = 1  # code < span
    for c in columns:
        _, inv = np.unique(c, return_inverse=True)
        k = int(inv.max()) + 1 if inv.size else 1
        if span * k >= 1 << 62:  # re-densify before the packed key could overflow
            _, code = np.unique(code, return_inverse=True)
            code = code.reshape(-1).astype(np.int64)
            span = int(code.max()) + 1 if code.size else 1
        code = code * k + inv.reshape(-1)
        span *= k
    _, code = np.unique(code, return_inverse=True)
    return code.reshape(-1).astype(np.int64)


def thread_codes(pid: np.ndarray, tid: np.ndarray, *more: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """Dense codes of (pid, tid) pairs, shared by every pair of arrays given."""
    pids = np.concatenate([pid] + [p for p, _ in more]).astype(np.int64)
    tids = np.concatenate([tid] + [t for _, t in more]).astype(np.int64)
    sizes = [len(pid)] + [len(p) for p, _ in more]
    if pids.size and pids.min() >= -1 and pids.max() < 1 << 29 and tids.min() >= -1 and tids.max() < 1 << 32:
        # one packed key; threads are few, so the distinct keys are found fast and each row's
        # code is a binary search among them
        key = ((pids + 1) << 33) | (tids + 1)
        inv = np.searchsorted(np.unique(key), key).astype(np.int64)
    else:
        inv = dense_codes(pids, tids)
    return np.split(inv, np.cumsum(sizes)[:-1])


def _time_keys(thread: np.ndarray, times: list[np.ndarray], point_thread: np.ndarray):
    """One sortable int64 key per (thread, time): ``thread * span + (time - t0)`` when that
    fits, else ``thread * span + rank of time`` (coordinate compression). ``times``: the arrays of
    interval times (threads ``thread``) then the points (threads ``point_thread``), last.
    Returns one key array per array of ``times``, and ``span``."""
    sizes = [t.size for t in times]
    allt = np.concatenate(times)
    if allt.size == 0:
        return [np.zeros(0, np.int64) for _ in times], 1
    t0, t1 = int(allt.min()), int(allt.max())
    n_threads = int(max(thread.max() if thread.size else 0, point_thread.max() if point_thread.size else 0)) + 1
    span = t1 - t0 + 1
    if span * n_threads < 1 << 62:
        rel = allt - t0
    else:
        uniq, rel = np.unique(allt, return_inverse=True)
        rel = rel.reshape(-1).astype(np.int64)
        span = uniq.size
    parts = np.split(rel, np.cumsum(sizes)[:-1])
    out = [thread.astype(np.int64) * span + part for part in parts[:-1]]
    out.append(point_thread.astype(np.int64) * span + parts[-1])
    return out, span


def nest_intervals(start: np.ndarray, end: np.ndarray, thread: np.ndarray, points: np.ndarray,
          point_thread: np.ndarray, source_row: np.ndarray) -> tuple[Nesting, np.ndarray]:
    """Nesting of intervals per thread, and the innermost interval containing each point
    (``start <= point < end``, same thread; -1 where none). Empty intervals are dropped: they
    contain nothing."""
    keep = end > start
    start, end, thread, source_row = start[keep], end[keep], thread[keep], source_row[keep]
    n = start.size
    (ks, ke, kp), span = _time_keys(thread, [start, end, points], point_thread)
    order = np.lexsort((-ke, ks))
    start, end, ks, ke, source_row = start[order], end[order], ks[order], ke[order], source_row[order]

    # Depth: intervals begun at or before this one (in sort order) minus those already ended.
    # Within one thread key the counts of earlier threads cancel.
    ended = np.searchsorted(np.sort(ke), ks, side="right")
    depth = np.maximum(np.arange(n) - ended, 0).astype(np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    root = np.arange(n, dtype=np.int64)
    max_depth = int(depth.max()) if n else 0
    rows_at = [np.flatnonzero(depth == d) for d in range(max_depth + 1)]
    for d in range(1, max_depth + 1):
        child, up = rows_at[d], rows_at[d - 1]
        if child.size == 0 or up.size == 0:
            continue
        # the last interval one level up that starts at or before the child (rows are in key order)
        j = np.searchsorted(ks[up], ks[child], side="right") - 1
        ok = j >= 0
        cand = up[np.maximum(j, 0)]
        ok &= (ks[cand] <= ks[child]) & (ke[cand] > ks[child]) & (ks[cand] // span == ks[child] // span)
        parent[child[ok]] = cand[ok]
        root[child[ok]] = root[cand[ok]]
    nest = Nesting(start, end, ks, ke, span, parent, depth, root, source_row)
    return nest, innermost(nest, kp)


def innermost(nest: Nesting, kp: np.ndarray) -> np.ndarray:
    """Innermost interval containing each point key; -1 where none."""
    n = nest.key_start.size
    out = np.full(kp.size, -1, dtype=np.int64)
    if n == 0 or kp.size == 0:
        return out
    cand = np.searchsorted(nest.key_start, kp, side="right") - 1
    pending = np.flatnonzero(cand >= 0)
    cur = cand[pending]
    # Walk up from the last interval begun before the point until one still contains it: at
    # most one step per nesting level.
    while pending.size:
        p = kp[pending]
        same_thread = nest.key_start[cur] // nest.span == p // nest.span
        inside = same_thread & (nest.key_end[cur] > p)
        out[pending[inside]] = cur[inside]
        go = ~inside & same_thread
        pending, cur = pending[go], nest.parent[cur[go]]
        alive = cur >= 0
        pending, cur = pending[alive], cur[alive]
    return out
