"""Multi-GPU analysis: per-rank compute and communication, clock alignment, stragglers.

Two stages, so that ranks can be summarised in parallel (a process pool or dask workers):

* :func:`rank_summary` (``Trace -> RankSummary``): everything one rank contributes, as small
  arrays (per-collective rows, per-step numbers, totals, a capped set of display intervals); no
  Trace inside, picklable.
* :func:`combine` (``Sequence[RankSummary] -> MultiGpu``): clock alignment, collectives matched
  across ranks (:mod:`.collectives`), per-step load balance and the straggler.

Per rank (interval unions, :mod:`.intervals`; GPU ops = kernels + memops): communication = the
NCCL kernels plus kernels whose name is a known communication kernel (same pattern as the
``communication`` category of the llm taxonomy); compute = every other GPU op. ``C``/``M``/``A``
are the unions of compute, communication and all ops; overlap = ``|C| + |M| - |A|``; exposed
communication = ``|M| - overlap``; idle = window - ``|A|`` with window = first GPU op start to
last GPU op end. Per step the same inside the step's GPU span (first start to last end of the GPU
ops launched in the step); steps are ``ProfilerStep#N`` ranges, or a repeated top-level range
(one family of >= 2 that, from 3 members, passes :mod:`.phases`' loop tests: ``layer_0``..
``layer_31`` are not steps), matched across ranks by step number, else by order.

Clock alignment (offsets added to each rank's times to reach the reference = lowest rank):

1. a shared clock when the source says so (the processes of one nsys export);
2. ``baseTimeNanoseconds`` when every trace has it (recent Kineto writes ``ts`` relative to it);
3. the raw timestamps (older Kineto writes absolute ``ts`` on the host clock);

a clock candidate is accepted when matched collectives then END within ``CLOCK_TOLERANCE_NS``
of each other (median over collectives; NCCL kernels of one collective finish together, the
last data arrival releasing every rank). Otherwise: the ends of matching collectives, rank by
rank outward from the reference (median of the end differences over the collectives a rank
shares with already aligned ranks). The residual (median and max end spread after alignment)
is reported either way; it is 0 by construction only in the median sense with method 3.

Straggler (named only when its mean lateness is at least ``STRAGGLER_MIN_LATE_NS`` and 5x the
clock-alignment residual): for every collective matched on >= 2 ranks, the last-arriving rank and the wait it
caused (sum over the other ranks of last arrival - their arrival). The straggler is the rank
that caused the most wait; its evidence is how often it arrived last, how late (its arrival -
the median arrival of the others), the wait caused, and per step its compute and its idle time
against the others' (more compute: more GPU work; same compute but more idle: its host submits
the work late, which also shows as its steps starting late on the GPU). Load imbalance per step is max / mean of the ranks' compute time.

Waiting inside collectives: an NCCL kernel that starts before the last rank of its collective
arrives spins on the GPU until then; that part of its duration (``spin = min(last arrival -
its arrival, its duration)`` per matched collective, :mod:`.collectives`) is GPU op time that
is not work. Per rank, ``spin_ns`` is the union of its spin intervals and ``spin_exposed_ns``
the part with no compute kernel beside it (``RankSummary.compute_in_comm``, the exact compute
union inside the communication union); ``busy_ns - spin_exposed_ns`` is the GPU time doing
work, ``comm_ns - spin_ns`` the communication that was transfer. ``MultiGpu.rank_wait_ns`` maps
rank -> ``spin_ns``; it is None with one rank: one trace cannot tell waiting from transfer.
Its error is about the clock-alignment residual per collective.

Limits: a rank whose trace covers other collectives than its peers' (different profiler
windows) and has no "Seq" arg is mis-matched (order of occurrence); the timeline's display
intervals merge the shortest gaps beyond ``DISPLAY_MAX`` intervals per rank (the numbers are
computed from the exact unions).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from . import intervals
from .collectives import (
    CollectiveGroup,
    CollectiveStat,
    Matching,
    RankCollectives,
    collective_stats,
    group_collectives,
    match_collectives,
    matched_times,
    rank_collectives,
)
from .phases import phases
from ..errors import UsageError
from ..ingest.ranks import check_ranks

COMM_KERNEL = re.compile(r"nccl|all_?reduce|reduce_?scatter|all_?gather|all_?to_?all|sendrecv|"
                         r"cross_device_reduce|nvshmem", re.IGNORECASE)
CLOCK_TOLERANCE_NS = 50_000
DISPLAY_MAX = 4096


# ------------------------------------------------------------------ per rank



STRAGGLER_MIN_LATE_NS = 10_000  # 10 us: below it, arrival order is noise (launch jitter)

@dataclass(frozen=True, eq=False)
class RankSteps:
    """A rank's steps (arrays of equal length, in time order); times on the rank's clock."""

    names: tuple[str, ...]
    numbers: np.ndarray      # int64 step number from the name, -1 when none
    start_ns: np.ndarray     # GPU span of the step
    end_ns: np.ndarray
    compute_ns: np.ndarray
    comm_ns: np.ndarray
    overlap_ns: np.ndarray
    idle_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True, eq=False)
class RankSummary:
    """What one rank contributes to :func:`combine` (see the module docstring)."""

    rank: int | None
    world_size: int | None
    source: str
    label: str
    device: str | None
    base_time_ns: int | None        # Kineto baseTimeNanoseconds
    clock_domain: str | None        # equal for ranks known to share one clock (one nsys export)
    window_start_ns: int | None
    window_end_ns: int | None
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    exposed_comm_ns: int
    idle_ns: int
    collectives: RankCollectives
    steps: RankSteps
    compute_display: tuple[np.ndarray, np.ndarray]   # capped union of compute (starts, ends)
    comm_display: tuple[np.ndarray, np.ndarray]
    # exact compute union inside the communication union (disjoint, sorted): what ran beside
    # the collectives, so that waiting inside them can be split into exposed and hidden
    compute_in_comm: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))

    @property
    def window_ns(self) -> int:
        if self.window_start_ns is None:
            return 0
        return self.window_end_ns - self.window_start_ns


def _covered(s: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the disjoint sorted intervals ``(s, e)`` inside each window ``[lo, hi)``."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    if s.size == 0:
        return np.zeros(lo.size, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)])

    def upto(t):  # covered length before t: full intervals before the last started one, plus its part
        i = np.searchsorted(s, t, side="right")
        j = np.maximum(i - 1, 0)
        return np.where(i > 0, cum[j] + np.minimum(e[j], t) - s[j], 0)

    return (upto(hi) - upto(lo)).astype(np.int64)


def _intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two unions (each disjoint and sorted), as disjoint sorted intervals."""
    t = np.concatenate([a[0], b[0], a[1], b[1]]).astype(np.int64)
    n = a[0].size + b[0].size
    d = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    order = np.lexsort((d, t))  # at equal times ends first: touching intervals share nothing
    t, c = t[order], np.cumsum(d[order])
    i = np.flatnonzero(c[:-1] == 2)
    keep = t[i + 1] > t[i]
    return t[i][keep], t[i + 1][keep]


