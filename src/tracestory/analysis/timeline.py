"""GPU timeline: busy time as a union of intervals, idle gaps and why the GPU waited.

Model
-----
* GPU ops are every row of ``trace.kernels`` and ``trace.memops`` (all devices, all streams),
  each an interval ``[start_ns, end_ns)``.
* The *window* runs from the first GPU op start to the last GPU op end.
  ``busy_ns`` is the length of the union of all op intervals (overlapping streams count once);
  ``sum_ns`` is the plain sum of durations, so ``sum_ns / busy_ns`` measures stream overlap.
  ``idle_ns = window_ns - busy_ns``: exactly the summed length of the gaps between merged
  busy periods.
* Idle split. For a gap ``[g0, g1)`` let ``L`` be the END time of the API call that launched the
  op starting at ``g1`` (``trace.api["end_ns"]`` through the correlation id). Until ``L`` the GPU
  could not have run that op: the host had not finished submitting it, so that part of the gap
  is CPU/launch-bound. ``launch_wait = clip(L - g0, 0, g1 - g0)``. When several ops start at
  ``g1``, ``L`` is the earliest of their known launch ends. The rest of the gap
  (``idle_other``) is time the op was already submitted but waited: synchronisation, a
  dependency on another stream or event, or queueing. A gap whose next op has no known launch
  call counts entirely as ``idle_other`` (we cannot claim it was launch-bound).
* Launch cost, in two parts, for every op launched directly (a kernel by a kernel-launch call,
  a memcpy/memset by a copy call; :func:`~tracestory.analysis.graphs.launched_directly`, the one
  definition the findings use too; an op replayed from a CUDA/HIP graph would measure the time
  since the graph launch): ``launch_api`` is the launch call's own duration (call end - call
  start: CPU time in the runtime/driver, what launch overhead costs the host) and
  ``launch_queue`` is GPU op start - call end (how long the submitted op waited for the GPU:
  queueing behind earlier GPU work, so large on a busy GPU and no host cost). A negative queue
  time is an op the GPU started before its launch call returned (an idle GPU picks it up
  at once) or clocks aligned imperfectly; it is kept as measured. ``launch_to_start`` (call
  start -> GPU start) is their sum per op, the single number older versions called "launch
  latency"; it mixes host cost with queueing and is kept in the JSON only. :func:`launch_costs`
  gives the per-op values.
* Percentiles are numpy's linear interpolation.

Verdict ``launch_bound``
------------------------
The GPU is called launch-bound when it is idle a material part of the window
(``idle_fraction >= 0.2``) and at least half of that idle time is launch wait
(``idle_launch_wait_ns / idle_ns >= 0.5``): then the host, not the GPU, sets the pace, and the
remedies are the ones for launch overhead (CUDA Graphs, ``torch.compile`` fusion, fewer and
bigger kernels). When the trace has no launch calls to link (so the split is unknown), the
fallback is ``idle_fraction >= 0.2`` with at least half of the kernels shorter than 10 us: a
kernel that short is of the order of the launch overhead itself (a few microseconds per
``cudaLaunchKernel``), so a stream of them cannot keep the GPU fed (the reason CUDA Graphs
exist; NVIDIA CUDA Programming Guide, "CUDA Graphs").

No verdict is built on kernels without a duration: ``zero_duration_kernels`` counts kernels whose
end equals their start (a reader keeps a Kineto kernel without ``dur`` at 0 ns and says so);
when they are at least half of the kernels, their idle "gaps" and "short kernels" are artefacts
of the missing times, and ``launch_bound`` is False with ``verdict_withheld`` saying why.

Limits: one Trace is one process; GPU ops of other processes sharing the GPU are not seen, so
"idle" means idle for this process. Sub-ranges of a kernel (e.g. a persistent kernel waiting
inside) count as busy.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from ..trace import Trace, factorize
from . import intervals
from .graphs import launched_directly
from . import derived
from .links import (
    api_column,
    gpu_busy,
    gpu_ops_column,
    gpu_ops_launch_index,
    gpu_ops_launch_times,
    gpu_ops_order,
    gpu_ops_times,
)

SHORT_KERNEL_NS = 10_000
IDLE_FRACTION_BOUND = 0.2
LAUNCH_WAIT_SHARE_BOUND = 0.5
SHORT_KERNEL_SHARE_BOUND = 0.5
TOP_GAPS = 5

# Gap histogram bins: (label, low_ns inclusive, high_ns exclusive).
GAP_BINS: tuple[tuple[str, int, float], ...] = (
    ("<1us", 0, 1_000),
    ("1-10us", 1_000, 10_000),
    ("10-100us", 10_000, 100_000),
    ("100us-1ms", 100_000, 1_000_000),
    (">=1ms", 1_000_000, float("inf")),
)


class Distribution(msgspec.Struct, frozen=True):
    """Summary of nanosecond values; every statistic is ``None`` when ``count`` is 0."""

    count: int
    mean_ns: float | None
    p50_ns: float | None
    p90_ns: float | None
    p99_ns: float | None
    min_ns: int | None
    max_ns: int | None


class Gap(msgspec.Struct, frozen=True):
    start_ns: int
    dur_ns: int
    before: str  # name of the GPU op that ended the busy period
    after: str  # name of the GPU op that starts after the gap
    launch_wait_ns: int  # part of the gap before the next op's launch call had returned


class StreamStat(msgspec.Struct, frozen=True):
    device: int
    stream: int
    busy_ns: int  # union of this stream's op intervals
    op_count: int


@dataclass(frozen=True)
class Timeline:
    start_ns: int
    end_ns: int
    window_ns: int  # first GPU op start -> last GPU op end
    busy_ns: int  # union of all kernel + memop intervals across streams/devices
    sum_ns: int  # plain sum of durations (> busy_ns when streams overlap)
    idle_ns: int  # window_ns - busy_ns
    idle_fraction: float
    gap_count: int
    idle_launch_wait_ns: int  # idle time where the next GPU op had not been launched yet
    idle_other_ns: int  # idle_ns - idle_launch_wait_ns (sync, dependencies, queueing)
    launch_api: Distribution  # launch call end - start (CPU time of the call), ops launched one by one
    launch_queue: Distribution  # GPU op start - launch call end (waiting for the GPU), same ops
    launch_to_start: Distribution  # launch call start -> GPU op start (api + queue), same ops
    kernels_per_ms: float | None  # kernel count / window in ms; None for a zero window
    short_kernel_share: float | None  # share of kernels shorter than short_kernel_ns; None: no kernels
    short_kernel_ns: int
    gap_histogram: tuple[tuple[str, int, int], ...]  # (label, count, total_ns) per GAP_BINS
    largest_gaps: tuple[Gap, ...]  # top 5 by duration, longest first
    streams: tuple[StreamStat, ...]  # ordered by (device, stream)
    launch_bound: bool  # see the module docstring
    zero_duration_kernels: int = 0  # kernels with end == start (no duration known, or a 0-ns record)
    verdict_withheld: str | None = None  # why launch_bound was not judged (None: judged)
    launch_queue_negative: int = 0  # ops of launch_queue the GPU started before their call returned


def distribution(values: np.ndarray) -> Distribution:
    """Count, mean, p50/p90/p99 (linear interpolation), min and max of ns values."""
    v = np.asarray(values, dtype=np.int64)
    if v.size == 0:
        return Distribution(0, None, None, None, None, None, None)
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return Distribution(
        count=int(v.size),
        mean_ns=float(v.mean()),
        p50_ns=float(p50),
        p90_ns=float(p90),
        p99_ns=float(p99),
        min_ns=int(v.min()),
        max_ns=int(v.max()),
    )


def _longest(g0: np.ndarray, gdur: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` longest gaps, longest first, ties by earlier start: the first ``k`` of
    ``np.lexsort((g0, -gdur))``, sorting only the gaps at least as long as the k-th longest."""
    if gdur.size > 4 * k:
        kth = np.partition(gdur, gdur.size - k)[gdur.size - k]
        cand = np.flatnonzero(gdur >= kth)
        return cand[np.lexsort((g0[cand], -gdur[cand]))][:k]
    return np.lexsort((g0, -gdur))[:k]


