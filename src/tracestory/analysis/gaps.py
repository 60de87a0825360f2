"""GPU idle gaps and what the host was doing while the GPU waited.

Gaps: the idle intervals between the merged busy periods of every GPU op (kernels and memops,
the timeline's model); :func:`gap_causes` keeps the longest ones.

The op after a gap is the kernel starting at the gap's end (a memop when no kernel starts
there); its launch call (``links.launch_index``) names the host thread that submitted it.

**Cause** (``GapCause.op_name``): what that thread was doing during the gap. The host's part
of a gap ``[g0, g1)`` is the window ``[g0, min(g1, launch end))``: once the launch call has
returned, the host no longer holds the op back. The candidates are the thread's CPU intervals
(``trace.ops`` and the CPU-side ``trace.ranges``: ``record_function`` / NVTX ranges) that
overlap the window: those that begin inside it and the nesting chain that encloses its start
(:mod:`.nesting`). **Containers** are left out: an interval that encloses the whole step the
gap falls in (the phase of :mod:`.phases` whose CPU range holds ``g0``; the whole trace when
none does), such as ``ProfilerStep#N`` itself or a ``main`` wrapping everything, holds the
gap as it holds everything else and explains nothing. The cause is the innermost (shortest)
candidate that covers at least half the window (``MIN_COVER``). Two disjoint intervals cannot
both cover more than half, so at each nesting level this is the one with the longest overlap;
among a chain (``aten::conv2d`` > ``aten::convolution`` > ``aten::cudnn_convolution``) the
wrappers cover a hair more than the op inside them, and the innermost is the one that says
what ran. With no candidate covering half, the host ran many short things: no single cause.
So a gap during which the main thread sat in ``enumerate(DataLoader)#...__next__`` inside ``ProfilerStep#7`` names the DataLoader,
and a gap spent inside ``aten::_cudnn_attention_forward`` (plan building) names that op.

**Within** (``GapCause.within``): the innermost interval of the same thread that encloses the
launch call and lasts at least half the gap: where the host was when it finally submitted the
op (the container a sentence may quote, e.g. ``ProfilerStep#7``; it may equal the cause).

No cause when the launch call is unknown, or when it ended before the gap began: the op had
been submitted and the GPU waited on something else (a dependency between streams, an event).

Vectorised: the intervals are nested once (sort + ``searchsorted`` per nesting level); the
intervals beginning inside each window are a slice of the thread's start-sorted block (gaps are
disjoint, so the slices add up to at most every interval once); the best candidate per gap is
one ``lexsort``. Loops run over nesting levels and over the threads that launched the ops.

Limits: an interval that overlaps a sibling instead of nesting may be missed from the chain
(:mod:`.nesting` moves it up to an enclosing interval); the window ends at the launch call's
end, so CPU work after the launch that delays the GPU another way (a later synchronisation)
is not seen; a host thread other than the launching one (a DataLoader worker process) is not
looked at: what the launching thread waited on is named, e.g. ``__next__``, not the worker.
"""

from __future__ import annotations


import msgspec
import numpy as np

from ..trace import Trace
from .links import gpu_busy, launch_index
from .loops import cpu_intervals
from .nesting import nest_intervals, thread_codes
from .phases import Phases
from .phases import phases as compute_phases

STALL_MIN_NS = 1_000_000
MIN_COVER = 0.5  # the cause must cover at least this share of the host's part of the gap


class GapCause(msgspec.Struct, frozen=True):
    start_ns: int
    dur_ns: int
    launch_wait_ns: int          # part of the gap before the next op's launch call returned
    after: str                   # GPU op that ended the gap
    op_name: str | None          # the cause: CPU op/range the launching thread ran during the gap
    op_dur_ns: int | None        # its whole duration
    op_overlap_ns: int | None = None  # how much of the host window it covers
    within: str | None = None    # innermost CPU op/range enclosing the launch call (>= half the gap)
    within_dur_ns: int | None = None
    step: str | None = None      # the phase whose CPU range holds the gap's start