def _cap(s: np.ndarray, e: np.ndarray, max_n: int = DISPLAY_MAX) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_n`` disjoint intervals: the shortest gaps are filled."""
    if s.size <= max_n:
        return s.copy(), e.copy()
    gaps = s[1:] - e[:-1]
    keep = np.sort(np.argsort(gaps, kind="stable")[-(max_n - 1):])
    return np.concatenate([s[:1], s[keep + 1]]), np.concatenate([e[keep], e[-1:]])


def _steps(trace: Trace, cu, mu, au) -> RankSteps:
    ph = phases(trace)
    chosen = [p for p in ph.phases if p.gpu_start_ns is not None]
    if ph.source != "ProfilerStep":
        fams = {p.family for p in chosen}
        loops = {f.family for f in ph.families}
        # one family, and a loop of steps (phases.py's tests a-c), not the layers of one pass
        if len(fams) != 1 or len(chosen) < 2 or (len(chosen) >= 3 and not fams <= loops):
            chosen = []
    lo = np.array([p.gpu_start_ns for p in chosen], dtype=np.int64)
    hi = np.array([p.gpu_end_ns for p in chosen], dtype=np.int64)
    c, m, a = (_covered(*u, lo, hi) for u in (cu, mu, au))
    return RankSteps(
        names=tuple(p.name for p in chosen),
        numbers=np.array([p.step if p.step is not None else -1 for p in chosen], dtype=np.int64),
        start_ns=lo, end_ns=hi, compute_ns=c, comm_ns=m, overlap_ns=c + m - a, idle_ns=(hi - lo) - a,
    )


def rank_summary(trace: Trace) -> RankSummary:
    """One rank's summary: totals, steps, collectives and display intervals (no Trace kept)."""
    k, mo = trace.kernels, trace.memops
    rc = rank_collectives(trace)
    comm_k = np.zeros(len(k), dtype=bool)
    comm_k[rc.kernel_index] = True
    if len(k):
        codes = np.unique(k["name"])
        named = np.array([c for c in codes if COMM_KERNEL.search(trace.name(int(c)))], dtype=np.int32)
        comm_k |= np.isin(k["name"], named)
    cs = np.concatenate([k["start_ns"][~comm_k], mo["start_ns"]]).astype(np.int64)
    ce = np.concatenate([k["end_ns"][~comm_k], mo["end_ns"]]).astype(np.int64)
    ms, me = k["start_ns"][comm_k].astype(np.int64), k["end_ns"][comm_k].astype(np.int64)
    cu, mu = intervals.union(cs, ce), intervals.union(ms, me)
    au = intervals.union(np.concatenate([cs, ms]), np.concatenate([ce, me]))
    c_len, m_len, a_len = (int((u[1] - u[0]).sum()) for u in (cu, mu, au))
    has = au[0].size > 0
    w0 = int(au[0][0]) if has else None
    w1 = int(au[1][-1]) if has else None
    steps = _steps(trace, cu, mu, au)
    # each collective's step: the step whose GPU span holds its start
    idx = np.searchsorted(steps.start_ns, rc.start_ns, side="right") - 1
    ok = (idx >= 0) & (rc.start_ns < steps.end_ns[np.maximum(idx, 0)]) if len(steps) else np.zeros(len(rc), bool)
    rc = rc.with_steps(np.where(ok, idx, -1))
    meta = trace.meta
    base = meta.extra.get("baseTimeNanoseconds") if meta.extra else None
    overlap = c_len + m_len - a_len
    return RankSummary(
        rank=meta.rank, world_size=meta.world_size, source=meta.source_path, label=trace.label,
        device=meta.devices[0].name if meta.devices else None,
        base_time_ns=int(base) if isinstance(base, (int, float)) else None,
        clock_domain=f"nsys:{meta.source_path}" if meta.source_format.startswith("nsys") else None,
        window_start_ns=w0, window_end_ns=w1, compute_ns=c_len, comm_ns=m_len, overlap_ns=overlap,
        exposed_comm_ns=m_len - overlap, idle_ns=((w1 - w0) - a_len) if has else 0,
        collectives=rc, steps=steps, compute_display=_cap(*cu), comm_display=_cap(*mu),
        compute_in_comm=_intersect(cu, mu),
    )


