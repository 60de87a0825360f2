"""The model of the Execution Story: the trace walked phase by phase, its GPU ops folded into
loops and runs (the renderer, :mod:`tracestory.render.story`, turns it into text).

Per phase (prefill, each decode step, each ProfilerStep, or the whole trace):

* its GPU ops are the kernels and memops launched inside the phase's CPU range, in start order
  (the whole trace when there are no phases);
* they are split at idle gaps >= ``max(100 us, 5% of the phase's GPU span)``, each gap with the
  CPU op the host was inside when known (``RunFacts.gaps``);
* each segment is folded: the longest exactly repeated run of op categories (period >= 3, >= 2
  repetitions) becomes a :class:`Loop` whose body is listed once; what is before and after is
  folded the same way (depth <= 3). Folding is on categories, not names: layer bodies repeat by
  category where one op's exact kernel differs between layers (a residual add's functor, a
  split-K variant). Inside, consecutive ops of one category are one :class:`OpGroup`;
* a long phase (>= 40 items folded) also gets its outermost nested CPU ranges as a coarse map.

Families of >= 3 steps (decode_0..15, ProfilerStep#N) are one :class:`FamilyStory`: every step's
time, and the median-time step told in full as the representative. The :class:`StorySummary`
closes it: the first phase, each family's range and outliers, and - when there is a prefill and
a decode family - how decode differs (kernels only one side runs, GEMM row counts M from
``aten::mm``/``aten::addmm`` input shapes: M <= 16 is matrix-vector work, memory-bound by nature).

Limits: ops are attributed to a phase by their launch time, so a phase's ops may run after its
CPU range ends; a trace without launch links (an nsys CSV summary) has no ops per phase.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .facts import RunFacts
from .gemm_rows import gemm_rows
from .phases import Phase, Phases

MIN_PERIOD = 3
MAX_PERIOD = 4096  # the longest loop body looked for: the search is one pass over the ops per period
MAX_DEPTH = 3
GAP_FLOOR_NS = 100_000
GAP_SHARE = 0.05
MAX_SUB_RANGES = 12
LONG_PHASE_ITEMS = 40  # a phase whose folded story has this many items also gets its nested ranges
GEMV_ROWS = 16


# ------------------------------------------------------------------ folding


def best_repeat(keys: np.ndarray, min_period: int = MIN_PERIOD) -> tuple[int, int, int] | None:
    """``(start, period, count)`` of the longest run of a block repeated back to back
    (coverage ``period * count`` maximal, the shortest period on ties), or None. Bodies of up to
    :data:`MAX_PERIOD` ops are looked for, so the cost is linear in the ops (a phase of a million
    kernels would otherwise take hours)."""
    n = len(keys)
    best, best_cover = None, 0
    for p in range(min_period, min(n // 2, MAX_PERIOD) + 1):
        eq = keys[p:] == keys[:-p]
        if not eq.any():
            continue
        padded = np.concatenate([[0], eq.view(np.int8), [0]])
        d = np.diff(padded)
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        lengths = ends - starts
        j = int(np.argmax(lengths))
        count = lengths[j] // p + 1
        if count >= 2 and count * p > best_cover:
            best, best_cover = (int(starts[j]), p, int(count)), count * p
    return best


def fold(keys: np.ndarray, lo: int, hi: int, depth: int = 0) -> list[tuple]:
    """Segments of ``keys[lo:hi]``: ``("run", a, b)`` or ``("loop", a, period, count)``."""
    if hi - lo < 2 * MIN_PERIOD or depth >= MAX_DEPTH:
        return [("run", lo, hi)] if hi > lo else []
    rep = best_repeat(keys[lo:hi])
    if rep is None:
        return [("run", lo, hi)]
    s, p, c = rep
    a = lo + s
    return fold(keys, lo, a, depth + 1) + [("loop", a, p, c)] + fold(keys, a + p * c, hi, depth + 1)


# ------------------------------------------------------------------ the model


@dataclass(frozen=True)
class OpGroup:
    """Consecutive GPU ops of one category (per iteration inside a loop)."""

    category: str
    count: int
    time_ns: int  # summed GPU time (of one iteration inside a loop)
    top_kernel: str  # the name with the most time in the group
    kinds: int  # distinct kernel names in the group


@dataclass(frozen=True)
class IdleGap:
    """An idle gap between a phase's GPU ops, at least the phase's gap threshold long."""

    length_ns: int
    cpu_op: str | None  # the CPU op the host was inside, when known
    iteration: int | None = None  # inside a loop: its iteration (1-based) ...
    before_op: int | None = None  # ... and the op of the body it precedes (1-based)


@dataclass(frozen=True)
class OpRun:
    """GPU ops in start order, not repeated, starting ``offset_ns`` after the phase's GPU start."""

    offset_ns: int
    groups: tuple[OpGroup, ...]


