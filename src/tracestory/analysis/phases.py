"""Phases and iterations: CPU ranges that cut a trace into steps, with the GPU work of each.

Phase source, first that exists wins:

1. ``"ProfilerStep"``: CPU ranges named ``ProfilerStep#N`` (torch.profiler's step marker), or,
   in traces written before 2022 where the marker is an ``Operator`` event, CPU ops so named.
2. ``"user_annotation"`` (Kineto) or ``"nvtx"`` (Nsight Systems): the outermost CPU-side ranges.
   Within each thread the outermost nesting level is taken, unless the first deeper level with
   more than one range holds at least 90% of its GPU ops and is not a stack of layers (see
   Steps below): then the deeper, repeated level (a single wrapping range such as ``main``
   says nothing about steps, while a single range that holds the real step, such as vLLM's
   ``execute_context_*``, or one ``forward`` around ``layer_0``..``layer_31``, is kept).
   When several threads carry such ranges, the thread whose ranges enclose the most GPU-op
   launches wins. GPU-side ranges (``gpu_user_annotation``) are never used.
   **Coverage**: the level must hold at least ``MIN_COVERAGE`` (half) of the kernel time. A
   level that holds less (``Optimizer.step#SGD.step`` and ``Optimizer.zero_grad`` ranges,
   8% of a training step's kernels) is not the step structure; it gives way to 3.
3. ``"training"``: forward / backward / optimizer per iteration, when the trace shows a
   training loop: optimizer steps (``Optimizer.step#*`` or ``## optimizer ##``, ranges or ops)
   and backward work (``## backward ##`` ranges, or autograd ops: ``autograd::engine::
   evaluate_function: *``, ``*Backward*``, ``torch::autograd::AccumulateGrad``). Iterations
   end at each optimizer step; in each, ``backward#i`` spans the backward work before the step,
   ``forward#i`` runs from the previous step's end (the first GPU launch for the first one) to
   the backward's start (or is the ``## forward ##`` range when there is one), and
   ``optimizer#i`` is the optimizer step. Used when it holds more kernel time than 2.
4. ``"none"``: one phase ``"whole trace"`` holding every GPU op.

``Phases.reason`` says which level was chosen and why (with its coverage), ``coverage`` is
the share of kernel time inside the phases (None for ``"none"``).

GPU projection: a GPU op (kernel or memop) belongs to the phase whose CPU range contains the
START of its launch call (``links.launch_index`` -> ``api.start_ns``), same process (pid of
the launch call) when both pids are known. The launching thread is not required to match: autograd runs backward kernels' launches on its
own thread, inside the step the main thread marked. Phases are sorted by start; an op is given
to the latest-starting phase at or before its launch and kept only if the launch is before
that phase's end (one ``searchsorted``). Ops whose launch is unknown or outside every phase
are counted in ``unassigned_kernel_count`` (kernels and memops alike).

Per phase: CPU wall span, GPU span (first start to last end of its ops; the GPU runs
asynchronously, so this usually lags the CPU range), GPU busy (union of its ops' intervals).

Families: a phase's name with a trailing step number stripped (``decode_3`` -> ``decode``,
``ProfilerStep#6`` -> ``ProfilerStep``). For a family of >= 3 numbered phases, the per-step time
(GPU span when the phase has GPU ops, else CPU wall) is fitted against the step number by
least squares: ``slope = cov(step, t) / var(step)``, ``r2 = 1 - SS_res / SS_tot`` (``None``
when every time is equal or every step is equal). Outliers: in a family of >= 3 phases, a phase
whose time is >= 1.5x the family median, typically the first iteration paying for JIT
compilation, autotuning, allocator growth or cold caches.

**Steps** (trend, outliers; ``families``): ``ProfilerStep`` always. Any other numbered family
counts as steps only when its members are a loop over the whole work, which is checked as:

a. each launches the same kernels: at least half of the members launch the same kernel
   names in the same order (``computeNBody11`` / ``computeNBody15`` running different work
   are tests, not iterations);
b. they tile the work one after the other: members do not overlap in CPU time and the numbers
   grow with time, each number once (``layer_0``..``layer_31`` restarting in every engine
   call number the layers of a pass, the call is the step);
c. they are not nested in one enclosing repeated range that is itself the step: the phases
   are the outermost repeated level of their thread, so a repeated enclosing range would have
   been taken instead; a family whose name is a model's layer index (``layer_N``,
   ``decoder.layers.N``, ``transformer.h.N``, ``blocks.N``: the family ends in ``layer(s)``,
   ``block(s)`` or is ``h``) is a loop over the layers inside one pass, not over the work.

A family that fails is listed in ``Phases.not_steps`` with the test it failed. The tests and the training
structure are written in :mod:`.loops`.

Sub-phases: CPU ranges nested inside the phases (the outermost ones inside each phase, such as
``decode_graph`` and ``decode_eager`` inside ``ProfilerStep#N``), grouped by name, with the
kernels launched inside them on the same thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec
import numpy as np

from ..trace import CPU_SIDE, Trace
from ..units import plural
from . import intervals
from .links import api_column, gpu_busy, gpu_ops_launch_index, gpu_ops_order, gpu_ops_times
from .loops import family_verdicts, not_a_loop, split_step, training_phases

OUTLIER_RATIO = 1.5
MIN_FAMILY = 3
HOLDS_THE_WORK = 0.9  # an inner level replaces the outermost one when it holds this share of its GPU ops
MIN_COVERAGE = 0.5  # an annotated level must hold this share of the kernel time to be the phases
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclass(frozen=True)
class Phase:
    index: int
    name: str
    family: str  # name with its step number stripped
    step: int | None  # trailing number of the name, e.g. 3 for decode_3
    start_ns: int
    end_ns: int
    wall_ns: int  # CPU range span
    gpu_start_ns: int | None  # first start of a GPU op launched inside it
    gpu_end_ns: int | None  # last end of a GPU op launched inside it
    gpu_span_ns: int | None  # gpu_end - gpu_start
    gpu_busy_ns: int  # union of its GPU ops
    kernel_count: int
    memop_count: int
    kernel_rows: np.ndarray = field(compare=False, repr=False)  # rows of trace.kernels, by start


class FamilyTrend(msgspec.Struct, frozen=True):
    family: str
    count: int
    mean_ns: float  # per-step time: gpu_span when known, else wall
    min_ns: int
    max_ns: int
    slope_ns_per_step: float
    intercept_ns: float
    r2: float | None


class Outlier(msgspec.Struct, frozen=True):
    phase_index: int
    name: str
    time_ns: int
    family_median_ns: float
    ratio: float


class SubPhase(msgspec.Struct, frozen=True):
    """CPU ranges of one name nested inside the phases, with the kernels launched in them."""

    name: str
    count: int             # occurrences
    kernel_count: int
    kernel_time_ns: int    # summed durations of those kernels


@dataclass(frozen=True)
class Phases:
    source: str  # "ProfilerStep", "user_annotation", "nvtx" or "none"
    phases: tuple[Phase, ...]  # in time order
    families: tuple[FamilyTrend, ...]
    outliers: tuple[Outlier, ...]
    unassigned_kernel_count: int  # GPU ops (kernels + memops) launched outside every phase
    subphases: tuple[SubPhase, ...] = ()  # largest kernel time first
    reason: str = ""  # which level was chosen and why
    coverage: float | None = None  # share of kernel time inside the phases; None for "none"
    not_steps: tuple[tuple[str, str], ...] = ()  # (family, why it is not a loop of steps)


def _nesting_depth(starts: np.ndarray, ends: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """Depth of each range among ranges of its thread (0 = not inside another).

    Counted by a sweep: sort begin (+1) and end (-1) events per thread, ends before begins at
    equal times, and read the running count just before each begin."""
    n = starts.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    tid_ev = np.concatenate([tids, tids])
    t_ev = np.concatenate([starts, ends])
    kind = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    # At equal time an end comes before a begin, except the end of an empty range, which must
    # follow its own begin; among begins the longer range first (it is the parent).
    rank = np.concatenate([np.ones(n, np.int64), np.where(ends > starts, 0, 2)])
    tie = np.concatenate([-(ends - starts), np.zeros(n, np.int64)])
    order = np.lexsort((tie, rank, t_ev, tid_ev))
    k = kind[order]
    # Every thread's begins and ends cancel, so the global running count is back to 0 at
    # each thread boundary and needs no reset.
    before = np.cumsum(k) - k
    depth = np.empty(n, dtype=np.int64)
    is_begin = k == 1
    depth[order[is_begin]] = before[is_begin]
    return depth


def _assign(launch: np.ndarray, ok: np.ndarray, p_start: np.ndarray, p_end: np.ndarray) -> np.ndarray:
    """Phase index of each launch time (``-1`` outside every phase); phases sorted by start."""
    out = np.full(launch.size, -1, dtype=np.int64)
    if p_start.size == 0:
        return out
    idx = np.searchsorted(p_start, launch, side="right") - 1
    idx_c = np.maximum(idx, 0)
    hit = ok & (idx >= 0) & (launch < p_end[idx_c])
    out[hit] = idx[hit]
    return out


def _pick_ranges(trace: Trace, rows: np.ndarray, launch: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, str]:
    """From candidate range rows, the outermost repeated level of the best thread, and why."""
    r = trace.ranges
    if rows.size == 0:
        return rows, ""
    starts, ends = r["start_ns"][rows], r["end_ns"][rows]
    thread = r["pid"][rows].astype(np.int64) * (1 << 32) + r["tid"][rows].astype(np.int64)
    depth = r["depth"][rows].astype(np.int64)
    if (depth < 0).any():  # loader left it unknown: compute nesting among the candidates
        depth = _nesting_depth(starts, ends, thread)
    n_k = len(trace.kernels)
    best, best_key, best_why = rows[:0], None, ""
    for th in np.unique(thread):
        on = thread == th
        d = depth[on]
        levels, counts = np.unique(d, return_counts=True)

        def level_rows(level):
            c = rows[on][d == level]
            c = c[np.argsort(r["start_ns"][c], kind="stable")]
            at = _assign(launch, ok, r["start_ns"][c], r["end_ns"][c])
            return c, int((at >= 0).sum()), at

        # The outermost level, unless a deeper level that repeats holds (nearly) the same work:
        # a lone wrapping range such as ``main`` says nothing about steps, but a lone range that
        # holds the step (vLLM's ``execute_context_*``) must not be traded for inner ranges that
        # hold a sliver of it, nor a lone pass for the stack of its layers.
        chosen, held, _ = level_rows(d.min())
        why = "the outermost ranges of their thread"
        repeated = levels[counts > 1]
        if repeated.size and repeated.min() != d.min():
            inner, inner_held, at = level_rows(repeated.min())
            if inner_held >= HOLDS_THE_WORK * held:
                names = [trace.name(int(c)) for c in r["name"][inner]]
                verdicts = family_verdicts(trace, names, r["start_ns"][inner], r["end_ns"][inner], at[:n_k])
                layers = bool(verdicts) and all(v is not None for v in verdicts.values())
                outer = trace.name(int(r["name"][chosen[0]])) if chosen.size == 1 else "the outermost ranges"
                if layers:
                    fam, v = next(iter(verdicts.items()))
                    why = (f"{outer} kept: the repeated ranges inside it ({fam}*) are not steps, {v}")
                else:
                    chosen, held = inner, inner_held
                    why = (f"the repeated ranges under {outer}, holding at least "
                           f"{HOLDS_THE_WORK:.0%} of its GPU ops")
        key = (held, chosen.size, -int(th))
        if best_key is None or key > best_key:
            best, best_key, best_why = chosen, key, why
    return best, best_why


def _profiler_step_ops(trace: Trace) -> np.ndarray:
    """Rows of ``trace.ops`` named ``ProfilerStep#N``, by start: torch.profiler before 2022
    wrote its step markers in the ``Operator`` category, which readers load as CPU ops."""
    names = trace.ops["name"]
    if len(names) == 0:
        return np.zeros(0, dtype=np.int64)
    codes = np.unique(names)
    step_codes = [c for c in codes if c >= 0 and _PROFILER_STEP.match(trace.name(int(c)))]
    rows = np.flatnonzero(np.isin(names, step_codes))
    return rows[np.argsort(trace.ops["start_ns"][rows], kind="stable")]


def _segment_union(seg: np.ndarray, starts: np.ndarray, ends: np.ndarray, n_seg: int) -> np.ndarray:
    """Union length of intervals per segment id, in one vectorized union: each segment is
    shifted by ``seg * stride`` so different segments can never merge."""
    out = np.zeros(n_seg, dtype=np.int64)
    if starts.size == 0:
        return out
    lo = int(starts.min())
    stride = int(ends.max()) - lo + 1
    s, e = intervals.union(starts - lo + seg * stride, ends - lo + seg * stride)
    np.add.at(out, s // stride, e - s)
    return out


def _trend(family: str, steps: np.ndarray, times: np.ndarray) -> FamilyTrend:
    x, y = steps.astype(np.float64), times.astype(np.float64)
    dx = x - x.mean()
    var_x = float((dx * dx).sum())
    if var_x > 0:
        slope = float((dx * (y - y.mean())).sum() / var_x)
    else:
        slope = 0.0
    intercept = float(y.mean() - slope * x.mean())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - (slope * x + intercept)) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 and var_x > 0 else None
    return FamilyTrend(family=family, count=int(y.size), mean_ns=float(y.mean()),
                       min_ns=int(times.min()), max_ns=int(times.max()),
                       slope_ns_per_step=slope, intercept_ns=intercept, r2=r2)


_COMPILED_CALL = re.compile(r"^## Call CompiledFxGraph \w+ ##$")


def _subphases(trace: Trace, chosen: np.ndarray | None, p_start: np.ndarray, p_end: np.ndarray,
               launch_rows: np.ndarray) -> tuple[SubPhase, ...]:
    """The outermost CPU ranges inside each phase (not the phases themselves), by name."""
    r = trace.ranges
    cpu = np.flatnonzero(r["side"] == CPU_SIDE)
    if chosen is not None:
        cpu = np.setdiff1d(cpu, chosen)
    if cpu.size == 0 or p_start.size == 0:
        return ()
    s, e = r["start_ns"][cpu].astype(np.int64), r["end_ns"][cpu].astype(np.int64)
    ph = _assign(s, np.ones(s.size, dtype=bool), p_start, p_end)
    inside = (ph >= 0) & (e <= p_end[np.maximum(ph, 0)])
    names = [trace.name(int(c)) for c in r["name"][cpu]]
    inside &= ~np.array([bool(_PROFILER_STEP.match(n)) for n in names], dtype=bool)
    rows = cpu[inside]
    if rows.size == 0:
        return ()
    tid = r["tid"][rows].astype(np.int64)
    depth = _nesting_depth(r["start_ns"][rows].astype(np.int64), r["end_ns"][rows].astype(np.int64), tid)
    rows, tid = rows[depth == 0], tid[depth == 0]
    # Kernels launched inside each range, same thread.
    k = trace.kernels
    kl = launch_rows[: len(k)]
    known = kl >= 0
    k_launch = np.where(known, trace.api["start_ns"][np.maximum(kl, 0)], -1)
    k_tid = np.where(known, trace.api["tid"][np.maximum(kl, 0)], -1)
    dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    agg: dict[str, list[int]] = {}
    for th in np.unique(tid):
        mine = rows[tid == th]
        mine = mine[np.argsort(r["start_ns"][mine], kind="stable")]
        on = known & (k_tid == th)
        at = _assign(k_launch, on, r["start_ns"][mine].astype(np.int64), r["end_ns"][mine].astype(np.int64))
        n_k = np.bincount(at[at >= 0], minlength=mine.size)
        t_k = np.bincount(at[at >= 0], weights=dur[at >= 0], minlength=mine.size)
        for j, row in enumerate(mine):
            name = trace.name(int(r["name"][row]))
            name = "CompiledFxGraph call" if _COMPILED_CALL.match(name) else name
            a = agg.setdefault(name, [0, 0, 0])
            a[0] += 1
            a[1] += int(n_k[j])
            a[2] += int(t_k[j])
    subs = [SubPhase(n, c, kc, kt) for n, (c, kc, kt) in agg.items()]
    return tuple(sorted(subs, key=lambda x: (-x.kernel_time_ns, x.name)))


def _whole_span(trace: Trace) -> tuple[int, int] | None:
    lo, hi = [], []
    for t in (trace.kernels, trace.memops, trace.api, trace.ops, trace.ranges):
        if len(t):
            lo.append(int(t["start_ns"].min()))
            hi.append(int(t["end_ns"].max()))
    return (min(lo), max(hi)) if lo else None


def phases(trace: Trace) -> Phases:
    """Cut the trace into phases (see the module docstring) and project GPU work onto them."""
    k, r = trace.kernels, trace.ranges
    n_k = len(k)
    op_start, op_end = gpu_ops_times(trace)
    li = gpu_ops_launch_index(trace)
    ok = li >= 0
    launch = api_column(trace, li, "start_ns")
    launch_pid = api_column(trace, li, "pid")

    cpu_rows = np.flatnonzero(r["side"] == CPU_SIDE)
    codes = np.unique(r["name"][cpu_rows])
    step_codes = np.array([c for c in codes if _PROFILER_STEP.match(trace.name(int(c)))], dtype=np.int64)
    step_rows = cpu_rows[np.isin(r["name"][cpu_rows], step_codes)]
    k_dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)

    def coverage(assign_k: np.ndarray) -> float | None:
        total = int(k_dur.sum())
        return float(k_dur[assign_k >= 0].sum()) / total if total > 0 else None

    def project(table, rows: np.ndarray):
        """Names, starts, ends of the chosen rows of ``table``, and each GPU op's phase."""
        p_s = table["start_ns"][rows].astype(np.int64)
        p_e = table["end_ns"][rows].astype(np.int64)
        names = [trace.name(int(c)) for c in table["name"][rows]]
        at = _assign(launch, ok, p_s, p_e)
        # Same process as the launch call when both sides know their pid.
        ph_pid = table["pid"][rows].astype(np.int64)
        a = np.flatnonzero(at >= 0)
        other = (launch_pid[a] >= 0) & (ph_pid[at[a]] >= 0) & (launch_pid[a] != ph_pid[at[a]])
        at[a[other]] = -1
        return names, p_s, p_e, at

    op_steps = _profiler_step_ops(trace) if not step_rows.size else None
    chosen, table, reason, cov = None, r, "", None
    if step_rows.size:
        source = "ProfilerStep"
        chosen = step_rows[np.argsort(r["start_ns"][step_rows], kind="stable")]
        reason = f"torch.profiler's step markers ({chosen.size} ProfilerStep#N range{'s' if chosen.size > 1 else ''})"
    elif op_steps is not None and op_steps.size:
        source, chosen, table = "ProfilerStep", op_steps, trace.ops
        reason = (f"torch.profiler's step markers ({chosen.size} ProfilerStep#N op{'s' if chosen.size > 1 else ''}, "
                  "a trace written before 2022)")
    elif cpu_rows.size:
        source = "nvtx" if trace.meta.source_format.startswith("nsys") else "user_annotation"
        chosen, reason = _pick_ranges(trace, cpu_rows, launch, ok)
    else:
        source = "none"
    if source != "none":
        p_names, p_start, p_end, assign = project(table, chosen)
        cov = coverage(assign[:n_k])
    low = ""
    if source in ("nvtx", "user_annotation") and cov is not None and cov < MIN_COVERAGE:
        low = (f"the annotated ranges ({', '.join(list(dict.fromkeys(p_names))[:3])}"
               f"{', ...' if len(set(p_names)) > 3 else ''}) hold {cov:.0%} of the kernel time, "
               f"under {MIN_COVERAGE:.0%}: not the step structure")
        source = "none"
    elif source in ("nvtx", "user_annotation"):
        reason = f"{reason} ({cov:.0%} of the kernel time)" if cov is not None else reason
    if source == "none":
        tr = training_phases(trace, launch, ok)
        t_assign = _assign(launch, ok, tr[1], tr[2]) if tr is not None else None
        t_cov = coverage(t_assign[:n_k]) if t_assign is not None else None
        if tr is not None and t_cov:
            source, chosen, table = "training", None, None
            p_names, p_start, p_end = tr
            assign, cov = t_assign, t_cov
            reason = (f"forward / backward / optimizer of "
                      f"{plural(sum(n.startswith('optimizer#') for n in p_names), 'training iteration')}, from optimizer steps and autograd ops ({t_cov:.0%} of the kernel "
                      f"time)" + (f"; {low}" if low else ""))
        else:
            reason = f"one phase: {low}, and no training loop to cut it by" if low else ""

    if source == "none":
        span = _whole_span(trace)
        if span is None:
            return Phases("none", (), (), (), 0, reason="empty trace: no events")
        p_start, p_end = np.array([span[0]]), np.array([span[1]])
        p_names = ["whole trace"]
        assign = np.zeros(op_start.size, dtype=np.int64)  # every GPU op, launch known or not
        reason = reason or "one phase: no CPU ranges or step markers"
        cov = None

    n_p = p_start.size
    inside = assign >= 0
    a_idx = assign[inside]
    is_kernel = np.arange(op_start.size) < n_k
    kernel_count = np.bincount(a_idx[is_kernel[inside]], minlength=n_p)
    memop_count = np.bincount(a_idx[~is_kernel[inside]], minlength=n_p)
    big = np.iinfo(np.int64).max
    g_start = np.full(n_p, big, dtype=np.int64)
    g_end = np.full(n_p, -big, dtype=np.int64)
    np.minimum.at(g_start, a_idx, op_start[inside])
    np.maximum.at(g_end, a_idx, op_end[inside])
    # in start order (stable): when the phases follow each other in time the shifted starts are
    # then already sorted, and the union skips its sort (same merge either way)
    by_start_all = gpu_ops_order(trace)
    if n_p == 1 and inside.all():   # one phase holding every op: its busy time is the GPU's
        busy_s, busy_e = gpu_busy(trace)
        g_busy = np.array([int((busy_e - busy_s).sum())], dtype=np.int64)
    else:
        by_start = by_start_all[inside[by_start_all]]
        g_busy = _segment_union(assign[by_start], op_start[by_start], op_end[by_start], n_p)

    k_assign = assign[:n_k]
    if k["start_ns"].dtype.kind in "iu":
        # by (phase, start, row): the kernels in start order (stable), then a stable sort by phase
        k_rows = by_start_all[by_start_all < n_k]
        k_rows = k_rows[k_assign[k_rows] >= 0]
        k_rows = k_rows[np.argsort(k_assign[k_rows], kind="stable")]
    else:
        k_rows = np.flatnonzero(k_assign >= 0)
        k_rows = k_rows[np.lexsort((k["start_ns"][k_rows], k_assign[k_rows]))]
    k_bounds = np.searchsorted(k_assign[k_rows], np.arange(n_p + 1))

    out = []
    for i in range(n_p):
        family, step = split_step(p_names[i])
        has_gpu = kernel_count[i] + memop_count[i] > 0
        gs = int(g_start[i]) if has_gpu else None
        ge = int(g_end[i]) if has_gpu else None
        out.append(Phase(
            index=i, name=p_names[i], family=family, step=step,
            start_ns=int(p_start[i]), end_ns=int(p_end[i]), wall_ns=int(p_end[i] - p_start[i]),
            gpu_start_ns=gs, gpu_end_ns=ge, gpu_span_ns=(ge - gs) if has_gpu else None,
            gpu_busy_ns=int(g_busy[i]), kernel_count=int(kernel_count[i]),
            memop_count=int(memop_count[i]), kernel_rows=k_rows[k_bounds[i]:k_bounds[i + 1]],
        ))

    times = np.array([p.gpu_span_ns if p.gpu_span_ns is not None else p.wall_ns for p in out],
                     dtype=np.int64)
    fams = np.array([p.family for p in out], dtype=object)
    trends, outliers, not_steps = [], [], []
    k_names = k["name"]
    for fam in dict.fromkeys(fams.tolist()):  # first-appearance order
        members = np.flatnonzero(fams == fam)
        if members.size < MIN_FAMILY:
            continue
        numbered = np.array([i for i in members if out[i].step is not None], dtype=np.int64)
        if source != "ProfilerStep":
            why = not_a_loop(fam, [tuple(k_names[out[i].kernel_rows].tolist()) for i in members],
                              p_start[members], p_end[members], [out[i].step for i in members])
            if why is not None:
                not_steps.append((fam, why))
                continue
        if numbered.size >= MIN_FAMILY:
            steps = np.array([out[i].step for i in numbered], dtype=np.int64)
            trends.append(_trend(fam, steps, times[numbered]))
        median = float(np.median(times[members]))
        if median <= 0:
            continue
        for i in members:
            if times[i] >= OUTLIER_RATIO * median:
                outliers.append(Outlier(phase_index=int(i), name=out[i].name, time_ns=int(times[i]),
                                        family_median_ns=median, ratio=float(times[i] / median)))

    subs = _subphases(trace, chosen if table is r else None, p_start, p_end, li) if source != "none" else ()
    return Phases(source=source, phases=tuple(out), families=tuple(trends),
                  outliers=tuple(outliers), unassigned_kernel_count=int((~inside).sum()), subphases=subs,
                  reason=reason, coverage=cov, not_steps=tuple(not_steps))
