"""The critical path of a window over CPU and GPU, and which bound dominates it.

Model
-----
Walk backwards from the GPU op that ends last in the window, asking of each event what it was
waiting for when it started:

* a **GPU op** (kernel or memop) is ready at the latest of: the end of the previous op on its
  stream, the end of the latest op of another stream of the same device that ended before it
  started (a cross-stream dependency such as an event wait, inferred from timing since traces do
  not record events), and the start of its own launch call (the host began submitting it). If
  the launch call is the latest, the path jumps to the CPU (the GPU waited for the host);
  otherwise it stays on the GPU (the launch call's own duration counts as ``launch``). An op that
  starts more than ``WAIT_NS`` after it was ready (after its launch call returned, when the
  launch was the last thing it needed) waited for something the trace does not show (an event recorded by work outside the trace,
  another process, a stream wait): that stretch is ``wait``.
* a **CPU API call** (launch, copy, synchronisation) starts after the API call that ended last
  before it, on any thread of the process (the host read as one sequence, so the path follows
  autograd's backward thread back into the forward thread); the time between them is host work
  (framework, Python). A synchronisation call
  (``*Synchronize``, blocking ``cudaMemcpy``, ``hipMemcpyWithStream``) that ended after a GPU op
  finished inside it was waiting for that op, and so was any call longer than ``WAIT_NS`` that
  returned within ``WAIT_NS`` of a GPU op's end (a pageable ``cudaMemcpyAsync``, a launch call
  blocked by a full launch queue): the path jumps back to the GPU there.

Each step of the walk labels the stretch of time it covers, so the labels tile the path from its
start to its end: ``gpu`` (kernel/memop time and device-side waits between dependent ops),
``communication`` (the taxonomy's communication category), ``launch`` (a GPU op waiting for the
launch call that submitted it), ``host`` (CPU time between API calls, and API calls that are
not launches or syncs), ``sync`` (a host wait that outlasted the GPU work it waited for) and
``wait`` (a submitted op that waited for an unrecorded dependency). The
**dominant bound** is the label with the most time.

Limits: dependencies are inferred from timing and stream order (events, host-side Python and
other processes are not in the trace); ops without a launch call stay on the GPU chain; the walk
visits at most one node per event, so its cost is linear in the window's events — callers pass a
step-sized window on big traces.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from ..trace import Trace, factorize
from .categories import Classification
from .links import gpu_ops_column, gpu_ops_launch_index, gpu_ops_times

LABELS = ("gpu", "communication", "launch", "host", "sync", "wait")
WAIT_NS = 20_000  # a ready op that starts later than this waited for something the trace does not show
SYNC_API = re.compile(r"Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cuMemcpy[DH]to[DH]$|^hipMemcpy$|"
                      r"^hipMemcpyWithStream$|^hipStreamSynchronize|^hipDeviceSynchronize", re.IGNORECASE)
COMM_NAMES = ("communication",)


@dataclass(frozen=True)
class CriticalPath:
    start_ns: int
    end_ns: int
    by_label: tuple[tuple[str, int], ...]   # (label, ns) for every label, in LABELS order
    gpu_ops_on_path: int
    cpu_calls_on_path: int

    @property
    def span_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def dominant(self) -> str | None:
        nonzero = [(ns, label) for label, ns in self.by_label if ns > 0]
        return max(nonzero)[1] if nonzero else None

    def share(self, label: str) -> float | None:
        total = sum(ns for _, ns in self.by_label)
        return None if total == 0 else dict(self.by_label)[label] / total


def _prev_in_group(keys: np.ndarray, order_key: np.ndarray) -> np.ndarray:
    """For each row, the row before it in its group (same key) by ``order_key``; -1 for the first."""
    order = np.lexsort((order_key, keys))
    prev = np.full(len(keys), -1, dtype=np.int64)
    same = keys[order][1:] == keys[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _last_per_group(keys: np.ndarray, vals: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per distinct key, the row with the largest ``(val, row)``; ``rows`` ascending. O(n), no sort of n."""
    if rows.size == 0:
        return rows
    uk = np.unique(keys)
    kid = np.searchsorted(uk, keys)
    best = np.full(uk.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(best, kid, vals)
    top = vals == best[kid]
    last = np.full(uk.size, -1, dtype=np.int64)
    np.maximum.at(last, kid[top], rows[top])
    return last


def _reachable_gpu_rows(g_start, g_end, g_dev, stream_key, lo: int) -> np.ndarray:
    """The GPU-op rows a walk down to ``lo`` can read, ascending: every op that starts or ends at or
    after ``lo``, and, for the ops the walk visits (they start after ``lo``), the one stream
    predecessor and the one latest-ending op per device that lie wholly before ``lo`` (the op of
    its stream with the largest ``(start, row)`` before ``lo``; the op of its device with the
    largest ``(end, row)`` before ``lo``). Taken in row order, the lookups of the walk give the same
    rows on this subset as on the whole table, at the cost of one pass over it instead of sorts."""
    near = (g_start >= lo) | (g_end >= lo)
    if near.all():
        return np.arange(g_start.size)
    before_s = np.flatnonzero(g_start < lo)
    before_e = np.flatnonzero(g_end < lo)
    extra = np.concatenate([_last_per_group(stream_key[before_s], g_start[before_s], before_s),
                            _last_per_group(g_dev[before_e], g_end[before_e], before_e)])
    near[extra[extra >= 0]] = True
    return np.flatnonzero(near)


def critical_path(trace: Trace, cls: Classification, window: tuple[int, int] | None = None) -> CriticalPath | None:
    """The critical path of ``window`` (default: the whole trace), or None without GPU ops.

    Cost: one pass over the trace's columns to find the rows a walk of the window can reach
    (:func:`_reachable_gpu_rows`, and likewise for API calls), then sorts and the walk over
    those rows only, so a step-sized window of a million-op trace costs about what the step does."""
    g_start, g_end = gpu_ops_times(trace)   # shared, read-only: only indexed below
    if g_start.size == 0:
        return None
    g_dev = gpu_ops_column(trace, "device").astype(np.int64)
    g_stream = gpu_ops_column(trace, "stream").astype(np.int64)
    lo, hi = window if window is not None else (int(g_start.min()), int(g_end.max()))
    inside_all = (g_start >= lo) & (g_end <= hi) & (g_end >= g_start)
    if not inside_all.any():
        return None
    comm = {i for i, n in enumerate(cls.taxonomy.categories) if n in COMM_NAMES}
    stream_key = g_dev * (1 << 40) + (g_stream & ((1 << 40) - 1))
    g_launch_all = gpu_ops_launch_index(trace)
    a = trace.api
    launched = np.zeros(len(a), dtype=bool)   # API calls that launched a GPU op (any op, in the window or not)
    launched[g_launch_all[g_launch_all >= 0]] = True

    # From here on, only the rows the walk can reach (row order kept, so ties resolve as on the whole table).
    rows = _reachable_gpu_rows(g_start, g_end, g_dev, stream_key, lo)
    g_start, g_end, g_dev, stream_key = g_start[rows], g_end[rows], g_dev[rows], stream_key[rows]
    g_cat = np.concatenate([cls.kernel_category, cls.memop_category])[rows].astype(np.int64)
    inside = inside_all[rows]
    a_end_all = a["end_ns"].astype(np.int64)
    g_launch = g_launch_all[rows]
    # API calls: those ending at or after lo, the one ending last before lo (the walk's host lookup
    # may land there), and the launch calls of the rows kept (read for their times only).
    a_near = a_end_all >= lo
    before = np.flatnonzero(~a_near)
    if before.size:
        a_near[_last_per_group(np.zeros(before.size, dtype=np.int64), a_end_all[before], before)] = True
    a_near[g_launch[g_launch >= 0]] = True
    a_rows = np.flatnonzero(a_near)
    g_launch = np.where(g_launch >= 0, np.searchsorted(a_rows, g_launch), -1)
    a_start, a_end = a["start_ns"][a_rows].astype(np.int64), a_end_all[a_rows]
    launches = launched[a_rows]
    a_names = a["name"][a_rows]

    # Previous op on the same (device, stream), and per device the op with the latest end before
    # a given time (ends sorted per device).
    stream_prev = _prev_in_group(stream_key, g_start)
    by_end = np.lexsort((g_end, g_dev))
    dev_sorted, end_sorted = g_dev[by_end], g_end[by_end]

    a_by_end = np.argsort(a_end, kind="stable")
    a_by_end_l, a_ends_l = a_by_end.tolist(), a_end[a_by_end].tolist()
    uniq, inv = factorize(a_names) if len(a_names) else (np.zeros(0, int), np.zeros(0, int))
    sync_name = np.array([c >= 0 and bool(SYNC_API.search(trace.strings[c])) for c in uniq], dtype=bool)
    a_sync = sync_name[inv] if len(a_names) else np.zeros(0, dtype=bool)

    # Scalar lookups in the walk: Python lists and bisect (numpy's per-call cost dominates there).
    by_end_l, end_sorted_l = by_end.tolist(), end_sorted.tolist()
    dev_bounds = {int(d): (int(np.searchsorted(dev_sorted, d, side="left")), int(np.searchsorted(dev_sorted, d, side="right")))
                  for d in np.unique(dev_sorted)}

    def latest_gpu_end_before(dev: int, t: int) -> int:
        """Row of the op on ``dev`` with the latest end <= t, or -1."""
        lo_i, hi_i = dev_bounds.get(dev, (0, 0))
        j = bisect_right(end_sorted_l, t, lo_i, hi_i) - 1
        return by_end_l[j] if j >= lo_i else -1

    in_rows = np.flatnonzero(inside)
    in_by_end = in_rows[np.argsort(g_end[in_rows], kind="stable")]
    in_by_end_l, in_ends_l = in_by_end.tolist(), g_end[in_by_end].tolist()

    def latest_gpu_end_any(t0: int, t1: int) -> int:
        """Row of the op of any device with the latest end in [t0, t1], or -1."""
        j = bisect_right(in_ends_l, t1) - 1
        return in_by_end_l[j] if j >= 0 and in_ends_l[j] >= t0 else -1

    g_start_l, g_end_l, g_dev_l = g_start.tolist(), g_end.tolist(), g_dev.tolist()
    g_cat_l, g_launch_l, stream_prev_l = g_cat.tolist(), g_launch.tolist(), stream_prev.tolist()
    a_start_l, a_end_l, a_sync_l, launches_l = a_start.tolist(), a_end.tolist(), a_sync.tolist(), launches.tolist()
    totals = dict.fromkeys(LABELS, 0)
    cand = np.flatnonzero(inside)
    node, on_gpu = int(cand[np.argmax(g_end[cand])]), True
    t = int(g_end[node])
    end_ns = t
    gpu_nodes = cpu_nodes = 0
    seen_gpu, seen_cpu = set(), set()
    while True:
        if on_gpu:
            if node in seen_gpu:
                break
            seen_gpu.add(node)
            gpu_nodes += 1
            s = max(g_start_l[node], lo)
            totals["communication" if g_cat_l[node] in comm else "gpu"] += max(0, t - s)
            t = s
            if s <= lo:
                break
            sp = stream_prev_l[node]
            ready_stream = g_end_l[sp] if sp >= 0 and g_end_l[sp] <= s else -1
            xs = latest_gpu_end_before(g_dev_l[node], s)
            ready_cross = g_end_l[xs] if xs >= 0 and xs != node else -1
            la = g_launch_l[node]
            # The op exists from its launch call's start (a blocking copy's op may wait inside
            # its own call for the stream).
            ready_launch = a_start_l[la] if la >= 0 and a_start_l[la] <= s else -1
            best = max(ready_stream, ready_cross, ready_launch)
            if best < 0:
                break
            waited = "wait" if s - best > WAIT_NS else None
            if best == ready_launch:
                # The host was submitting until the call returned; an op that starts long after
                # that waited for something else.
                submitted = min(a_end_l[la], s)
                after = s - submitted
                totals["wait" if after > WAIT_NS else "launch"] += after
                totals["launch"] += submitted - ready_launch
                t, node, on_gpu = ready_launch, la, False
                continue
            prev = sp if best == ready_stream else xs
            totals[waited or ("communication" if g_cat_l[prev] in comm else "gpu")] += s - best
            t, node = best, prev
        else:
            if node in seen_cpu:
                break
            seen_cpu.add(node)
            cpu_nodes += 1
            s = max(a_start_l[node], lo)
            if s < t:
                totals["host" if not launches_l[node] else "launch"] += t - s
                t = s
            if s <= lo:
                break
            # The host call that ended last before this one started, on any thread: the host is
            # read as one sequence, so a thread that starts work when another finishes (autograd's
            # backward thread after the forward) continues the path on that other thread.
            j = bisect_right(a_ends_l, t) - 1
            while j >= 0 and a_by_end_l[j] == node:
                j -= 1
            if j < 0:
                break
            q = a_by_end_l[j]
            end_q = max(a_end_l[q], lo)
            totals["host"] += t - end_q
            t = end_q
            if t <= lo:
                break
            if a_sync_l[q] or a_end_l[q] - a_start_l[q] > WAIT_NS:
                # A synchronising call, or a long call that returned right after GPU work ended
                # (a pageable copy, a full launch queue): the host waited for the GPU.
                waited = latest_gpu_end_any(a_start_l[q], t)
                if waited >= 0 and (a_sync_l[q] or t - g_end_l[waited] <= WAIT_NS):
                    totals["sync"] += t - g_end_l[waited]
                    t, node, on_gpu = g_end_l[waited], waited, True
                    continue
            node = q
    return CriticalPath(max(t, lo), end_ns, tuple((lab, int(totals[lab])) for lab in LABELS), gpu_nodes, cpu_nodes)


MAX_EVENTS = 50_000  # above this many GPU ops + API calls (and with steps), the path is taken over one step


def step_critical_path(trace: Trace, cls: Classification, phases) -> tuple[CriticalPath | None, str]:
    """The critical path over the whole trace when it is small, else over its median step (by GPU
    span) of the phases; a step or trace still above :data:`MAX_EVENTS` GPU ops is walked over its
    last :data:`MAX_EVENTS` GPU ops only (the walk starts from the last op, so the tail is the part it
    reaches first): the cost stays bounded on million-kernel traces. Returns the path and the scope
    it covers in words."""
    n = len(trace.kernels) + len(trace.memops) + len(trace.api)
    if n <= MAX_EVENTS:
        return critical_path(trace, cls), "the whole trace"
    with_gpu = [p for p in phases.phases if p.gpu_span_ns] if phases.phases else []
    if len(with_gpu) > 1:
        ordered = sorted(with_gpu, key=lambda p: p.gpu_span_ns)
        mid = ordered[len(ordered) // 2]
        if mid.kernel_count + mid.memop_count <= MAX_EVENTS:
            return critical_path(trace, cls, (mid.gpu_start_ns, mid.gpu_end_ns)), f"the median step ({mid.name})"
        lo, hi = mid.gpu_start_ns, mid.gpu_end_ns
        what = f"the median step ({mid.name}), its last {MAX_EVENTS:,} GPU ops"
    else:
        lo, hi, what = None, None, f"the last {MAX_EVENTS:,} GPU ops of the trace (no steps to narrow it to)"
    ends = np.concatenate([trace.kernels["end_ns"], trace.memops["end_ns"]]).astype(np.int64)
    starts = np.concatenate([trace.kernels["start_ns"], trace.memops["start_ns"]]).astype(np.int64)
    inside = np.ones(ends.size, dtype=bool) if lo is None else (starts >= lo) & (ends <= hi)
    e = ends[inside]
    if e.size <= MAX_EVENTS:
        return critical_path(trace, cls, (lo, hi) if lo is not None else None), what
    cut = int(np.partition(e, e.size - MAX_EVENTS)[e.size - MAX_EVENTS])   # the MAX_EVENTS-th latest end
    return critical_path(trace, cls, (cut, int(e.max()))), what