# ------------------------------------------------------------------ clock alignment


@dataclass(frozen=True)
class ClockAlignment:
    method: str                      # "shared_clock", "base_time", "raw_timestamps", "collective_ends", "none"
    reference_rank: int
    offsets_ns: tuple[int, ...]      # per rank (MultiGpu.ranks order), added to that rank's times
    residual_median_ns: float | None  # median end spread of matched collectives after alignment
    residual_max_ns: int | None
    matched_collectives: int         # collectives on >= 2 ranks that the residual is measured on
    unaligned_ranks: tuple[int, ...]  # ranks sharing no collective with the others (clock or 0 used)


def _spread(E: np.ndarray, off: np.ndarray) -> np.ndarray:
    x = E + off
    n = (~np.isnan(x)).sum(axis=1)
    hi = np.where(np.isnan(x), -np.inf, x).max(axis=1, initial=-np.inf)
    lo = np.where(np.isnan(x), np.inf, x).min(axis=1, initial=np.inf)
    return (hi - lo)[n >= 2]


def _end_offsets(E: np.ndarray) -> np.ndarray:
    """Offsets making matched ends agree, outward from column 0; NaN for unreachable ranks."""
    n = E.shape[1]
    off = np.full(n, np.nan)
    off[0] = 0.0
    progress = True
    while progress:
        progress = False
        done = ~np.isnan(off)
        x = E[:, done] + off[done]
        cnt = (~np.isnan(x)).sum(axis=1)
        ref = np.where(cnt > 0, np.nansum(x, axis=1) / np.maximum(cnt, 1), np.nan)
        for j in np.flatnonzero(~done):
            d = ref - E[:, j]
            d = d[~np.isnan(d)]
            if d.size:
                off[j] = float(np.median(d))
                progress = True
    return off