def _next_ops(trace: Trace, b: np.ndarray):
    """Launch row and name of the GPU op starting at each gap end (kernel first, else memop)."""
    li = np.full(b.size, -1, dtype=np.int64)
    name = np.full(b.size, -1, dtype=np.int64)
    found = np.zeros(b.size, dtype=bool)
    for table in (trace.kernels, trace.memops):
        if not len(table):
            continue
        order = np.argsort(table["start_ns"], kind="stable")
        s = table["start_ns"][order]
        j = np.minimum(np.searchsorted(s, b, side="left"), s.size - 1)
        hit = ~found & (s[j] == b)
        rows = order[j[hit]]
        li[hit] = launch_index(trace, table)[rows]
        name[hit] = table["name"][rows]
        found |= hit
    return li, name, found


def _chain(parent: np.ndarray, first: np.ndarray):
    """(query, interval) pairs for each query's interval and all its ancestors."""
    q, row = np.flatnonzero(first >= 0), first[first >= 0]
    qs, rows = [], []
    while q.size:
        qs.append(q)
        rows.append(row)
        row = parent[row]
        q, row = q[row >= 0], row[row >= 0]
    if not qs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(qs), np.concatenate(rows)


def _begin_inside(nest, w0: np.ndarray, w1: np.ndarray, q_thread: np.ndarray):
    """(query, interval) pairs for intervals of the query's thread beginning in ``(w0, w1)``."""
    row_thread = nest.key_start // nest.span  # rows are thread-major, start-sorted within a thread
    qs, rows = [], []
    for th in np.unique(q_thread):
        q = np.flatnonzero(q_thread == th)
        lo_t, hi_t = np.searchsorted(row_thread, [th, th + 1])
        s = nest.start[lo_t:hi_t]
        lo = np.searchsorted(s, w0[q], side="right") + lo_t
        hi = np.maximum(np.searchsorted(s, w1[q], side="left") + lo_t, lo)
        n = hi - lo
        if n.sum() == 0:
            continue
        rep = np.repeat(np.arange(q.size), n)
        offset = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        qs.append(q[rep])
        rows.append(lo[rep] + offset)
    if not qs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(qs), np.concatenate(rows)


def _steps_of(steps: Phases, w0: np.ndarray, whole: tuple[int, int]):
    """Per window start: the CPU range (lo, hi) and name of the phase holding it, else the whole trace."""
    ps = sorted(steps.phases, key=lambda p: p.start_ns)
    lo = np.full(w0.size, whole[0], dtype=np.int64)
    hi = np.full(w0.size, whole[1], dtype=np.int64)
    names: list[str | None] = [None] * w0.size
    if ps:
        p0 = np.array([p.start_ns for p in ps], dtype=np.int64)
        p1 = np.array([p.end_ns for p in ps], dtype=np.int64)
        j = np.searchsorted(p0, w0, side="right") - 1
        ok = (j >= 0) & (w0 < p1[np.maximum(j, 0)])
        lo[ok], hi[ok] = p0[j[ok]], p1[j[ok]]
        for i in np.flatnonzero(ok):
            names[i] = ps[int(j[i])].name
    return lo, hi, names