@dataclass(frozen=True)
class Loop:
    """A block of ``period`` ops repeated ``count`` times back to back; ``body`` is the first
    repetition; ``span_ns`` the wall time of one repetition on average."""

    offset_ns: int
    count: int
    period: int
    span_ns: float
    gpu_time_ns: int  # all repetitions together
    body: tuple[OpGroup, ...]
    inner_gaps: tuple[IdleGap, ...]


Segment = OpRun | Loop | IdleGap


@dataclass(frozen=True)
class SubRange:
    """An outermost CPU range nested in a long phase (``## forward ##``) and its GPU ops."""

    name: str
    start_ns: int  # from the story's origin
    ops: int
    gpu_time_ns: int
    top_categories: tuple[tuple[str, float], ...]  # (category, share of its GPU time), <= 3


@dataclass(frozen=True)
class FirstLaunch:
    """The launch call of a phase's first GPU op: host time and queueing before it ran."""

    at_ns: int  # launch call start, from the story's origin
    kernel: str
    latency_ns: int  # GPU start - launch call start


@dataclass(frozen=True)
class PhaseStory:
    """One phase told in full. Times ``*_at_ns`` are from the story's origin."""

    name: str
    whole: bool  # the whole trace (no phases)
    ops: int
    kernels: int
    memops: int
    cpu_at_ns: int
    wall_ns: int
    gpu_at_ns: int | None  # None: no GPU op launched in it
    gpu_end_at_ns: int | None
    gpu_span_ns: int | None
    gpu_busy_ns: int
    first_launch: FirstLaunch | None
    segments: tuple[Segment, ...]
    sub_ranges: tuple[SubRange, ...]  # for a long phase only


@dataclass(frozen=True)
class StepTime:
    name: str
    time_ns: int  # GPU span, else CPU wall
    busy_ns: int
    ops: int


@dataclass(frozen=True)
class FamilyStory:
    """A family of >= 3 steps: every step's time and the median-time step in full."""

    family: str
    steps: tuple[StepTime, ...]
    first_at_ns: int
    min_ns: int
    max_ns: int
    mean_ns: float
    slope_ns_per_step: float
    r2: float | None
    representative: PhaseStory


@dataclass(frozen=True)
class FamilySummary:
    family: str
    count: int
    min_ns: int
    max_ns: int
    mean_ns: float
    busy_mean_ns: float
    outliers: tuple[tuple[str, int, float], ...]  # (step, time, x the median)
    fast: tuple[tuple[str, int], ...]  # steps at most 1/1.5 of the median time


@dataclass(frozen=True)
class Differs:
    """How the decode family differs from the first phase (prefill)."""

    first: str
    family: str
    shared_kernels: int
    only_first: tuple[str, ...]  # kernel names, sorted
    only_family: tuple[str, ...]
    gemm_rows_first: tuple[int, int] | None  # (min, max) M
    gemm_rows_family: tuple[int, int] | None
    gpu_time_first_ns: int
    gpu_time_per_step_ns: float
    ops_first: int
    ops_per_step: float
    top_first: tuple[str, float] | None  # (category, share of GPU op time)
    top_family: tuple[str, float] | None

    @property
    def family_is_gemv(self) -> bool:
        return self.gemm_rows_family is not None and self.gemm_rows_family[1] <= GEMV_ROWS


@dataclass(frozen=True)
class StorySummary:
    first: tuple[str, int | None, int, int] | None  # (name, GPU span, busy, wall) when not in a family
    families: tuple[FamilySummary, ...]
    differs: Differs | None


@dataclass(frozen=True)
class Story:
    trace: str
    source: str  # where the phases come from ("none": the whole trace is one phase)
    phase_count: int
    blocks: tuple[PhaseStory | FamilyStory, ...]
    summary: StorySummary | None  # None: one phase and no family (the phase says it all)


# ------------------------------------------------------------------ building it