def align_clocks(summaries: Sequence[RankSummary], ranks: Sequence[int], per_rank: Sequence[RankCollectives],
                 m: Matching, method: str = "auto") -> ClockAlignment:
    """Offsets per rank (see the module docstring). ``method``: "auto", or force one of
    "shared_clock" / "base_time" / "raw_timestamps" / "collective_ends" / "none"."""
    n = len(summaries)
    coll = ~np.array([k[1] for k in m.keys], dtype=bool) if m.keys else np.zeros(0, bool)
    E = matched_times(per_rank, m, "end_ns")[coll] if m.keys else np.zeros((0, n))
    E = E[(~np.isnan(E)).sum(axis=1) >= 2] if E.size else E
    # offsets relative to the first rank's times keep float64 exact (epoch ns lose precision)
    base0 = np.nanmin(E) if E.size else 0.0
    E = E - base0 if E.size else E
    cands: list[tuple[str, np.ndarray]] = []
    domains = {s.clock_domain for s in summaries}
    if None not in domains and len(domains) == 1:
        cands.append(("shared_clock", np.zeros(n)))
    if all(s.base_time_ns is not None for s in summaries):
        b = np.array([s.base_time_ns for s in summaries], dtype=np.int64)
        cands.append(("base_time", (b - b[0]).astype(np.float64)))
    cands.append(("raw_timestamps", np.zeros(n)))
    chosen = None
    if method in ("auto", "collective_ends"):
        if method == "auto":
            for name, off in cands:
                sp = _spread(E, off)
                if sp.size and float(np.median(sp)) <= CLOCK_TOLERANCE_NS:
                    chosen = (name, off)
                    break
        if chosen is None and E.shape[0]:
            off = _end_offsets(E)
            fallback = cands[0][1]
            unreached = np.isnan(off)
            off[unreached] = fallback[unreached] - fallback[0]
            chosen = ("collective_ends", off)
        if chosen is None:  # nothing to check a clock against: trust the best clock we have
            chosen = cands[0] if method == "auto" else ("none", np.zeros(n))
    elif method == "none":
        chosen = ("none", np.zeros(n))
    else:
        found = [c for c in cands if c[0] == method]
        if not found:
            raise UsageError(f"clock alignment {method!r} is not possible for these traces "
                             f"(possible: {', '.join(c[0] for c in cands)}, collective_ends)")
        chosen = found[0]
    name, off = chosen
    off = np.rint(off).astype(np.int64)
    sp = _spread(E, off.astype(np.float64))
    present = ~np.isnan(E)
    shared = present.sum(axis=0) if E.size else np.zeros(n, dtype=np.int64)
    unaligned = tuple(int(ranks[j]) for j in range(n) if n > 1 and shared[j] == 0)
    return ClockAlignment(
        method=name, reference_rank=int(ranks[0]), offsets_ns=tuple(int(x) for x in off),
        residual_median_ns=float(np.median(sp)) if sp.size else None,
        residual_max_ns=int(sp.max()) if sp.size else None, matched_collectives=int(sp.size),
        unaligned_ranks=unaligned)


