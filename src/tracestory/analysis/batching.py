"""The scheduler event log of a continuous-batching server, read and analyzed.

Input: the JSONL log documented in the serve event-log format (``meta`` first, then
``arrival``, ``iteration``, ``first_token``, ``finish`` lines; times in ns since the log's
``t0``). Any engine that writes that format can be read. Unknown keys and unknown line types
are ignored; a line that is not a JSON object, a first line that is not ``meta``, or a known
line missing a required key raises :class:`~tracestory.errors.TraceFormatError` naming
``file:line``.

What is derived
---------------
* per request: TTFT = ``first_token.t_ns - arrival.t_ns``, E2E = ``finish.t_ns -
  arrival.t_ns`` (``None`` when either line is absent);
* per iteration: prefill tokens (sum over prefill members), decode sequences (count of decode
  members; each decodes one token), wall time ``t_end_ns - t_start_ns`` and a class:
  ``prefill-only``, ``mixed``, ``decode-only`` or ``empty``; an iteration is *prefill-heavy*
  when prefill tokens are at least half of its tokens;
* the fit ``iteration_ns = a + b_prefill * prefill_tokens + b_decode * decode_seqs`` by least
  squares over all iterations, with ``R^2 = 1 - SS_res / SS_tot``. A regressor that does not
  vary (e.g. no iteration had prefill) is left out and its slope is ``None``; fewer than 3
  iterations, no fit. The first iterations (warm-up, kernel compilation) are included: a low
  R^2 can come from them;
* stalls: iterations that took at least :data:`STALL_RATIO` times the median iteration and at
  least :data:`STALL_MIN_NS` (first-iteration warm-up, a garbage-collection pause), with the
  requests that arrived during each and their median TTFT; the part of an iteration the profiler's
  own start or stop held (``profiler_ns`` in the event log, else the capture manifest's
  ``profiler_blocked_s``; charged as ``serving_story`` says) does not count toward a stall; where
  the log has them, each stall carries the iteration's ``gc_ns`` (Python's garbage collector
  held the process; ``gc_passes``, ``gc_generation``) and ``gpu_ns`` (device time of its launched
  work), which tell a host pause from slow device work;
* with a trace, the traced iterations of each kind against untraced ones of the same kind and
  batch (median wall time; stalls left out): the profiler's own cost on the iterations it records;
* KV blocks over time (``kv.in_use`` at each iteration end), blocks allocated and freed,
  preemptions (``preempt`` decisions), chunked prefill (prefill members with ``chunked``);
* optionally, joined with a trace of the same run by iteration number: the server marks each
  iteration with a region named ``iteration N``. GPU-side ranges (Kineto
  ``gpu_user_annotation``) take the GPU ops that start inside them; else CPU-side ranges take
  the kernels and memory ops whose launch call starts inside them (any thread of the process:
  the engine thread does all launches; the iteration ranges are disjoint, so one sorted search
  assigns every op). Per iteration: GPU
  busy time (union of op intervals, never a sum); per class (prefill-heavy, decode-only): the
  kernels with the most total time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ingest.load_summary import Distribution, distribution
from ..ingest.scheduler_log import (  # noqa: F401  (re-exported)
    Arrival, Decision, Finish, FirstToken, Iteration, Member, SchedulerLog, SchedulerMeta, is_scheduler_log,
    read_scheduler_log)
from ..trace import CPU_SIDE, GPU_SIDE
from .intervals import union_length
from .links import api_column, gpu_ops_column, gpu_ops_launch_index
from .serving_story import ProfilerHold, ServingStory, charged_holds, profiler_holds, serving_story

ITER_RANGE = re.compile(r"iteration (\d+)\Z")


# ------------------------------------------------------------------ analysis


@dataclass(frozen=True)
class RequestTimes:
    request_id: str
    arrival_ns: int | None
    first_token_ns: int | None
    finish_ns: int | None
    ttft_ns: int | None
    e2e_ns: int | None
    finish_reason: str | None
    prompt_tokens: int | None
    output_tokens: int | None


@dataclass(frozen=True)
class IterationFit:
    """``iteration_ns = a_ns + b_prefill_ns_per_token * prefill_tokens + b_decode_ns_per_seq * decode_seqs``."""

    a_ns: float
    b_prefill_ns_per_token: float | None
    b_decode_ns_per_seq: float | None
    r_squared: float | None
    n: int


@dataclass(frozen=True)
class Preemption:
    iter: int
    t_ns: int
    request_id: str
    reason: str


STALL_RATIO = 10.0
STALL_MIN_NS = 50_000_000


@dataclass(frozen=True)
class Stall:
    iter: int
    t_start_ns: int
    duration_ns: int
    times_median: float
    arrivals_during: int                # requests that arrived while it ran
    ttft_p50_ns_of_those: float | None  # their median TTFT (from the log)
    next_launch_ns: int | None = None   # with overlapped scheduling: the next iteration's host launch,
                                        # which runs inside this one's wall time (``launch_ns``)
    gc_ns: int | None = None            # Python GC wall time charged to it (the log's ``gc_ns``), None: not logged
    gc_passes: int | None = None        # collections charged to it
    gc_generation: int | None = None    # the oldest generation collected (2: a full collection)
    gpu_ns: int | None = None           # device time of its launched work (the log's ``gpu_ns``, CUDA)


@dataclass(frozen=True)
class WindowCompare:
    """Traced iterations of one kind against the untraced ones of the same kind and batch
    (decode sequences and prefill tokens within the traced ones' range), stalls left out."""

    kind: str
    traced: int
    traced_median_ns: float
    others: int
    others_median_ns: float | None


@dataclass(frozen=True)
class KernelShare:
    name: str
    total_ns: int
    count: int
    per_iteration_ns: float
    fraction: float                     # of the class's kernel time


@dataclass(frozen=True)
class TraceJoin:
    side: str                           # "gpu" | "cpu": which iteration ranges were used
    iterations: tuple[int, ...]         # iteration numbers found in the trace
    gpu_busy_ns: tuple[int, ...]        # per iteration above: union of GPU op intervals
    range_ns: tuple[int, ...]           # per iteration above: the range's own duration
    top_kernels: dict[str, tuple[KernelShare, ...]]   # "prefill-heavy" / "decode-only"
    class_iterations: dict[str, int]


@dataclass(frozen=True)
class BatchingResult:
    log: SchedulerLog
    requests: tuple[RequestTimes, ...]
    ttft: Distribution
    e2e: Distribution
    iteration_ns: Distribution
    kinds: dict[str, int]               # iteration class -> count
    fit: IterationFit | None
    preemptions: tuple[Preemption, ...]
    chunked_requests: int               # requests with at least one chunked prefill step
    chunks: int                         # chunked prefill steps
    kv_allocated_total: int | None
    kv_freed_total: int | None
    kv_peak_in_use: int | None
    kv_peak_t_ns: int | None
    kv_total: int | None
    trace: TraceJoin | None = None
    finish_reasons: dict[str, int] = field(default_factory=dict)
    client: Any = None                  # the load generator's LoadSummary of the same run, if given
    stalls: tuple[Stall, ...] = ()
    window: tuple[WindowCompare, ...] = ()   # traced vs untraced iterations (with a trace)
    story: ServingStory | None = None        # the folded log, profiler holds, wait causes, advice


def fit_iteration_time(iterations) -> IterationFit | None:
    """Least-squares fit of iteration wall time on prefill tokens and decode sequences."""
    if len(iterations) < 3:
        return None
    y = np.array([i.duration_ns for i in iterations], dtype=np.float64)
    cols = {"p": np.array([i.prefill_tokens for i in iterations], dtype=np.float64),
            "d": np.array([i.decode_seqs for i in iterations], dtype=np.float64)}
    used = [k for k, c in cols.items() if np.ptp(c) > 0]  # a constant column is the intercept's
    x = np.column_stack([np.ones_like(y)] + [cols[k] for k in used])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - x @ coef) ** 2).sum())
    slope = dict(zip(used, (float(c) for c in coef[1:])))
    return IterationFit(float(coef[0]), slope.get("p"), slope.get("d"),
                        1.0 - ss_res / ss_tot if ss_tot > 0 else None, len(y))


