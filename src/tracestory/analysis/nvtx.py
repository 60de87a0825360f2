"""NVTX (and record_function) ranges as a tree, with the GPU time of the work launched inside.

Model
-----
CPU-side rows of ``trace.ranges`` nest per thread (``depth``, 0 = outermost, filled by the
loaders). A GPU op (kernel or memop) belongs to a range when its launch call (the ``api`` row
with the same correlation id) starts inside ``[start_ns, end_ns)`` of the range on the same
thread. Membership is inclusive: an op launched in a child also belongs to every ancestor.

For each range:

* ``cpu_ns = end_ns - start_ns``;
* ``gpu_time_ns``: the plain sum of the durations of its GPU ops (concurrent ops each count);
* ``gpu_busy_ns``: the length of the union of their intervals (wall time the GPU spent on them);
* ``gpu_start_ns``/``gpu_end_ns``: first start and last end of those ops (``None`` when none).

Vectorized: ranges of one (thread, depth) are disjoint when properly nested, so each op finds
its range at that level with one ``searchsorted``; the loops run over threads x depths, not
over events. Unions per range are one sort and a grouped running maximum.

Limits: start/end ranges (NVTX 60) that overlap without nesting are given the latest-starting
range of their level. GPU ops without a known launch (no matching api row) belong to no range
and are counted in ``unattributed_*``. A summary-only trace (``has_timeline`` False) has no
launch times: every op is unattributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import CPU_SIDE, Trace
from .links import launch_index


@dataclass(frozen=True)
class RangeNode:
    name: str
    domain: str
    row: int                  # row of trace.ranges
    start_ns: int
    end_ns: int
    cpu_ns: int
    depth: int
    tid: int | None
    gpu_time_ns: int          # sum of durations of GPU ops launched inside (children included)
    gpu_busy_ns: int          # union of those ops' intervals
    kernel_count: int
    memop_count: int
    gpu_start_ns: int | None
    gpu_end_ns: int | None
    children: tuple[RangeNode, ...]


@dataclass(frozen=True)
class RangeStat:
    """All instances of one range name (a name nested under itself counts its time twice)."""

    name: str
    count: int
    cpu_ns: int
    gpu_time_ns: int
    gpu_busy_ns: int
    kernel_count: int


@dataclass(frozen=True)
class RangeTree:
    roots: tuple[RangeNode, ...]
    range_count: int
    gpu_op_count: int              # kernels + memops in the trace
    unattributed_op_count: int     # launched outside every range (or launch unknown)
    unattributed_gpu_time_ns: int
    by_name: tuple[RangeStat, ...]  # by gpu_time_ns desc, then name

    def walk(self):
        """Every node, depth first, parents before children."""
        stack = list(reversed(self.roots))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def _level_index(starts, ends, tids, depths, q_time, q_tid, level_rows) -> np.ndarray:
    """For each query (time, tid): the row among ``level_rows`` (one depth) whose interval holds
    it on the same thread (a range without a thread holds every thread's queries); -1 if none."""
    out = np.full(len(q_time), -1, np.int64)
    for tid in np.unique(tids[level_rows]):
        rows = level_rows[tids[level_rows] == tid]
        rows = rows[np.argsort(starts[rows], kind="stable")]
        q = np.flatnonzero((q_tid == tid) | (tid < 0)) if tid >= 0 else np.arange(len(q_time))
        if len(q) == 0:
            continue
        pos = np.searchsorted(starts[rows], q_time[q], side="right") - 1
        ok = pos >= 0
        cand = rows[np.maximum(pos, 0)]
        ok &= (q_time[q] < ends[cand]) & (q_time[q] >= 0)
        out[q[ok]] = cand[ok]
    return out


def _grouped_union(group: np.ndarray, s: np.ndarray, e: np.ndarray, n_groups: int) -> np.ndarray:
    """Union length of the intervals of each group."""
    out = np.zeros(n_groups, np.int64)
    if len(group) == 0:
        return out
    order = np.lexsort((s, group))
    g, s, e = group[order], s[order], e[order]
    lo = int(s.min())
    span = int(e.max()) - lo + 1
    if span * (n_groups + 1) < (1 << 62):
        off = g.astype(np.int64) * span - lo
        run = np.maximum.accumulate(e + off) - off
    else:  # huge clock values and many groups: one group at a time
        run = np.empty_like(e)
        bounds = np.flatnonzero(np.diff(g)) + 1
        for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(g)]):
            run[a:b] = np.maximum.accumulate(e[a:b])
    prev = np.empty_like(run)
    prev[1:] = run[:-1]
    first = np.ones(len(g), bool)
    first[1:] = g[1:] != g[:-1]
    prev[first] = np.iinfo(np.int64).min
    contrib = np.maximum(run - np.maximum(s, prev), 0)
    np.add.at(out, g, contrib)
    return out