# ------------------------------------------------------------------ combine


@dataclass(frozen=True)
class RankBalance:
    """One rank's totals over its whole trace, plus what the matched collectives say of it."""

    rank: int
    label: str
    device: str | None
    window_ns: int
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    exposed_comm_ns: int
    idle_ns: int
    wait_ns: int             # time its collectives waited for the last rank (sum)
    last_count: int          # collectives it was last to arrive at
    wait_caused_ns: int      # wait of the others at those collectives (sum)
    late_mean_ns: float | None  # mean of (its arrival - median arrival of the others) where it was last
    # Time its NCCL kernels spun waiting for the last peer (union of the spin intervals of the
    # matched collectives), and the part of it with no compute beside it: GPU op time that was
    # not work. None with one rank (the wait cannot be told from one trace).
    spin_ns: int | None = None
    spin_exposed_ns: int | None = None
    busy_ns: int = 0         # union of all its GPU ops (window - idle)


@dataclass(frozen=True)
class StepBalance:
    """One step across ranks (matched by number, else order)."""

    key: int                           # step number, or position when steps have no number
    name: str                          # the first rank's step name
    ranks: tuple[int, ...]
    start_ns: tuple[int, ...]          # GPU span per rank, on the reference clock
    end_ns: tuple[int, ...]
    span_ns: tuple[int, ...]
    compute_ns: tuple[int, ...]
    comm_ns: tuple[int, ...]
    exposed_comm_ns: tuple[int, ...]
    idle_ns: tuple[int, ...]
    imbalance: float | None            # max / mean compute; None when mean is 0
    slowest_rank: int                  # most compute
    last_rank: int | None              # the rank that caused the most wait at this step's collectives
    wait_ns: int                       # wait at this step's collectives (all ranks)


@dataclass(frozen=True)
class Straggler:
    rank: int
    last_count: int                    # collectives it arrived last at
    compared: int                      # collectives matched on >= 2 ranks
    wait_caused_ns: int
    total_wait_ns: int                 # wait at every matched collective (all ranks)
    late_mean_ns: float | None
    steps_last: int                    # steps where it caused the most wait
    steps: int
    compute_excess_mean_ns: float | None  # per step: its compute - mean of the others' (mean over steps)
    idle_excess_mean_ns: float | None     # per step: its idle time - mean of the others' (mean over steps)
    start_late_mean_ns: float | None      # per step: its first GPU op - the others' median (aligned clock)


@dataclass(frozen=True)
class MultiGpu:
    ranks: tuple[int, ...]
    summaries: tuple[RankSummary, ...]
    alignment: ClockAlignment
    per_rank: tuple[RankBalance, ...]
    collectives: tuple[CollectiveStat, ...]
    groups: tuple[CollectiveGroup, ...]
    steps: tuple[StepBalance, ...]
    straggler: Straggler | None
    imbalance_max: float | None        # max over steps (whole run when no steps) of max/mean compute
    comm_share: float | None           # communication union / GPU span, mean over ranks (steps when known)
    exposed_share: float | None        # exposed / communication, same basis
    rank_wait_ns: dict[int, int] | None = None  # per rank: RankBalance.spin_ns; None with one rank
    # one sentence (straggler, where the others wait, communication share): set by
    # ``analysis.results.multigpu_of``, None when nothing was matched or not yet told
    headline: str | None = None

    def summary(self, rank: int) -> RankSummary:
        return self.summaries[self.ranks.index(rank)]


def _rank_of(summaries: Sequence[RankSummary]) -> list[int]:
    return check_ranks([s.rank for s in summaries], [s.source for s in summaries])


def _step_keys(s: RankSummary) -> list[int]:
    nums = s.steps.numbers
    return nums.tolist() if len(nums) and (nums >= 0).all() and np.unique(nums).size == nums.size \
        else list(range(len(s.steps)))