def find_stalls(log: SchedulerLog, requests: tuple[RequestTimes, ...],
                holds: tuple[ProfilerHold, ...] | None = None) -> tuple[Stall, ...]:
    """Iterations far longer than the median (see the module docstring), in iteration order;
    ``requests`` from :func:`request_times` give the TTFT of those that arrived during each;
    ``holds`` (default: the log's own ``profiler_ns`` marks) the profiler time charged to each
    iteration (``serving_story.profiler_holds``), not counted toward a stall."""
    its = log.iterations
    if len(its) < 3:
        return ()
    dur = np.array([it.duration_ns for it in its], dtype=np.float64)
    median = float(np.median(dur))
    limit = max(STALL_RATIO * median, STALL_MIN_NS)
    # the profiler's own start or stop is not the engine's: that part of an iteration is not a stall
    held = charged_holds(profiler_holds(log) if holds is None else holds)
    dur = dur - np.array([held.get(it.iter, 0) for it in its], dtype=np.float64)
    out = []
    for k in np.flatnonzero(dur >= limit):
        it = its[int(k)]
        came = [r for r in requests if r.arrival_ns is not None and it.t_start_ns <= r.arrival_ns < it.t_end_ns]
        ttft = [r.ttft_ns for r in came if r.ttft_ns is not None]
        nxt = its[int(k) + 1].launch_ns if log.meta.overlap and int(k) + 1 < len(its) else None
        out.append(Stall(it.iter, it.t_start_ns, it.duration_ns, float(it.duration_ns / median) if median > 0 else float("inf"),
                         len(came), float(np.median(ttft)) if ttft else None, nxt,
                         it.gc_ns, it.gc_passes, it.gc_generation, it.gpu_ns))
    return tuple(out)