def _stream_stats(device: np.ndarray, stream: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  by_start: np.ndarray | None = None) -> tuple[StreamStat, ...]:
    # One union per (device, stream); the number of streams is small, the work per stream is
    # vectorized. The pair is factorized into one integer key (a 2-D np.unique is far slower).
    # ``by_start``: the rows in start order (stable), so that each stream's rows come in start
    # order and its union needs no sort of its own.
    devs, dev_i = factorize(device)
    sts, st_i = factorize(stream)
    key = dev_i.reshape(-1).astype(np.int64) * len(sts) + st_i.reshape(-1)
    if len(devs) * len(sts) < 2**15:
        key = key.astype(np.int16)   # a stable sort of 16-bit keys is a radix sort
    base = np.arange(key.size) if by_start is None else by_start
    order = base[np.argsort(key[base], kind="stable")]
    key_sorted = key[order]
    cut = np.flatnonzero(np.diff(key_sorted)) + 1
    bounds = np.concatenate([[0], cut, [key.size]])
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rows = order[lo:hi]
        g = int(key_sorted[lo])
        out.append(StreamStat(device=int(devs[g // len(sts)]), stream=int(sts[g % len(sts)]),
                              busy_ns=intervals.union_length(starts[rows], ends[rows]),
                              op_count=int(rows.size)))
    return tuple(out)


def gap_attribution(g0: np.ndarray, g1: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                    launch_end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each idle gap ``[g0, g1)`` between busy periods of the GPU ops ``starts``/``ends``
    (``launch_end``: the end of each op's launch call, -1 when unknown): the op before the gap,
    the op after it, and the gap's launch wait in ns (from the gap's start to the end of the
    next op's launch call, clipped to the gap; 0 when that launch is unknown).

    The op after a gap is, among the ops starting at g1, the one whose launch call returned
    first (the GPU could have started as soon as any of them was submitted); unknown launches
    sort last. The op before it is one ending at g0 (no op of a later busy period can end
    there, every one starts at >= g1)."""
    known_end = np.where(launch_end >= 0, launch_end, np.iinfo(np.int64).max)
    by_start = np.lexsort((known_end, starts))
    after = by_start[np.searchsorted(starts[by_start], g1, side="left")]
    by_end = np.argsort(ends, kind="stable")
    before = by_end[np.searchsorted(ends[by_end], g0, side="left")]
    next_launch_end = launch_end[after]
    wait = np.where(next_launch_end >= 0, np.clip(next_launch_end - g0, 0, g1 - g0), 0).astype(np.int64)
    return before, after, wait


def idle_gap_attribution(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every idle gap ``[g0, g1)`` between the busy periods of every GPU op of ``trace``, with its
    :func:`gap_attribution` (the op before, the op after, the launch wait): ``(g0, g1, before,
    after, wait)``, rows of the GPU-op arrays. Read-only; computed once per trace (the timeline,
    the idle gaps of the facts and the gaps table read the same arrays)."""

    def compute() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        starts, ends = gpu_ops_times(trace)
        busy_s, busy_e = gpu_busy(trace)
        g0, g1 = busy_e[:-1], busy_s[1:]
        return (g0, g1, *gap_attribution(g0, g1, starts, ends, gpu_ops_launch_times(trace)[1]))

    return derived.memo(trace, "idle_gap_attribution", compute)


def launch_costs(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU op launched directly (kernels then memops, the order of
    :func:`~tracestory.analysis.links.gpu_ops_column`): its row among all GPU ops, the launch
    call's duration (CPU API time) and GPU start - call end (queue time), in ns (module
    docstring)."""
    direct = np.flatnonzero(launched_directly(trace))
    launch = gpu_ops_launch_index(trace)[direct]
    starts = gpu_ops_times(trace)[0][direct]
    call_start = api_column(trace, launch, "start_ns")
    call_end = api_column(trace, launch, "end_ns")
    return direct, call_end - call_start, starts - call_end


def timeline(trace: Trace) -> Timeline | None:
    """The GPU timeline of one trace; ``None`` when it has no GPU ops or no real timestamps."""
    if not trace.meta.has_timeline:
        return None
    k, m = trace.kernels, trace.memops
    n_k = len(k)
    if n_k + len(m) == 0:
        return None

    starts, ends = gpu_ops_times(trace)
    names = gpu_ops_column(trace, "name")
    devices = gpu_ops_column(trace, "device")
    streams = gpu_ops_column(trace, "stream")
    has_launch = gpu_ops_launch_index(trace) >= 0
    # Ops replayed from a graph carry the graph launch's correlation id: their "latency" would be
    # the time since the graph launch, so launch costs are read from ops launched one by one.
    _, api_ns, queue_ns = launch_costs(trace)

    t0, t1 = int(starts.min()), int(ends.max())
    window = t1 - t0
    busy_s, busy_e = gpu_busy(trace)
    busy = int((busy_e - busy_s).sum())
    total = int((ends - starts).sum())
    idle = window - busy

    # Gaps lie between consecutive merged busy periods.
    g0, g1, before, after, wait = idle_gap_attribution(trace)
    gdur = g1 - g0
    idle_wait = int(wait.sum())

    hist = []
    for label, lo, hi in GAP_BINS:
        sel = (gdur >= lo) & (gdur < hi)
        hist.append((label, int(sel.sum()), int(gdur[sel].sum())))

    # Longest first; ties broken by earlier start (lexsort's last key is primary).
    top = _longest(g0, gdur, TOP_GAPS)
    largest = tuple(
        Gap(start_ns=int(g0[i]), dur_ns=int(gdur[i]), before=trace.name(int(names[before[i]])),
            after=trace.name(int(names[after[i]])), launch_wait_ns=int(wait[i]))
        for i in top
    )

    kdur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    short_share = float((kdur < SHORT_KERNEL_NS).mean()) if n_k else None
    idle_fraction = idle / window if window > 0 else 0.0
    if has_launch.any():
        launch_bound = (idle_fraction >= IDLE_FRACTION_BOUND and idle > 0
                        and idle_wait / idle >= LAUNCH_WAIT_SHARE_BOUND)
    else:
        launch_bound = (idle_fraction >= IDLE_FRACTION_BOUND and short_share is not None
                        and short_share >= SHORT_KERNEL_SHARE_BOUND)
    zero = int(np.count_nonzero(kdur == 0))
    withheld = None
    if n_k and zero / n_k >= SHORT_KERNEL_SHARE_BOUND:
        launch_bound = False
        withheld = f"{zero:,} of {n_k:,} kernels have no duration"

    return Timeline(
        start_ns=t0,
        end_ns=t1,
        window_ns=window,
        busy_ns=busy,
        sum_ns=total,
        idle_ns=idle,
        idle_fraction=idle_fraction,
        gap_count=int(gdur.size),
        idle_launch_wait_ns=idle_wait,
        idle_other_ns=idle - idle_wait,
        launch_api=distribution(api_ns),
        launch_queue=distribution(queue_ns),
        launch_to_start=distribution(api_ns + queue_ns),
        kernels_per_ms=n_k / (window / 1e6) if window > 0 else None,
        short_kernel_share=short_share,
        short_kernel_ns=SHORT_KERNEL_NS,
        gap_histogram=tuple(hist),
        largest_gaps=largest,
        streams=_stream_stats(devices, streams, starts, ends, gpu_ops_order(trace)),
        launch_bound=bool(launch_bound),
        zero_duration_kernels=zero,
        verdict_withheld=withheld,
        launch_queue_negative=int((queue_ns < 0).sum()),
    )