def _steps_balance(summaries, ranks, stats, offsets) -> tuple[StepBalance, ...]:
    keys = [_step_keys(s) for s in summaries]
    with_steps = [j for j, s in enumerate(summaries) if len(s.steps)]
    if not with_steps:
        return ()
    common = sorted(set.intersection(*(set(keys[j]) for j in with_steps)))
    out = []
    for key in common:
        js = with_steps
        pos = [keys[j].index(key) for j in js]
        st = [summaries[j].steps for j in js]
        comp = np.array([s.compute_ns[p] for s, p in zip(st, pos)], dtype=np.int64)
        comm = np.array([s.comm_ns[p] for s, p in zip(st, pos)], dtype=np.int64)
        ovl = np.array([s.overlap_ns[p] for s, p in zip(st, pos)], dtype=np.int64)
        caused: dict[int, int] = {}
        wait = 0
        first_rank_pos = dict(zip((ranks[j] for j in js), pos))
        for c in stats:
            if c.step is None or c.last_rank is None or first_rank_pos.get(c.ranks[0]) != c.step:
                continue
            caused[c.last_rank] = caused.get(c.last_rank, 0) + c.total_wait_ns
            wait += c.total_wait_ns
        mean = float(comp.mean())
        out.append(StepBalance(
            key=int(key), name=st[0].names[pos[0]], ranks=tuple(ranks[j] for j in js),
            start_ns=tuple(int(s.start_ns[p]) + offsets[j] for s, p, j in zip(st, pos, js)),
            end_ns=tuple(int(s.end_ns[p]) + offsets[j] for s, p, j in zip(st, pos, js)),
            span_ns=tuple(int(s.end_ns[p] - s.start_ns[p]) for s, p in zip(st, pos)),
            compute_ns=tuple(comp.tolist()), comm_ns=tuple(comm.tolist()),
            exposed_comm_ns=tuple((comm - ovl).tolist()),
            idle_ns=tuple(int(s.idle_ns[p]) for s, p in zip(st, pos)),
            imbalance=float(comp.max() / mean) if mean > 0 else None,
            slowest_rank=int(ranks[js[int(np.argmax(comp))]]),
            last_rank=max(caused, key=lambda r: (caused[r], -r)) if caused else None, wait_ns=int(wait),
        ))
    return tuple(out)