def compare_window(log: SchedulerLog, traced: tuple[int, ...], stalls: tuple[Stall, ...]) -> tuple[WindowCompare, ...]:
    """How much slower the traced iterations ran than comparable untraced ones (profiler cost)."""
    inside = set(traced)
    skip = {st.iter for st in stalls}
    out = []
    for kind in ("prefill-only", "mixed", "decode-only"):
        mine = [it for it in log.iterations if it.iter in inside and it.kind == kind and it.iter not in skip]
        if not mine:
            continue
        d_lo, d_hi = min(i.decode_seqs for i in mine), max(i.decode_seqs for i in mine)
        p_lo, p_hi = min(i.prefill_tokens for i in mine), max(i.prefill_tokens for i in mine)
        others = [it.duration_ns for it in log.iterations
                  if it.iter not in inside and it.iter not in skip and it.kind == kind
                  and d_lo <= it.decode_seqs <= d_hi and p_lo <= it.prefill_tokens <= p_hi]
        out.append(WindowCompare(kind, len(mine), float(np.median([i.duration_ns for i in mine])), len(others),
                                 float(np.median(others)) if others else None))
    return tuple(out)


def request_times(log: SchedulerLog) -> tuple[RequestTimes, ...]:
    arr = {a.request_id: a for a in log.arrivals}
    first = {}
    for ft in log.first_tokens:
        first.setdefault(ft.request_id, ft.t_ns)
    fin = {f.request_id: f for f in log.finishes}
    out = []
    for rid in dict.fromkeys([*arr, *fin]):
        a, f, t1 = arr.get(rid), fin.get(rid), first.get(rid)
        a_ns = a.t_ns if a else None
        out.append(RequestTimes(
            rid, a_ns, t1, f.t_ns if f else None,
            t1 - a_ns if t1 is not None and a_ns is not None else None,
            f.t_ns - a_ns if f is not None and a_ns is not None else None,
            f.reason if f else None,
            (f.prompt_tokens if f and f.prompt_tokens is not None else a.prompt_tokens if a else None),
            f.output_tokens if f else None))
    return tuple(out)


def analyze_batching(log: SchedulerLog, trace=None, client=None, manifest: dict | None = None) -> BatchingResult:
    """Everything the batch story tells, from the log (and a trace of the same run, the
    client's :class:`~tracestory.loadgen.stats.LoadSummary` of it, and the capture's manifest,
    read for the profiler's holds when the log does not mark them)."""
    its = log.iterations
    reqs = request_times(log)
    kinds: dict[str, int] = {}
    for it in its:
        kinds[it.kind] = kinds.get(it.kind, 0) + 1
    pre = tuple(Preemption(it.iter, it.t_end_ns, d.request_id, d.reason)
                for it in its for d in it.decisions if d.action == "preempt")
    chunked = [m.request_id for it in its for m in it.members if m.phase == "prefill" and m.chunked]
    in_use = [(it.kv_in_use, it.t_end_ns) for it in its if it.kv_in_use is not None]
    peak = max(in_use, key=lambda p: p[0]) if in_use else None
    alloc = [it.kv_allocated for it in its if it.kv_allocated is not None]
    freed = [it.kv_freed for it in its if it.kv_freed is not None]
    totals = [it.kv_total for it in its if it.kv_total is not None]
    reasons: dict[str, int] = {}
    for f in log.finishes:
        reasons[f.reason] = reasons.get(f.reason, 0) + 1
    joined = join_trace(log, trace) if trace is not None else None
    holds = profiler_holds(log, manifest)
    stalls = find_stalls(log, reqs, holds)
    fit = fit_iteration_time(its)
    return BatchingResult(
        log=log, requests=reqs,
        ttft=distribution([r.ttft_ns for r in reqs if r.ttft_ns is not None]),
        e2e=distribution([r.e2e_ns for r in reqs if r.e2e_ns is not None]),
        iteration_ns=distribution([it.duration_ns for it in its]), kinds=kinds,
        fit=fit, preemptions=pre, chunked_requests=len(set(chunked)), chunks=len(chunked),
        kv_allocated_total=sum(alloc) if alloc else None, kv_freed_total=sum(freed) if freed else None,
        kv_peak_in_use=peak[0] if peak else None, kv_peak_t_ns=peak[1] if peak else None,
        kv_total=totals[-1] if totals else log.meta.num_blocks,
        trace=joined, finish_reasons=reasons, client=client, stalls=stalls,
        window=compare_window(log, joined.iterations, stalls) if joined is not None else (),
        story=serving_story(log, stall_iters=[st.iter for st in stalls], holds=holds, fit=fit, preemptions=len(pre)))


