"""Links between tables: a GPU activity's launch call (by correlation id) and the CPU
ranges that enclose a launch.

Correlation ids are unique within one process, and one Trace holds one process, so the join
is a sorted search on ``api["correlation"]``.
"""

from __future__ import annotations

import numpy as np

from ..trace import CPU_SIDE, Table, Trace
from . import derived, intervals


def _api_by_correlation(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``trace.api`` ordered by correlation id (stable) and the ids in that order;
    computed once per trace (:mod:`.derived`)."""

    def compute() -> tuple[np.ndarray, np.ndarray]:
        api_corr = trace.api["correlation"]
        order = np.argsort(api_corr, kind="stable")
        return order, api_corr[order]

    return derived.memo(trace, "api_by_correlation", compute)


def _launch_rows(trace: Trace, corr: np.ndarray) -> np.ndarray:
    if len(trace.api) == 0 or len(corr) == 0:
        return np.full(len(corr), -1, dtype=np.int64)
    order, sorted_corr = _api_by_correlation(trace)
    pos = np.searchsorted(sorted_corr, corr)
    pos_c = np.minimum(pos, len(sorted_corr) - 1)
    hit = (sorted_corr[pos_c] == corr) & (corr >= 0)
    return np.where(hit, order[pos_c], -1).astype(np.int64)


def launch_index(trace: Trace, activity: Table) -> np.ndarray:
    """For each row of ``activity`` (kernels or memops), the row of ``trace.api`` that launched
    it, or -1 when the trace has no API call with that correlation id. Read-only; computed once
    per trace for ``trace.kernels`` and ``trace.memops`` themselves."""
    for key, table in (("launch_index:kernels", trace.kernels), ("launch_index:memops", trace.memops)):
        if activity is table:
            return derived.memo(trace, key, lambda: _launch_rows(trace, activity["correlation"]))
    out = _launch_rows(trace, activity["correlation"])
    out.flags.writeable = False
    return out


def api_column(trace: Trace, api_rows: np.ndarray, column: str) -> np.ndarray:
    """``trace.api[column]`` at ``api_rows`` (from :func:`launch_index`); -1 where a row is -1."""
    out = np.full(len(api_rows), -1, dtype=np.int64)
    ok = api_rows >= 0
    out[ok] = trace.api[column][api_rows[ok]]
    return out


def gpu_ops_column(trace: Trace, column: str) -> np.ndarray:
    """``column`` of every GPU op, kernels then memops: the row order of all GPU-op arrays.
    Read-only; computed once per trace."""
    return derived.memo(trace, f"gpu_ops_column:{column}",
                        lambda: np.concatenate([trace.kernels[column], trace.memops[column]]))


def gpu_ops_times(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every GPU op (the order of :func:`gpu_ops_column`) as int64 ns.
    Read-only; computed once per trace."""
    return derived.memo(trace, "gpu_ops_times", lambda: (gpu_ops_column(trace, "start_ns").astype(np.int64),
                                                         gpu_ops_column(trace, "end_ns").astype(np.int64)))


def gpu_ops_order(trace: Trace) -> np.ndarray:
    """Every GPU op's row (the order of :func:`gpu_ops_column`) by start time, stable.
    Read-only; computed once per trace."""
    return derived.memo(trace, "gpu_ops_order", lambda: np.argsort(gpu_ops_times(trace)[0], kind="stable"))


def gpu_ops_launch_times(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every GPU op's launch call (:func:`gpu_ops_launch_index`), -1 where
    unknown. Read-only; computed once per trace."""
    def compute() -> tuple[np.ndarray, np.ndarray]:
        rows = gpu_ops_launch_index(trace)
        return api_column(trace, rows, "start_ns"), api_column(trace, rows, "end_ns")

    return derived.memo(trace, "gpu_ops_launch_times", compute)


def gpu_busy(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The merged busy periods of every GPU op (:func:`intervals.union` of :func:`gpu_ops_times`):
    sorted disjoint ``(starts, ends)``. Read-only; computed once per trace."""
    def compute() -> tuple[np.ndarray, np.ndarray]:
        starts, ends = gpu_ops_times(trace)
        order = gpu_ops_order(trace)   # the order union's own stable sort would give
        return intervals.union(starts[order], ends[order])

    return derived.memo(trace, "gpu_busy", compute)


def gpu_ops_launch_index(trace: Trace) -> np.ndarray:
    """:func:`launch_index` of every GPU op, kernels then memops. Read-only; computed once per
    trace."""
    return derived.memo(trace, "gpu_ops_launch_index",
                        lambda: np.concatenate([launch_index(trace, trace.kernels),
                                                launch_index(trace, trace.memops)]))


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