def combine(summaries: Sequence[RankSummary], *, clock: str = "auto") -> MultiGpu:
    """All ranks together (see the module docstring); ``clock`` forces an alignment method."""
    if not summaries:
        raise UsageError("no rank summaries to combine")
    ranks = _rank_of(summaries)
    order = np.argsort(ranks, kind="stable")
    summaries = tuple(summaries[i] for i in order)
    ranks = [ranks[i] for i in order]
    per = [s.collectives for s in summaries]
    m = match_collectives(per, ranks)
    al = align_clocks(summaries, ranks, per, m, clock)
    stats = collective_stats(per, m, al.offsets_ns)
    multi = [c for c in stats if len(c.ranks) > 1]
    balances = []
    spins = _spin_intervals(multi, ranks, al.offsets_ns)
    for j, s in enumerate(summaries):
        r = ranks[j]
        wait = sum(c.wait_ns[c.ranks.index(r)] for c in multi if r in c.ranks)
        spin = exposed = None
        if len(ranks) > 1:
            su = intervals.union(*spins[j])
            spin = int((su[1] - su[0]).sum())
            exposed = spin - intervals.intersection_length(su, s.compute_in_comm)
        mine = [c for c in multi if c.last_rank == r]
        late = [c.start_ns[c.ranks.index(r)] - float(np.median([x for k, x in zip(c.ranks, c.start_ns) if k != r]))
                for c in mine]
        balances.append(RankBalance(
            rank=r, label=s.label, device=s.device, window_ns=s.window_ns, compute_ns=s.compute_ns,
            comm_ns=s.comm_ns, overlap_ns=s.overlap_ns, exposed_comm_ns=s.exposed_comm_ns, idle_ns=s.idle_ns,
            wait_ns=int(wait), last_count=len(mine), wait_caused_ns=int(sum(c.total_wait_ns for c in mine)),
            late_mean_ns=float(np.mean(late)) if late else None, spin_ns=spin, spin_exposed_ns=exposed,
            busy_ns=s.window_ns - s.idle_ns))
    steps = _steps_balance(summaries, ranks, stats, al.offsets_ns)
    straggler = None
    if multi:
        top = max(balances, key=lambda b: (b.wait_caused_ns, b.last_count, -b.rank))
        # Named only when its lateness stands out of the clock noise: a mean lateness of at least
        # STRAGGLER_MIN_LATE_NS and of 5x the alignment residual (ranks that all arrive within the
        # residual have no straggler, whoever happens to be last).
        noise = 5 * (al.residual_median_ns or 0)
        if top.wait_caused_ns > 0 and (top.late_mean_ns or 0) >= max(STRAGGLER_MIN_LATE_NS, noise):
            ex, idle, start = [], [], []
            for st in steps:
                if top.rank in st.ranks and len(st.ranks) > 1:
                    i = st.ranks.index(top.rank)
                    ex.append(st.compute_ns[i] - float(np.mean([v for k, v in enumerate(st.compute_ns) if k != i])))
                    idle.append(st.idle_ns[i] - float(np.mean([v for k, v in enumerate(st.idle_ns) if k != i])))
                    start.append(st.start_ns[i] - float(np.median([v for k, v in enumerate(st.start_ns) if k != i])))
            straggler = Straggler(
                rank=top.rank, last_count=top.last_count, compared=len(multi), wait_caused_ns=top.wait_caused_ns,
                total_wait_ns=int(sum(c.total_wait_ns for c in multi)), late_mean_ns=top.late_mean_ns,
                steps_last=sum(1 for st in steps if st.last_rank == top.rank), steps=len(steps),
                compute_excess_mean_ns=float(np.mean(ex)) if ex else None,
                idle_excess_mean_ns=float(np.mean(idle)) if idle else None,
                start_late_mean_ns=float(np.mean(start)) if start else None)
    if steps:
        imb = [st.imbalance for st in steps if st.imbalance is not None]
        span = sum(sum(st.span_ns) for st in steps)
        comm = sum(sum(st.comm_ns) for st in steps)
        exposed = sum(sum(st.exposed_comm_ns) for st in steps)
    else:
        comp = np.array([b.compute_ns for b in balances], dtype=np.float64)
        imb = [float(comp.max() / comp.mean())] if comp.size > 1 and comp.mean() > 0 else []
        span = sum(b.window_ns for b in balances)
        comm = sum(b.comm_ns for b in balances)
        exposed = sum(b.exposed_comm_ns for b in balances)
    return MultiGpu(
        ranks=tuple(ranks), summaries=summaries, alignment=al, per_rank=tuple(balances), collectives=stats,
        groups=group_collectives(stats), steps=steps, straggler=straggler,
        imbalance_max=max(imb) if imb else None, comm_share=comm / span if span > 0 else None,
        exposed_share=exposed / comm if comm > 0 else None,
        rank_wait_ns={b.rank: b.spin_ns for b in balances} if len(ranks) > 1 else None)


def _spin_intervals(multi: Sequence[CollectiveStat], ranks: Sequence[int],
                    offsets: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank, on its own clock: ``[arrival, arrival + spin)`` of each matched collective."""
    parts: list[tuple[list[int], list[int]]] = [([], []) for _ in ranks]
    pos = {r: j for j, r in enumerate(ranks)}
    for c in multi:
        for r, s, sp in zip(c.ranks, c.start_ns, c.spin_ns):
            if sp > 0:
                j = pos[r]
                parts[j][0].append(s - offsets[j])
                parts[j][1].append(s - offsets[j] + sp)
    return [(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)) for a, b in parts]