def prefill_heavy(it: Iteration) -> bool:
    p = it.prefill_tokens
    return p > 0 and p >= 0.5 * (p + it.decode_seqs)


def join_trace(log: SchedulerLog, trace) -> TraceJoin | None:
    """GPU time per iteration and top kernels per class; None when the trace has no
    ``iteration N`` ranges."""

    codes = {c: int(m.group(1)) for c, s in enumerate(trace.strings) if (m := ITER_RANGE.match(s))}
    r = trace.ranges
    if not codes or len(r) == 0:
        return None
    hit = np.isin(r["name"], np.fromiter(codes, dtype=np.int64))
    side_code = GPU_SIDE if np.any(hit & (r["side"] == GPU_SIDE)) else CPU_SIDE
    rows = np.flatnonzero(hit & (r["side"] == side_code))
    if rows.size == 0:
        return None
    rows = rows[np.argsort(r["start_ns"][rows], kind="stable")]
    iter_of_row = np.array([codes[int(c)] for c in r["name"][rows]], dtype=np.int64)
    _, first = np.unique(iter_of_row, return_index=True)   # one range per iteration number
    rows, iter_of_row = rows[np.sort(first)], iter_of_row[np.sort(first)]
    r_s, r_e = r["start_ns"][rows], r["end_ns"][rows]

    starts, ends = gpu_ops_column(trace, "start_ns"), gpu_ops_column(trace, "end_ns")
    names = gpu_ops_column(trace, "name")
    is_kernel = np.arange(starts.size) < len(trace.kernels)
    if side_code == GPU_SIDE:
        key = starts
    else:
        key = api_column(trace, gpu_ops_launch_index(trace), "start_ns")
    slot = np.searchsorted(r_s, key, side="right") - 1
    ok = (key >= 0) & (slot >= 0)
    ok[ok] &= key[ok] < r_e[slot[ok]]
    slot = np.where(ok, slot, -1)

    by_iter = {it.iter: it for it in log.iterations}
    order = np.argsort(slot, kind="stable")
    bounds = np.searchsorted(slot[order], np.arange(len(rows) + 1))
    busy = []
    for j in range(len(rows)):
        sel = order[bounds[j]:bounds[j + 1]]
        busy.append(union_length(starts[sel], ends[sel]))
    tops: dict[str, tuple[KernelShare, ...]] = {}
    class_n: dict[str, int] = {}
    for cls, pred in (("prefill-heavy", prefill_heavy), ("decode-only", lambda it: it.kind == "decode-only")):
        member = np.array([bool(by_iter.get(int(n)) and pred(by_iter[int(n)])) for n in iter_of_row], dtype=bool)
        class_n[cls] = int(member.sum())
        sel = ok & is_kernel
        sel[sel] &= member[slot[sel]]
        if not sel.any():
            tops[cls] = ()
            continue
        dur = (ends - starts)[sel]
        uniq, inv = np.unique(names[sel], return_inverse=True)
        tot = np.bincount(inv, weights=dur)
        cnt = np.bincount(inv)
        all_ns = float(tot.sum())
        best = np.argsort(-tot, kind="stable")[:5]
        tops[cls] = tuple(KernelShare(trace.name(int(uniq[b])), int(tot[b]), int(cnt[b]), float(tot[b]) / class_n[cls],
                                      float(tot[b]) / all_ns if all_ns > 0 else 0.0) for b in best)
    return TraceJoin("gpu" if side_code == GPU_SIDE else "cpu", tuple(int(i) for i in iter_of_row),
                     tuple(int(b) for b in busy), tuple(int(x) for x in (r_e - r_s)), tops, class_n)