def nvtx_tree(trace: Trace) -> RangeTree:
    """The CPU ranges of ``trace`` as a tree, each with the GPU work launched inside it."""
    r = trace.ranges
    rows = np.flatnonzero((r["side"] == CPU_SIDE) & (r["start_ns"] >= 0) & (r["end_ns"] >= r["start_ns"])) if len(r) else np.zeros(0, np.int64)
    starts, ends, tids, depths = (r[c].astype(np.int64) for c in ("start_ns", "end_ns", "tid", "depth")) if len(r) else (np.zeros(0, np.int64),) * 4

    # GPU ops: kernels then memops, with their launch time and thread.
    ops_s, ops_e, is_kernel, l_start, l_tid = [], [], [], [], []
    for table, kernel in ((trace.kernels, True), (trace.memops, False)):
        idx = launch_index(trace, table)
        ok = idx >= 0
        ls = np.full(len(idx), -1, np.int64)
        lt = np.full(len(idx), -1, np.int64)
        ls[ok] = trace.api["start_ns"][idx[ok]]
        lt[ok] = trace.api["tid"][idx[ok]]
        ops_s.append(table["start_ns"]); ops_e.append(table["end_ns"]); l_start.append(ls); l_tid.append(lt)
        is_kernel.append(np.full(len(table), kernel))
    op_s, op_e = np.concatenate(ops_s).astype(np.int64), np.concatenate(ops_e).astype(np.int64)
    q_time, q_tid, kern = np.concatenate(l_start), np.concatenate(l_tid), np.concatenate(is_kernel)
    dur = op_e - op_s
    n_rows = len(r)

    # (range row, op) pairs, one level at a time; parents of ranges the same way.
    pair_r, pair_o = [], []
    parent = np.full(n_rows, -1, np.int64)
    levels = np.unique(depths[rows]) if len(rows) else []
    for d in levels:
        level_rows = rows[depths[rows] == d]
        hit = _level_index(starts, ends, tids, depths, q_time, q_tid, level_rows)
        o = np.flatnonzero(hit >= 0)
        pair_r.append(hit[o]); pair_o.append(o)
        if d > 0:
            child = rows[depths[rows] == d]
            parent_rows = rows[depths[rows] == d - 1]
            parent[child] = _level_index(starts, ends, tids, depths, starts[child], tids[child], parent_rows)
    pr = np.concatenate(pair_r) if pair_r else np.zeros(0, np.int64)
    po = np.concatenate(pair_o) if pair_o else np.zeros(0, np.int64)
    gpu_time = np.bincount(pr, weights=dur[po], minlength=n_rows).astype(np.int64)
    n_kern = np.bincount(pr, weights=kern[po], minlength=n_rows).astype(np.int64)
    n_all = np.bincount(pr, minlength=n_rows).astype(np.int64)
    busy = _grouped_union(pr, op_s[po], op_e[po], n_rows)
    first = np.full(n_rows, np.iinfo(np.int64).max)
    last = np.full(n_rows, -1, np.int64)
    np.minimum.at(first, pr, op_s[po])
    np.maximum.at(last, pr, op_e[po])
    attributed = np.zeros(len(op_s), bool)
    attributed[po] = True

    # Build nodes bottom-up (the tree is the result: one object per range).
    names = trace.names(r["name"]) if n_rows else []
    doms = trace.names(np.maximum(r["domain"], 0)) if n_rows else []
    children: dict[int, list[RangeNode]] = {}
    order = rows[np.lexsort((starts[rows], -depths[rows]))] if len(rows) else rows
    roots: list[RangeNode] = []
    for i in order.tolist():
        kids = sorted(children.pop(i, []), key=lambda n: (n.start_ns, n.row))
        node = RangeNode(
            name=str(names[i]), domain=str(doms[i]) if r["domain"][i] >= 0 else "", row=i,
            start_ns=int(starts[i]), end_ns=int(ends[i]), cpu_ns=int(ends[i] - starts[i]), depth=int(depths[i]),
            tid=int(tids[i]) if tids[i] >= 0 else None, gpu_time_ns=int(gpu_time[i]), gpu_busy_ns=int(busy[i]),
            kernel_count=int(n_kern[i]), memop_count=int(n_all[i] - n_kern[i]),
            gpu_start_ns=int(first[i]) if n_all[i] else None, gpu_end_ns=int(last[i]) if n_all[i] else None,
            children=tuple(kids))
        (children.setdefault(int(parent[i]), []) if parent[i] >= 0 else roots).append(node)
    roots.sort(key=lambda n: (n.start_ns, n.row))

    stats = []
    if len(rows):
        codes = r["name"][rows]
        for code in np.unique(codes).tolist():
            sel = rows[codes == code]
            stats.append(RangeStat(name=trace.name(code), count=len(sel), cpu_ns=int((ends[sel] - starts[sel]).sum()),
                                   gpu_time_ns=int(gpu_time[sel].sum()), gpu_busy_ns=int(busy[sel].sum()),
                                   kernel_count=int(n_kern[sel].sum())))
    stats.sort(key=lambda s: (-s.gpu_time_ns, s.name))
    return RangeTree(roots=tuple(roots), range_count=len(rows), gpu_op_count=len(op_s),
                     unattributed_op_count=int((~attributed).sum()),
                     unattributed_gpu_time_ns=int(dur[~attributed].sum()), by_name=tuple(stats))