def gap_causes(trace: Trace, *, min_ns: int = STALL_MIN_NS, limit: int = 50,
               steps: Phases | None = None) -> tuple[GapCause, ...]:
    """The longest idle gaps (>= ``min_ns``, at most ``limit``, longest first), each with what
    the launching host thread did during it (see the module docstring). ``steps``: the trace's
    phases when already computed."""
    busy_s, busy_e = gpu_busy(trace)
    g0, g1 = busy_e[:-1], busy_s[1:]   # intervals.gaps of every GPU op
    dur = g1 - g0
    keep = np.flatnonzero(dur >= min_ns)
    keep = keep[np.argsort(-dur[keep], kind="stable")][:limit]
    if keep.size == 0:
        return ()
    a, b = g0[keep].astype(np.int64), g1[keep].astype(np.int64)
    n = a.size
    li, after_code, found = _next_ops(trace, b)
    api = trace.api
    known = li >= 0
    lc = np.maximum(li, 0)
    ls = np.where(known, api["start_ns"][lc] if len(api) else 0, 0).astype(np.int64)
    le = np.where(known, api["end_ns"][lc] if len(api) else 0, 0).astype(np.int64)
    l_pid = np.where(known, api["pid"][lc] if len(api) else -1, -1).astype(np.int64)
    l_tid = np.where(known, api["tid"][lc] if len(api) else -1, -1).astype(np.int64)
    wait = np.where(known, np.clip(le - a, 0, b - a), 0)
    w0, w1 = a, np.minimum(b, le)
    host = known & (le > a)

    c_start, c_end, c_name, c_pid, c_tid = cpu_intervals(trace)
    cause = np.full(n, -1, dtype=np.int64)
    overlap_of = np.zeros(n, dtype=np.int64)
    within = np.full(n, -1, dtype=np.int64)
    step_names: list[str | None] = [None] * n
    if c_start.size and known.any():
        if steps is None:
            steps = compute_phases(trace)
        # busy_s[0] and busy_e[-1]: the first start and the last end of every GPU op
        whole = (int(min(c_start.min(), busy_s[0])), int(max(c_end.max(), busy_e[-1])))
        st_lo, st_hi, step_names = _steps_of(steps, w0, whole)
        th_cpu, th_q = thread_codes(c_pid, c_tid, (l_pid, l_tid))
        nest, inner = nest_intervals(c_start, c_end, th_cpu, np.concatenate([w0, ls]),
                                     np.concatenate([th_q, th_q]), np.arange(c_start.size))
        inner_w0, inner_ls = inner[:n], inner[n:]
        inner_w0[~host] = -1
        # candidates: the chain enclosing the window's start, and intervals beginning inside it
        q1, r1 = _chain(nest.parent, inner_w0)
        hq = np.flatnonzero(host)
        q2, r2 = _begin_inside(nest, w0[hq], w1[hq], th_q[hq])
        q = np.concatenate([q1, hq[q2]])
        rows = np.concatenate([r1, r2])
        ov = np.minimum(nest.end[rows], w1[q]) - np.maximum(nest.start[rows], w0[q])
        d = nest.end[rows] - nest.start[rows]
        container = (nest.start[rows] <= st_lo[q]) & (nest.end[rows] >= st_hi[q])
        ok = (ov > 0) & ~container
        q, rows, ov, d = q[ok], rows[ok], ov[ok], d[ok]
        covers = ov >= MIN_COVER * (w1[q] - w0[q])
        q, rows, ov, d = q[covers], rows[covers], ov[covers], d[covers]
        order = np.lexsort((-ov, d, q))  # the innermost (shortest) of those covering half
        q, rows, ov = q[order], rows[order], ov[order]
        first = np.ones(q.size, dtype=bool)
        first[1:] = q[1:] != q[:-1]
        cause[q[first]] = rows[first]
        overlap_of[q[first]] = ov[first]
        # within: innermost enclosing the launch call, lasting at least half the gap
        inner_ls[~known] = -1
        q3, r3 = _chain(nest.parent, inner_ls)  # innermost first for each query
        good = (nest.end[r3] >= le[q3]) & (nest.end[r3] - nest.start[r3] >= (b[q3] - a[q3]) // 2)
        q3, r3 = q3[good], r3[good]
        order = np.lexsort((nest.end[r3] - nest.start[r3], q3))
        q3, r3 = q3[order], r3[order]
        first = np.ones(q3.size, dtype=bool)
        first[1:] = q3[1:] != q3[:-1]
        within[q3[first]] = r3[first]
    else:
        nest = None

    def name_of(row: int) -> str:
        return trace.name(int(c_name[nest.source_row[row]]))

    out = []
    for i in range(n):
        c, w = int(cause[i]), int(within[i])
        out.append(GapCause(
            start_ns=int(a[i]), dur_ns=int(b[i] - a[i]), launch_wait_ns=int(wait[i]),
            after=trace.name(int(after_code[i])) if found[i] else "",
            op_name=name_of(c) if c >= 0 else None,
            op_dur_ns=int(nest.end[c] - nest.start[c]) if c >= 0 else None,
            op_overlap_ns=int(overlap_of[i]) if c >= 0 else None,
            within=name_of(w) if w >= 0 else None,
            within_dur_ns=int(nest.end[w] - nest.start[w]) if w >= 0 else None,
            step=step_names[i],
        ))
    return tuple(out)
