"""Links between tables: a GPU activity's launch call (by correlation id) and the CPU
ranges that enclose a launch.

Correlation ids are unique within one process, and one Trace holds one process, so the join
is a sorted search on ``api["correlation"]``.
"""

from __future__ import annotations

import numpy as np

from ..trace import CPU_SIDE, Table, Trace
from . import intervals


def launch_index(trace: Trace, activity: Table) -> np.ndarray:
    """For each row of ``activity`` (kernels or memops), the row of ``trace.api`` that launched
    it, or -1 when the trace has no API call with that correlation id."""
    corr = activity["correlation"]
    api_corr = trace.api["correlation"]
    if len(api_corr) == 0 or len(corr) == 0:
        return np.full(len(corr), -1, dtype=np.int64)
    order = np.argsort(api_corr, kind="stable")
    sorted_corr = api_corr[order]
    pos = np.searchsorted(sorted_corr, corr)
    pos_c = np.minimum(pos, len(sorted_corr) - 1)
    hit = (sorted_corr[pos_c] == corr) & (corr >= 0)
    return np.where(hit, order[pos_c], -1).astype(np.int64)


def api_column(trace: Trace, api_rows: np.ndarray, column: str) -> np.ndarray:
    """``trace.api[column]`` at ``api_rows`` (from :func:`launch_index`); -1 where a row is -1."""
    out = np.full(len(api_rows), -1, dtype=np.int64)
    ok = api_rows >= 0
    out[ok] = trace.api[column][api_rows[ok]]
    return out


def gpu_ops_column(trace: Trace, column: str) -> np.ndarray:
    """``column`` of every GPU op, kernels then memops: the row order of all GPU-op arrays."""
    return np.concatenate([trace.kernels[column], trace.memops[column]])


def gpu_ops_launch_index(trace: Trace) -> np.ndarray:
    """:func:`launch_index` of every GPU op, kernels then memops."""
    return np.concatenate([launch_index(trace, trace.kernels), launch_index(trace, trace.memops)])


def _launch_column(trace: Trace, activity: Table, column: str) -> np.ndarray:
    """``trace.api[column]`` of each activity's launch call; -1 where unknown."""
    return api_column(trace, launch_index(trace, activity), column)


def launch_start_ns(trace: Trace, activity: Table) -> np.ndarray:
    """Start time of each activity's launch call; -1 where unknown."""
    return _launch_column(trace, activity, "start_ns")


def launch_thread(trace: Trace, activity: Table) -> np.ndarray:
    """Thread id of each activity's launch call; -1 where unknown."""
    return _launch_column(trace, activity, "tid")


def enclosed_by(trace: Trace, activity: Table, range_rows: np.ndarray) -> np.ndarray:
    """Boolean mask over ``activity``: launched inside any of the given CPU ``ranges`` rows
    (same thread, launch start within ``[start, end)``; a range with an unknown thread, tid < 0,
    encloses launches of any thread). Activities without a known launch are never enclosed.

    Vectorized per thread: the thread's ranges are merged into disjoint intervals (a launch is
    inside some range iff it is inside their union) and each launch is placed by one
    ``searchsorted``."""
    starts = launch_start_ns(trace, activity)
    tids = launch_thread(trace, activity)
    mask = np.zeros(len(starts), dtype=bool)
    r = trace.ranges
    rows = np.asarray(range_rows, dtype=np.int64)
    rows = rows[r["side"][rows] == CPU_SIDE]
    known = starts >= 0
    r_tid = r["tid"][rows]
    for tid in np.unique(r_tid):
        sel = rows[r_tid == tid]
        s, e = intervals.union(r["start_ns"][sel], r["end_ns"][sel])
        idx = np.flatnonzero(known if tid < 0 else known & (tids == tid))
        at = starts[idx]
        pos = np.searchsorted(s, at, side="right") - 1
        inside = pos >= 0
        inside[inside] = at[inside] < e[pos[inside]]
        mask[idx[inside]] = True
    return mask