class _Ops:
    """The GPU ops of the trace (``RunFacts.gpu_ops``) in start order."""

    def __init__(self, facts: RunFacts):
        g = facts.gpu_ops
        order = g.order
        self.cats = g.categories
        self.start = g.start_ns[order]
        self.end = g.end_ns[order]
        self.name = g.name[order]
        self.cat = g.category[order]
        self.launch = g.launch_start_ns[order]
        self.trace = facts.trace
        self._by_launch = np.argsort(self.launch, kind="stable")
        self._launch_sorted = self.launch[self._by_launch]
        self._ranges: tuple[np.ndarray, np.ndarray] | None = None

    def of_phase(self, ph: Phase, whole: bool) -> np.ndarray:
        """The ops (ascending) launched inside the phase's CPU range."""
        return np.arange(len(self.start)) if whole else self.launched_in(ph.start_ns, ph.end_ns)

    def launched_in(self, start_ns: int, end_ns: int) -> np.ndarray:
        """The ops (ascending) whose launch call starts in [start_ns, end_ns): a binary search, so
        a story over many steps stays linear in the ops."""
        lo, hi = np.searchsorted(self._launch_sorted, (start_ns, end_ns), "left")
        return np.sort(self._by_launch[lo:hi])

    def cpu_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the trace's CPU ranges sorted by start, and their starts (built once)."""
        if self._ranges is None:
            r = self.trace.ranges
            rows = np.flatnonzero(r["side"] == 0) if len(r) else np.zeros(0, dtype=np.int64)
            rows = rows[np.argsort(r["start_ns"][rows], kind="stable")] if rows.size else rows
            self._ranges = (rows, r["start_ns"][rows] if rows.size else np.zeros(0, dtype=np.int64))
        return self._ranges

    def groups(self, idx: np.ndarray, reps: int = 1) -> tuple[OpGroup, ...]:
        """Consecutive same-category ops of ``idx`` (times per repetition)."""
        if idx.size == 0:
            return ()
        out = []
        cuts = np.flatnonzero(np.diff(self.cat[idx])) + 1
        for seg in np.split(idx, cuts):
            dur = self.end[seg] - self.start[seg]
            codes, inv = np.unique(self.name[seg], return_inverse=True)
            per = np.bincount(inv, weights=dur)
            top = self.trace.name(int(codes[int(np.argmax(per))]))
            out.append(OpGroup(self.cats[self.cat[seg[0]]], len(seg), int(dur.sum()) // reps, top, len(codes)))
        return tuple(out)


def _segments(ops: _Ops, idx: np.ndarray, t0: int, causes: dict, gap_min: int) -> tuple[Segment, ...]:
    """One phase's ops (in start order) as runs, loops and the idle gaps between them."""
    if idx.size == 0:
        return ()
    s, e = ops.start[idx], ops.end[idx]
    run_end = np.maximum.accumulate(e)
    gap = np.concatenate([[0], s[1:] - run_end[:-1]])
    big = gap >= gap_min

    def idle(i: int, iteration: int | None = None, before: int | None = None) -> IdleGap:
        c = causes.get(int(run_end[i - 1]))
        return IdleGap(int(gap[i]), c.op_name if c is not None and c.op_name else None, iteration, before)

    out: list[Segment] = []
    for seg in fold(ops.cat[idx], 0, len(idx)):
        if seg[0] == "run":
            lo, hi = seg[1], seg[2]
            cuts = [lo] + [i for i in range(lo + 1, hi) if big[i]] + [hi]
            for a, b in zip(cuts[:-1], cuts[1:], strict=False):
                if a > lo or (a == lo and a > 0 and big[a]):
                    out.append(idle(a))
                sub = idx[a:b]
                out.append(OpRun(int(ops.start[sub[0]] - t0), ops.groups(sub)))
        else:
            _, a, p, c = seg
            if a > 0 and big[a]:
                out.append(idle(a))
            every = idx[a : a + p * c]
            span = float(ops.end[every].max() - ops.start[every[0]]) / c
            inner = tuple(idle(i, (i - a) // p + 1, (i - a) % p + 1) for i in range(a + 1, a + p * c) if big[i])
            out.append(
                Loop(
                    int(ops.start[every[0]] - t0),
                    c,
                    p,
                    span,
                    int((ops.end[every] - ops.start[every]).sum()),
                    ops.groups(every[:p]),
                    inner,
                )
            )
    return tuple(out)


def _sub_ranges(facts: RunFacts, ops: _Ops, ph: Phase, origin: int) -> tuple[SubRange, ...]:
    """The outermost CPU ranges nested inside a phase (``## forward ##``, ``## backward ##``)."""
    tr = facts.trace
    r = tr.ranges
    if len(r) == 0:
        return ()
    sorted_rows, starts = ops.cpu_ranges()
    lo, hi = np.searchsorted(starts, (ph.start_ns, ph.end_ns), "left")
    rows = sorted_rows[lo:hi]  # starting inside the phase, in start order
    rows = rows[
        (r["end_ns"][rows] <= ph.end_ns) & ~((r["start_ns"][rows] == ph.start_ns) & (r["end_ns"][rows] == ph.end_ns))
    ]
    if rows.size == 0:
        return ()
    run_end = np.maximum.accumulate(r["end_ns"][rows])
    outer = np.concatenate([[True], r["start_ns"][rows][1:] >= run_end[:-1]])
    out = []
    for i in rows[outer][:MAX_SUB_RANGES]:
        sel = ops.launched_in(int(r["start_ns"][i]), int(r["end_ns"][i]))
        dur = ops.end[sel] - ops.start[sel]
        w = np.bincount(ops.cat[sel], weights=dur, minlength=len(ops.cats))
        total = float(w.sum())
        top = (
            tuple((ops.cats[c], float(w[c]) / total) for c in np.argsort(-w, kind="stable")[:3] if w[c] > 0)
            if total > 0
            else ()
        )
        out.append(
            SubRange(tr.name(int(r["name"][i])), int(r["start_ns"][i] - origin), int(sel.size), int(dur.sum()), top)
        )
    return tuple(out)


def _items(segments: tuple[Segment, ...]) -> int:
    """How many items the phase's folded story has (a group, a gap, a loop head)."""
    n = 0
    for s in segments:
        if isinstance(s, OpRun):
            n += len(s.groups)
        elif isinstance(s, Loop):
            n += 1 + len(s.body) + len(s.inner_gaps)
        else:
            n += 1
    return n


def _phase(facts: RunFacts, ops: _Ops, ph: Phase, origin: int, causes: dict, whole: bool) -> PhaseStory:
    idx = ops.of_phase(ph, whole)
    at = lambda t: None if t is None else int(t - origin)  # noqa: E731
    first = None
    if idx.size and ph.gpu_start_ns is not None:
        i = idx[np.argmin(ops.start[idx])]
        if ops.launch[i] >= 0:
            first = FirstLaunch(
                int(ops.launch[i] - origin), ops.trace.name(int(ops.name[i])), int(ops.start[i] - ops.launch[i])
            )
    segments: tuple[Segment, ...] = ()
    subs: tuple[SubRange, ...] = ()
    if ph.gpu_start_ns is not None:
        gap_min = max(GAP_FLOOR_NS, int(GAP_SHARE * (ph.gpu_span_ns or 0)))
        segments = _segments(ops, idx, ph.gpu_start_ns, causes, gap_min)
        if not whole and _items(segments) >= LONG_PHASE_ITEMS:
            subs = _sub_ranges(facts, ops, ph, origin)
    return PhaseStory(
        name=ph.name,
        whole=whole,
        ops=int(idx.size),
        kernels=ph.kernel_count,
        memops=ph.memop_count,
        cpu_at_ns=int(ph.start_ns - origin),
        wall_ns=ph.wall_ns,
        gpu_at_ns=at(ph.gpu_start_ns),
        gpu_end_at_ns=at(ph.gpu_end_ns),
        gpu_span_ns=ph.gpu_span_ns,
        gpu_busy_ns=ph.gpu_busy_ns,
        first_launch=first,
        segments=segments,
        sub_ranges=subs,
    )


def _step_time(ph: Phase) -> int:
    return ph.gpu_span_ns if ph.gpu_span_ns is not None else ph.wall_ns


def _family(facts: RunFacts, ops: _Ops, members: list[Phase], fam, origin: int, causes: dict) -> FamilyStory:
    times = np.array([_step_time(p) for p in members], dtype=np.int64)
    rep = members[int(np.argsort(times, kind="stable")[len(times) // 2])]
    steps = tuple(
        StepTime(p.name, int(t), p.gpu_busy_ns, p.kernel_count + p.memop_count)
        for p, t in zip(members, times, strict=True)
    )
    return FamilyStory(
        family=fam.family,
        steps=steps,
        first_at_ns=int(members[0].start_ns - origin),
        min_ns=fam.min_ns,
        max_ns=fam.max_ns,
        mean_ns=fam.mean_ns,
        slope_ns_per_step=fam.slope_ns_per_step,
        r2=fam.r2,
        representative=_phase(facts, ops, rep, origin, causes, False),
    )


def _gemm_rows(facts: RunFacts, phases: list[Phase]) -> tuple[int, int] | None:
    """(min, max) M - rows of the left operand (``gemm_rows``) - of the ``aten::mm`` /
    ``aten::addmm`` calls that start inside the phases' CPU ranges; None when shapes were not
    recorded. Linear in the ops: the calls' starts are sorted once and each phase is a slice."""
    idx, rows = gemm_rows(facts.trace, ("aten::mm", "aten::addmm"))
    if not idx.size:
        return None
    start = facts.trace.ops["start_ns"][idx]
    order = np.argsort(start, kind="stable")
    start, rows = start[order], rows[order]
    inside = np.zeros(start.size + 1, dtype=np.int64)
    for ph in phases:
        inside[np.searchsorted(start, ph.start_ns, "left")] += 1
        inside[np.searchsorted(start, ph.end_ns, "left")] -= 1
    hit = rows[np.cumsum(inside[:-1]) > 0]
    return (int(hit.min()), int(hit.max())) if hit.size else None


def _top(ops: _Ops, idx: np.ndarray) -> tuple[str, float] | None:
    w = np.bincount(ops.cat[idx], weights=ops.end[idx] - ops.start[idx], minlength=len(ops.cats))
    if w.sum() <= 0:
        return None
    c = int(np.argmax(w))
    return ops.cats[c], float(w[c] / w.sum())


def _differs(facts: RunFacts, ops: _Ops, first: Phase, steps: list[Phase]) -> Differs:
    a = ops.of_phase(first, False)
    b = np.concatenate([ops.of_phase(p, False) for p in steps])
    na, nb = set(ops.name[a].tolist()), set(ops.name[b].tolist())
    name = ops.trace.name
    return Differs(
        first=first.name,
        family=steps[0].family or "",
        shared_kernels=len(na & nb),
        only_first=tuple(sorted(name(c) for c in na - nb)),
        only_family=tuple(sorted(name(c) for c in nb - na)),
        gemm_rows_first=_gemm_rows(facts, [first]),
        gemm_rows_family=_gemm_rows(facts, steps),
        gpu_time_first_ns=int((ops.end[a] - ops.start[a]).sum()),
        gpu_time_per_step_ns=float((ops.end[b] - ops.start[b]).sum()) / len(steps),
        ops_first=int(a.size),
        ops_per_step=b.size / len(steps),
        top_first=_top(ops, a),
        top_family=_top(ops, b),
    )


def _summary(facts: RunFacts, ops: _Ops, phs: Phases, phases: list[Phase]) -> StorySummary | None:
    first = phases[0]
    fams = list(phs.families)
    in_family = {f.family for f in fams}
    if not fams and len(phases) == 1:
        return None
    head = (first.name, first.gpu_span_ns, first.gpu_busy_ns, first.wall_ns) if first.family not in in_family else None
    out = []
    for f in fams:
        members = [p for p in phases if p.family == f.family]
        names = {p.name for p in members}
        median = float(np.median([_step_time(q) for q in members]))
        out.append(
            FamilySummary(
                family=f.family,
                count=f.count,
                min_ns=f.min_ns,
                max_ns=f.max_ns,
                mean_ns=f.mean_ns,
                busy_mean_ns=float(np.mean([p.gpu_busy_ns for p in members])),
                outliers=tuple((o.name, o.time_ns, o.ratio) for o in phs.outliers if o.name in names),
                fast=tuple((p.name, _step_time(p)) for p in members if _step_time(p) * 1.5 <= median),
            )
        )
    decode = next((f for f in fams if f.family != first.family), None)
    differs = None
    if decode is not None and first.family not in in_family:
        differs = _differs(facts, ops, first, [p for p in phases if p.family == decode.family])
    return StorySummary(head, tuple(out), differs)


def story(facts: RunFacts) -> Story:
    """The Execution Story's model of one trace (see the module docstring)."""
    phs = facts.analysis.phases
    phases = list(phs.phases)
    ops = _Ops(facts)
    whole = phs.source == "none"
    label = facts.trace.label
    if not phases:
        return Story(label, phs.source, 0, (), None)
    origin = min([phases[0].start_ns] + ([int(ops.start[0])] if len(ops.start) else []))
    causes = {c.start_ns: c for c in facts.gaps}
    fam_of = {f.family: f for f in phs.families}
    blocks: list[PhaseStory | FamilyStory] = []
    seen: set[str] = set()
    for ph in phases:
        fam = fam_of.get(ph.family) if ph.family is not None else None
        if fam is None:
            blocks.append(_phase(facts, ops, ph, origin, causes, whole))
        elif ph.family not in seen:
            seen.add(ph.family)
            blocks.append(_family(facts, ops, [p for p in phases if p.family == ph.family], fam, origin, causes))
    return Story(label, phs.source, len(phases), tuple(blocks), _summary(facts, ops, phs, phases))
