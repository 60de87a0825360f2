"""The interactive timeline's model: lanes, spans and finding links, built from typed results.

Model
-----
Read only from :class:`~tracestory.analysis.results.Results` (fields, never an analysis
function): per trace shown (the traces the report tells, ``Results.selection``, else the first
:data:`MAX_RUNS`), top to bottom

* a **steps** lane: each phase of ``Analysis.phases`` over its GPU span (first start to last end
  of the GPU ops launched inside it; its CPU range when it launched none); no lane when the
  trace has no phases (source ``"none"``);
* an **idle** lane: every gap between busy periods of all GPU ops (``RunFacts.idle``);
* a **collectives** lane: the GPU ops of a communication category (:data:`COLLECTIVE_CATEGORIES`),
  also shown in their stream's lane;
* one lane per (device, stream) of ``RunFacts.gpu_ops`` (kernels and memops), each op
  coloured by its category.

Times are microseconds (ns resolution) from ``t0``, the earliest GPU op or phase start over the
traces shown (one clock: ranks whose clocks differ are drawn misaligned by that difference).
Spans are stored column-wise, lane after lane, each lane sorted by start; starts are
delta-coded within a lane.

**Cap**: at most :data:`MAX_SPANS` spans are embedded. Beyond that each lane gets a quota (the
small lanes, such as steps and collectives, all their spans; the others an equal share of the
rest) filled with its longest spans, and the rest is dropped; then every lane also carries
:data:`DENSITY_BINS` busy fractions over the full view computed from **all** its spans, which
the page draws as grey shading, and the model says how many spans were dropped and the longest
dropped duration.

**Finding links** (what a click on a finding zooms to), per finding, from typed fields only:

* kernel names: every ``text`` evidence value equal to the name of a GPU op of the trace
  (``top kernel``, ``memory-bound #1``, ``GPU op waiting after the gap``...): its spans are
  highlighted and the view covers their first start to last end;
* phases: every ``text`` evidence value equal to a phase name (``first step: decode_0``), every
  phase the title names as a whole word (``ProfilerStep#5 took 1.9x``), and for a per-family
  rule (``step_trend``, ``step_outlier``) the phases of the family its title starts with
  (``decode: 16 steps``);
* collectives: a finding about communication (:data:`COMM_RULES`) highlights every GPU op of a
  communication category;
* gaps: ``gpu_idle`` -> the gaps of ``RunFacts.gaps`` (the longest idle gaps of 1 ms or more),
  else ``Timeline.largest_gaps``; ``cpu_stall`` -> the gaps of ``RunFacts.gaps`` whose CPU cause
  (``GapCause.op_name``) the title names (``inside NAME:``).

A finding none of these match (a share of the whole run, a memory peak) gets no link and says so.
Multi-GPU findings are matched by kernel name against every trace shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..analysis.findings import Finding
from ..analysis.results import Results, RunResults

MAX_RUNS = 8  # traces drawn when the report does not select them
MAX_SPANS = 200_000  # spans embedded in the page; beyond, the longest are kept
DENSITY_BINS = 2000  # columns of the full-view busy shading when spans are dropped
COLLECTIVE_CATEGORIES = ("communication", "allreduce")
PHASE_CATEGORY = -1  # category index of a steps-lane span
IDLE_CATEGORY = -2  # category index of an idle-lane span
FAMILY_RULES = ("step_trend", "step_outlier")
# Findings about communication: they point at every collective of the trace(s).
COMM_RULES = (
    "communication",
    "multigpu_communication",
    "multigpu_rank_wait",
    "multigpu_straggler",
    "multigpu_bandwidth",
)

# Category colours: a fixed palette in taxonomy order (colour-blind friendly, Okabe-Ito first).
PALETTE = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#cc79a7",
    "#56b4e9",
    "#d55e00",
    "#f0e442",
    "#7f3c8d",
    "#11a579",
    "#3969ac",
    "#8c564b",
    "#e73f74",
    "#80ba5a",
    "#e68310",
    "#008695",
    "#cf1c90",
)
OTHER_COLOUR = "#9a9a9a"


@dataclass(frozen=True)
class Lane:
    label: str
    kind: str  # "steps", "idle", "collectives" or "stream"
    run: int  # index into Results.runs


@dataclass(frozen=True)
class FindingLink:
    title: str
    severity: str
    rule: str
    trace: str  # label of the trace it is about ("" for a multi-GPU finding)
    view_ns: tuple[int, int] | None  # window to zoom to (absolute ns), None: no link
    windows_ns: tuple[tuple[int, int], ...]  # phases / gaps it is about
    names: tuple[str, ...]  # GPU op names it is about
    why: str  # what the link shows, or why there is none
    runs: tuple[int, ...] = ()  # the traces (Results.runs indices) whose lanes it highlights


@dataclass(frozen=True, eq=False)
class TimelineModel:
    """Everything the page draws; times in ns here, converted to us by :func:`to_json`."""

    t0_ns: int
    end_ns: int
    lanes: tuple[Lane, ...]
    lane_of: np.ndarray  # per span
    start_ns: np.ndarray  # int64, absolute
    end_ns_: np.ndarray  # int64, absolute
    name: np.ndarray  # index into names
    category: np.ndarray  # index into categories, PHASE_CATEGORY or IDLE_CATEGORY
    names: tuple[str, ...]
    categories: tuple[str, ...]
    findings: tuple[FindingLink, ...]
    total_spans: int  # before the cap
    dropped_max_ns: int  # longest dropped span (0 when none)
    density: np.ndarray | None  # [lane, DENSITY_BINS] busy fraction over the full view, when dropped
    runs_omitted: int  # traces not drawn

    @property
    def dropped(self) -> int:
        return self.total_spans - int(self.start_ns.size)


class _Names:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def codes(self, values) -> np.ndarray:
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            out[i] = self.index.setdefault(v, len(self.index))
        return out


def _runs_shown(results: Results) -> list[int]:
    if results.selection is not None:
        return sorted(results.selection.shown)
    return list(range(min(len(results.runs), MAX_RUNS)))


def _run_lanes(i: int, run: RunResults, prefix: str, names: _Names, cats: dict[str, int]):
    """(lanes, [(start, end, name code, category)] per lane) of one trace."""
    ops, trace = run.facts.gpu_ops, run.trace
    cat_code = np.array([cats.setdefault(c, len(cats)) for c in ops.categories] or [0], dtype=np.int64)
    lanes: list[Lane] = []
    cols: list[tuple] = []
    phases = run.analysis.phases
    if phases is not None and phases.source != "none" and phases.phases:
        ps = phases.phases
        s = np.array([p.gpu_start_ns if p.gpu_start_ns is not None else p.start_ns for p in ps], dtype=np.int64)
        e = np.array([p.gpu_end_ns if p.gpu_end_ns is not None else p.end_ns for p in ps], dtype=np.int64)
        lanes.append(Lane(f"{prefix}steps ({phases.source})", "steps", i))
        cols.append((s, e, names.codes([p.name for p in ps]), np.full(len(ps), PHASE_CATEGORY)))
    idle = run.facts.idle
    if len(idle):
        lanes.append(Lane(f"{prefix}idle (no GPU op running)", "idle", i))
        cols.append(
            (
                idle.start_ns,
                idle.end_ns,
                np.full(len(idle), names.codes(["idle"])[0]),
                np.full(len(idle), IDLE_CATEGORY),
            )
        )
    if not len(ops):
        return lanes, cols
    used, inverse = np.unique(np.asarray(ops.name, dtype=np.int64), return_inverse=True)
    name = names.codes([trace.name(int(c)) for c in used])[inverse.reshape(-1)]
    cat = cat_code[np.asarray(ops.category, dtype=np.int64)]
    comm = np.isin(np.asarray(ops.category), [k for k, c in enumerate(ops.categories) if c in COLLECTIVE_CATEGORIES])
    if comm.any():
        lanes.append(Lane(f"{prefix}collectives", "collectives", i))
        cols.append((ops.start_ns[comm], ops.end_ns[comm], name[comm], cat[comm]))
    dev, stream = np.asarray(ops.device, dtype=np.int64), np.asarray(ops.stream, dtype=np.int64)
    key = (dev << 32) + (stream & 0xFFFFFFFF)  # one sortable key per (device, stream)
    for k in np.unique(key):
        m = key == k
        d, st = int(dev[m][0]), int(stream[m][0])
        lanes.append(Lane(f"{prefix}GPU {d} stream {st}", "stream", i))
        cols.append((ops.start_ns[m], ops.end_ns[m], name[m], cat[m]))
    return lanes, cols


def build_timeline(results: Results, max_spans: int | None = None) -> TimelineModel | None:
    """The :class:`TimelineModel` of ``results`` with at most ``max_spans`` spans (default
    :data:`MAX_SPANS`); None when no trace has a GPU op or phase."""
    max_spans = MAX_SPANS if max_spans is None else max_spans
    shown = _runs_shown(results)
    names, cats = _Names(), dict[str, int]()
    lanes: list[Lane] = []
    cols: list[tuple] = []
    for i in shown:
        run = results.runs[i]
        rank = run.trace.meta.rank
        prefix = "" if len(shown) == 1 else f"rank {rank} · " if rank is not None else f"trace {i} · "
        ls, cs = _run_lanes(i, run, prefix, names, cats)
        lanes += ls
        cols += cs
    if not cols or not sum(len(c[0]) for c in cols):
        return None
    lane_of = np.concatenate([np.full(len(c[0]), k, dtype=np.int64) for k, c in enumerate(cols)])
    start = np.concatenate([np.asarray(c[0], dtype=np.int64) for c in cols])
    end = np.maximum(np.concatenate([np.asarray(c[1], dtype=np.int64) for c in cols]), start)
    name = np.concatenate([c[2] for c in cols]).astype(np.int64)
    cat = np.concatenate([c[3] for c in cols]).astype(np.int64)
    t0, t1 = int(start.min()), int(end.max())

    total, density, dropped_max = int(start.size), None, 0
    keep = np.ones(total, dtype=bool)
    if total > max_spans:
        dur = end - start
        keep = _keep_longest(lane_of, dur, len(lanes), max_spans)
        dropped_max = int(dur[~keep].max())
        density = _density(lane_of, start, end, len(lanes), t0, t1)
    order = np.lexsort((start, lane_of))
    order = order[keep[order]]
    model_names = tuple(sorted(names.index, key=names.index.__getitem__))
    links = tuple(_links(results, shown))
    return TimelineModel(
        t0_ns=t0,
        end_ns=t1,
        lanes=tuple(lanes),
        lane_of=lane_of[order],
        start_ns=start[order],
        end_ns_=end[order],
        name=name[order],
        category=cat[order],
        names=model_names,
        categories=tuple(sorted(cats, key=cats.__getitem__)),
        findings=links,
        total_spans=total,
        dropped_max_ns=dropped_max,
        density=density,
        runs_omitted=len(results.runs) - len(shown),
    )


def _keep_longest(lane_of: np.ndarray, dur: np.ndarray, n_lanes: int, cap: int) -> np.ndarray:
    """Which spans to embed: each lane gets a quota (lanes from the smallest up: all its spans,
    or an equal share of what is left), filled with its longest spans (ties: table order)."""
    counts = np.bincount(lane_of, minlength=n_lanes)
    quota = np.zeros(n_lanes, dtype=np.int64)
    left = cap
    for i, lane in enumerate(np.argsort(counts, kind="stable")):
        quota[lane] = min(int(counts[lane]), left // (n_lanes - i))
        left -= quota[lane]
    order = np.lexsort((np.arange(dur.size), -dur, lane_of))  # per lane, longest first
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(dur.size, dtype=np.int64)
    rank[order] = np.arange(dur.size) - np.repeat(first, counts)
    return rank < quota[lane_of]


def _density(lane_of, start, end, n_lanes: int, t0: int, t1: int) -> np.ndarray:
    """Busy fraction of each of DENSITY_BINS equal columns of [t0, t1], per lane: the time its
    spans cover in the column over the column's width (spans of one lane that overlap add up;
    clipped to 1).

    In column units a span [a, b) covers ``R_a(x) - R_b(x)`` of [0, x], where ``R_c(x) =
    max(0, x - c)``; summed over a lane's spans at the column edges x = 0..BINS (a sorted
    search and a cumulative sum), the difference between neighbouring edges is each column's
    covered time."""
    width = max(t1 - t0, 1) / DENSITY_BINS
    edges = np.arange(DENSITY_BINS + 1, dtype=np.float64)
    out = np.zeros((n_lanes, DENSITY_BINS))

    def ramp(c: np.ndarray) -> np.ndarray:  # sum over c of max(0, x - c) at every edge x
        c = np.sort(c)
        k = np.searchsorted(c, edges, side="right")
        csum = np.concatenate([[0.0], np.cumsum(c)])
        return k * edges - csum[k]

    for lane in np.unique(lane_of):
        m = lane_of == lane
        g = ramp((start[m] - t0) / width) - ramp((end[m] - t0) / width)
        out[lane] = np.diff(g)
    return np.clip(out, 0.0, 1.0)


_INSIDE = re.compile(r"inside (.+?): \d")


def _links(results: Results, shown: list[int]):
    for i in shown:
        run = results.runs[i]
        for f in run.findings:
            yield _link(f, [run], run.trace.label, (i,))
    runs = [results.runs[i] for i in shown]
    for f in results.multigpu_findings:
        yield _link(f, runs, "", tuple(shown))


def _link(f: Finding, runs: list[RunResults], label: str, run_index: tuple[int, ...]) -> FindingLink:
    texts = {e.value for e in f.evidence if e.unit == "text" and isinstance(e.value, str)}
    windows: list[tuple[int, int]] = []
    kernel_names: list[str] = []
    span_lo, span_hi = [], []
    for run in runs:
        ops, trace = run.facts.gpu_ops, run.trace
        if (texts or f.rule in COMM_RULES) and len(ops):
            used = np.unique(np.asarray(ops.name))
            hit = [int(c) for c in used if trace.name(int(c)) in texts]
            m = np.isin(np.asarray(ops.name), hit)
            if f.rule in COMM_RULES:  # every collective of the trace
                comm = [k for k, c in enumerate(ops.categories) if c in COLLECTIVE_CATEGORIES]
                m |= np.isin(np.asarray(ops.category), comm)
                hit = sorted(set(hit) | {int(c) for c in np.unique(np.asarray(ops.name)[m])})
            if m.any():
                kernel_names += [trace.name(c) for c in hit]
                span_lo.append(int(ops.start_ns[m].min()))
                span_hi.append(int(ops.end_ns[m].max()))
        phases = run.analysis.phases.phases if run.analysis.phases is not None else ()
        family = f.title.split(":", 1)[0] if f.rule in FAMILY_RULES and ":" in f.title else None
        for p in phases:
            named = p.name in texts or re.search(rf"(?<![\w#.]){re.escape(p.name)}(?![\w#.])", f.title)
            if named or (family is not None and p.family == family):
                s = p.gpu_start_ns if p.gpu_start_ns is not None else p.start_ns
                e = p.gpu_end_ns if p.gpu_end_ns is not None else p.end_ns
                windows.append((int(s), int(e)))
        if f.rule == "gpu_idle":
            gaps = [(g.start_ns, g.dur_ns) for g in run.facts.gaps]
            if not gaps and run.analysis.timeline is not None:
                gaps = [(g.start_ns, g.dur_ns) for g in run.analysis.timeline.largest_gaps]
            windows += [(int(s), int(s + d)) for s, d in gaps]
        elif f.rule == "cpu_stall":
            named = _INSIDE.search(f.title)
            windows += [
                (int(g.start_ns), int(g.start_ns + g.dur_ns))
                for g in run.facts.gaps
                if named and g.op_name == named.group(1)
            ]
    lo = [w[0] for w in windows] + span_lo
    hi = [w[1] for w in windows] + span_hi
    view = (min(lo), max(hi)) if lo else None
    parts = []
    if windows:
        kind = "gap" if f.rule in ("gpu_idle", "cpu_stall") else "step"
        parts.append(f"{len(windows)} {kind}{'s' if len(windows) != 1 else ''}")
    if kernel_names:
        parts.append(f"the spans of {len(set(kernel_names))} kernel name{'s' if len(set(kernel_names)) != 1 else ''}")
    why = ("shows " + " and ".join(parts)) if parts else "no span to show: the finding is about the run as a whole"
    return FindingLink(
        title=f.title,
        severity=f.severity,
        rule=f.rule,
        trace=label,
        view_ns=view,
        windows_ns=tuple(sorted(set(windows))),
        names=tuple(dict.fromkeys(kernel_names)),
        why=why,
        runs=run_index,
    )


__all__ = ["MAX_SPANS", "FindingLink", "Lane", "TimelineModel", "build_timeline"]
