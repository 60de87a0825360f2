"""Two runs side by side (eager vs compiled, bf16 vs fp8, before vs after): what changed.

Model
-----
Each side is one analysed trace (:class:`tracestory.analysis.Analysis`, same taxonomy on both
sides). Every quantity below is computed per side from that side's results, then paired:

* **GPU op time**: ``breakdown.total_time_ns``, the plain sum of kernel + memop durations
  (the base of every category share). **GPU busy**: the union of those intervals
  (``timeline.busy_ns``). **GPU window**: first GPU op start to last GPU op end.
* **Wall time**: from the first phase's CPU start to the later of the last phase's CPU end and
  the last end of a GPU op launched inside a phase (host time before the first kernel counts,
  so does GPU work still running after the range closed). Without phases (source ``none``) or
  without a timeline, the GPU window, or ``None``.
* **Iteration time**: per phase, the same latency, ``max(range end, last GPU op end) - range
  start``: what a caller timing the range with a device sync would measure (an NVTX range timed
  around a synchronised step measures this). The iteration family is ``ProfilerStep`` when the phases come from it,
  else a family whose name contains ``decode``, else the most numerous family of >= 2 phases.
  Its median is the headline (robust to a first-iteration JIT outlier); the mean is kept too.
* **Launches**: runtime/driver API calls that launch GPU work, CUDA or HIP (kernel and graph
  launches, named in :mod:`tracestory.analysis.launch_apis`); ``None`` when the trace has no API
  calls (a summary-only input). One ``cudaGraphLaunch`` replays many kernels, which is why a
  CUDA-graph run has far fewer launches than kernels.
* **Compiled**: a side is compiled when it has Inductor kernels (names starting ``triton_``)
  or CUDA graph launches; the evidence string says which.
* **Speedup B vs A** for a metric: ``a / b`` (> 1: B is faster). The headline speedup is the
  first metric both sides have among: iteration median, wall time, GPU busy, GPU op time.

Kernels are matched by a normalized name: whitespace collapsed, a leading ``void`` dropped,
and for Inductor kernels the trailing ``_<n>`` index dropped (two compilations number their
kernels differently). Kernel families (cuBLAS/nvjet, CUTLASS, FlashAttention, cuDNN, Triton
pointwise / reduction / template, ATen elementwise / reduction, NCCL, copies) come from the
same kind of name patterns as the report's codebase summary.

Fusion: an Inductor kernel is named after the ATen ops it fuses
(``triton_red_fused_add_mean_mul_pow_rsqrt_0``). For each such kernel on one side, the ops in
its name (words of >= 3 letters) are looked up in the names of the small-op kernels (ATen
elementwise / reduction families) found only on the other side; those it covers are listed as
what it replaces. This explains a fusion; it is not a proof (an op word can match a kernel that
another fused kernel replaced, and one eager kernel may be replaced by several fused ones).

Identical inputs: when the two files (or folders) are byte-identical (same SHA-256, computed by
the caller), ``Comparison.identical`` holds the digest and the verdict says so instead of "1.00x".

Gates (:func:`check_gates`, for CI): a metric *regresses* when B is worse than A by more than its
gate, in percent of A: ``100 * (b - a) / a > gate`` for the time metrics (iteration median and
mean, wall, GPU busy, GPU op time) and the counts (kernels, launches); for the GPU idle share,
``100 * (b - a) > gate`` in percentage points. ``--gate PCT`` gates every time metric both sides
have; ``--gate-metric NAME=PCT`` gates one metric (named in :data:`GATE_METRICS`), and a named
metric one side lacks is refused rather than passed unchecked.

Limits: one trace per side (one rank); both sides should use the same taxonomy (categories
are matched by name). Numbers are only as comparable as the captures: same workload, same
phases, warm-up outside the capture.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..ingest import load_inputs
from . import Analysis, analyze
from .categories import Taxonomy
from .families import SMALL_OP_FAMILIES, kernel_family
from .window import TraceWindow, WindowSelection, WindowSpec, rule_text, window_traces
from ..units import fmt_ns
from .launch_apis import is_graph_launch, is_launch_name
from .findings import Evidence, Finding

_TRITON_INDEX = re.compile(r"_\d+$")
_FUSED_STOP = {"fused", "view", "clone", "default", "tensor", "scalar", "copy", "unsafe", "expand",
               "squeeze", "unsqueeze", "permute", "transpose", "reshape", "slice", "select", "alias"}



# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class Iteration:
    family: str  # phase family, e.g. "decode", "ProfilerStep"
    count: int
    median_ns: float
    mean_ns: float
    min_ns: int
    max_ns: int
    total_ns: int
    gpu_busy_median_ns: float  # median union of the GPU ops launched in one iteration
    slowest: str  # name of the slowest phase of the family
    slowest_ratio: float | None  # max / median; >= 1.5 flags a warm-up outlier (JIT, autotuning)


@dataclass(frozen=True)
class Side:
    label: str
    source: str  # the trace's label (file name, rank)
    device: str | None
    compiled: bool
    compile_evidence: str
    triton_kernel_count: int  # Inductor kernel executions (names starting "triton_")
    graph_launch_count: int | None  # cudaGraphLaunch calls; None without API calls
    kernel_count: int
    memop_count: int
    launch_count: int | None  # API calls that launch GPU work; None without API calls
    gpu_time_ns: int  # kernel + memop durations summed
    kernel_time_ns: int
    busy_ns: int | None  # union of GPU ops
    window_ns: int | None  # first GPU op start -> last GPU op end
    wall_ns: int | None  # see the module docstring
    idle_fraction: float | None  # of the GPU window
    phase_source: str
    iteration: Iteration | None


@dataclass(frozen=True)
class CategoryDelta:
    name: str
    a_time_ns: int
    b_time_ns: int
    a_share: float  # of that side's GPU op time, 0..1
    b_share: float
    a_count: int
    b_count: int
    delta_ns: int  # b - a
    ratio: float | None  # b / a; None when a is 0


@dataclass(frozen=True)
class KernelDelta:
    key: str  # normalized name (the match key)
    name: str  # full name as the trace has it (side B's when on both sides)
    category: str
    family: str
    a_time_ns: int
    b_time_ns: int
    a_count: int
    b_count: int
    delta_ns: int  # b - a
    only_in: str | None  # "a", "b" or None (on both sides)


@dataclass(frozen=True)
class FamilyDelta:
    name: str
    a_time_ns: int
    b_time_ns: int
    a_count: int
    b_count: int


@dataclass(frozen=True)
class PhaseDelta:
    family: str
    a_count: int
    b_count: int
    a_median_ns: float | None
    b_median_ns: float | None
    speedup: float | None  # a_median / b_median


@dataclass(frozen=True)
class FusedKernel:
    side: str  # "a" or "b": where the fused kernel runs
    name: str
    ops: tuple[str, ...]  # op words in its name
    time_ns: int
    count: int
    replaces: tuple[str, ...]  # normalized names of the other side's small-op kernels it covers
    replaced_time_ns: int
    replaced_count: int


@dataclass(frozen=True)
class Speedup:
    metric: str  # "iteration median", "iteration mean", "wall", "GPU busy", "GPU op time"
    a_ns: float
    b_ns: float
    speedup: float | None  # a / b (> 1: B faster); None when b is 0


@dataclass(frozen=True)
class Changes:
    grew: tuple[CategoryDelta, ...]  # categories with more time in B, largest increase first
    shrank: tuple[CategoryDelta, ...]  # less time in B, largest decrease first
    only_a_kernels: int  # distinct kernel names only in A
    only_a_time_ns: int
    only_b_kernels: int
    only_b_time_ns: int
    kernel_count_delta: int  # b - a
    launch_delta: int | None  # b - a
    launch_reduction: float | None  # (a - b) / a
    idle_fraction_delta: float | None  # b - a


@dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    taxonomy: str
    speedups: tuple[Speedup, ...]
    headline: Speedup | None  # first of iteration median, wall, GPU busy, GPU op time
    categories: tuple[CategoryDelta, ...]  # by max(a, b) time, largest first
    kernels: tuple[KernelDelta, ...]  # top by max(a, b) time
    families: tuple[FamilyDelta, ...]
    phases: tuple[PhaseDelta, ...]  # phase families of either side, A's order first
    fused: tuple[FusedKernel, ...]
    changes: Changes
    findings: tuple = ()  # comparison_findings of this comparison, computed once by compare()
    identical: str | None = None  # SHA-256 of both inputs when they are byte-identical
    window: WindowSelection | None = None  # of (A, B) when restricted
    gates: tuple = ()  # GateCheck per gated metric (check_gates), when gates were asked for


# ------------------------------------------------------------------ per side


def normalize_name(name: str) -> str:
    """The match key of a kernel name (see the module docstring)."""
    s = " ".join(name.split()).removeprefix("void ")
    if s.startswith("triton_"):
        s = _TRITON_INDEX.sub("", s)
    return s


def fused_ops(name: str) -> tuple[str, ...]:
    """Op words of an Inductor kernel name: ``triton_red_fused_add_mean_0`` -> ("add", "mean")."""
    if not name.startswith("triton_") or "fused_" not in name:
        return ()
    tail = _TRITON_INDEX.sub("", name.split("fused_", 1)[1])
    words = [w for w in tail.split("_") if len(w) >= 3 and w.isalpha() and w not in _FUSED_STOP]
    return tuple(dict.fromkeys(words))


def _api_counts(trace) -> tuple[int | None, int | None]:
    api = trace.api
    if len(api) == 0:
        return None, None
    codes, counts = np.unique(api["name"], return_counts=True)
    launches = graphs = 0
    for c, n in zip(codes.tolist(), counts.tolist(), strict=True):
        name = trace.name(int(c))
        if is_launch_name(name):
            launches += n
            if is_graph_launch(name):
                graphs += n
    return launches, graphs


def _latency(ph) -> int:
    end = max(ph.end_ns, ph.gpu_end_ns) if ph.gpu_end_ns is not None else ph.end_ns
    return int(end - ph.start_ns)


def _iteration_family(phases) -> str | None:
    if phases.source == "none" or not phases.phases:
        return None
    fams = [p.family for p in phases.phases]
    if phases.source == "ProfilerStep":
        return "ProfilerStep"
    decode = [f for f in dict.fromkeys(fams) if "decode" in f.lower()]
    if decode:
        return max(decode, key=fams.count)
    counts = {f: fams.count(f) for f in dict.fromkeys(fams)}
    best = max(counts, key=counts.get)
    return best if counts[best] >= 2 else None


def _family_stats(phases, family: str) -> Iteration | None:
    members = [p for p in phases.phases if p.family == family]
    if not members:
        return None
    t = np.array([_latency(p) for p in members], dtype=np.int64)
    busy = np.array([p.gpu_busy_ns for p in members], dtype=np.float64)
    med = float(np.median(t))
    return Iteration(family=family, count=int(t.size), median_ns=med, mean_ns=float(t.mean()),
                     min_ns=int(t.min()), max_ns=int(t.max()), total_ns=int(t.sum()),
                     gpu_busy_median_ns=float(np.median(busy)), slowest=members[int(np.argmax(t))].name,
                     slowest_ratio=float(t.max() / med) if med > 0 else None)


def _wall(a) -> int | None:
    ph, tl = a.phases, a.timeline
    if ph.source != "none" and ph.phases and tl is not None:
        start = min(p.start_ns for p in ph.phases)
        end = max(max(p.end_ns, p.gpu_end_ns if p.gpu_end_ns is not None else p.end_ns) for p in ph.phases)
        return int(end - start)
    return tl.window_ns if tl is not None else None


def side_summary(a, label: str) -> Side:
    """The per-side numbers of the module docstring for one analysis."""
    tr, b, tl = a.trace, a.breakdown, a.timeline
    k = tr.kernels
    codes, counts = np.unique(k["name"], return_counts=True)
    triton = sum(n for c, n in zip(codes.tolist(), counts.tolist(), strict=True) if tr.name(int(c)).startswith("triton_"))
    launches, graphs = _api_counts(tr)
    evidence = []
    if triton:
        evidence.append(f"{triton} Triton/Inductor kernel executions")
    if graphs:
        evidence.append(f"{graphs} CUDA graph launches")
    if not evidence:
        evidence.append("no Triton/Inductor kernels" + (", no CUDA graph launches" if graphs == 0 else ""))
    fam = _iteration_family(a.phases)
    return Side(
        label=label, source=tr.label,
        device=tr.meta.devices[0].name if tr.meta.devices else None,
        compiled=bool(triton or graphs), compile_evidence=", ".join(evidence),
        triton_kernel_count=int(triton), graph_launch_count=graphs,
        kernel_count=b.kernel_count, memop_count=b.memop_count, launch_count=launches,
        gpu_time_ns=b.total_time_ns, kernel_time_ns=b.kernel_time_ns,
        busy_ns=tl.busy_ns if tl is not None else None,
        window_ns=tl.window_ns if tl is not None else None,
        wall_ns=_wall(a), idle_fraction=tl.idle_fraction if tl is not None else None,
        phase_source=a.phases.source,
        iteration=_family_stats(a.phases, fam) if fam else None,
    )


def _kernel_table(a) -> dict[str, dict]:
    """Normalized name -> {name, category, family, time, count} over kernels and memops."""
    tr, cl = a.trace, a.classification
    cats = cl.taxonomy.categories
    names = np.concatenate([tr.kernels["name"], tr.memops["name"]]).astype(np.int64)
    cat = np.concatenate([cl.kernel_category, cl.memop_category]).astype(np.int64)
    dur = np.concatenate([tr.kernels.dur_ns, tr.memops.dur_ns]).astype(np.int64)
    key = (names + 1) * len(cats) + cat
    uniq, inv = np.unique(key, return_inverse=True)
    t = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(t, inv, dur)
    n = np.bincount(inv, minlength=len(uniq))
    out: dict[str, dict] = {}
    # One Python step per distinct (name, category) pair, never per op. When several pairs
    # share a key, the name and category shown are those of the pair with the most time.
    for u, tt, nn in sorted(zip(uniq.tolist(), t.tolist(), n.tolist(), strict=True), key=lambda r: -r[1]):
        full = tr.name(u // len(cats) - 1)
        row = out.setdefault(normalize_name(full), {"name": full, "category": cats[u % len(cats)],
                                                        "family": kernel_family(full), "time": 0, "count": 0})
        row["time"] += tt
        row["count"] += nn
    return out


# ------------------------------------------------------------------ pairing


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _categories(a, b) -> tuple[CategoryDelta, ...]:
    ca = {c.name: c for c in a.breakdown.categories}
    cb = {c.name: c for c in b.breakdown.categories}
    ta, tb = a.breakdown.total_time_ns, b.breakdown.total_time_ns
    out = []
    for name in dict.fromkeys(list(ca) + list(cb)):
        x, y = ca.get(name), cb.get(name)
        at, bt = (x.time_ns if x else 0), (y.time_ns if y else 0)
        out.append(CategoryDelta(
            name=name, a_time_ns=at, b_time_ns=bt,
            a_share=at / ta if ta else 0.0, b_share=bt / tb if tb else 0.0,
            a_count=x.count if x else 0, b_count=y.count if y else 0,
            delta_ns=bt - at, ratio=bt / at if at else None))
    return tuple(sorted(out, key=lambda c: (-max(c.a_time_ns, c.b_time_ns), c.name)))


def _kernels(ka: dict, kb: dict) -> list[KernelDelta]:
    out = []
    for key in dict.fromkeys(list(ka) + list(kb)):
        x, y = ka.get(key), kb.get(key)
        ref = y or x
        out.append(KernelDelta(
            key=key, name=ref["name"], category=ref["category"], family=ref["family"],
            a_time_ns=x["time"] if x else 0, b_time_ns=y["time"] if y else 0,
            a_count=x["count"] if x else 0, b_count=y["count"] if y else 0,
            delta_ns=(y["time"] if y else 0) - (x["time"] if x else 0),
            only_in=None if (x and y) else ("a" if x else "b")))
    return sorted(out, key=lambda k: (-max(k.a_time_ns, k.b_time_ns), k.key))


def _families(kernels: list[KernelDelta]) -> tuple[FamilyDelta, ...]:
    acc: dict[str, list[int]] = {}
    for k in kernels:
        r = acc.setdefault(k.family, [0, 0, 0, 0])
        r[0] += k.a_time_ns
        r[1] += k.b_time_ns
        r[2] += k.a_count
        r[3] += k.b_count
    rows = [FamilyDelta(f, *v) for f, v in acc.items()]
    return tuple(sorted(rows, key=lambda f: (-max(f.a_time_ns, f.b_time_ns), f.name)))


def _fusions(kernels: list[KernelDelta]) -> tuple[FusedKernel, ...]:
    out = []
    for side, other in (("a", "b"), ("b", "a")):
        candidates = [k for k in kernels if k.only_in == other and k.family in SMALL_OP_FAMILIES]
        for k in kernels:
            count = k.a_count if side == "a" else k.b_count
            ops = fused_ops(k.name) if count else ()
            if not ops:
                continue
            hit = [c for c in candidates if any(op in c.key.lower() for op in ops)]
            out.append(FusedKernel(
                side=side, name=k.name, ops=ops, time_ns=k.a_time_ns if side == "a" else k.b_time_ns,
                count=count, replaces=tuple(c.key for c in hit),
                replaced_time_ns=sum(c.a_time_ns + c.b_time_ns for c in hit),
                replaced_count=sum(c.a_count + c.b_count for c in hit)))
    return tuple(sorted(out, key=lambda f: (f.side, -f.time_ns, f.name)))


def _phases(a, b) -> tuple[PhaseDelta, ...]:
    fa = [p.family for p in a.phases.phases] if a.phases.source != "none" else []
    fb = [p.family for p in b.phases.phases] if b.phases.source != "none" else []
    out = []
    for fam in dict.fromkeys(fa + fb):
        x = _family_stats(a.phases, fam) if fam in fa else None
        y = _family_stats(b.phases, fam) if fam in fb else None
        out.append(PhaseDelta(fam, x.count if x else 0, y.count if y else 0,
                              x.median_ns if x else None, y.median_ns if y else None,
                              _ratio(x.median_ns if x else None, y.median_ns if y else None)))
    return tuple(out)


def _speedups(sa: Side, sb: Side) -> tuple[Speedup, ...]:
    pairs = []
    ia, ib = sa.iteration, sb.iteration
    if ia is not None and ib is not None and ia.family == ib.family:
        pairs += [("iteration median", ia.median_ns, ib.median_ns), ("iteration mean", ia.mean_ns, ib.mean_ns)]
    pairs += [("wall", sa.wall_ns, sb.wall_ns), ("GPU busy", sa.busy_ns, sb.busy_ns),
              ("GPU op time", sa.gpu_time_ns, sb.gpu_time_ns)]
    return tuple(Speedup(m, float(x), float(y), _ratio(x, y)) for m, x, y in pairs
                 if x is not None and y is not None)


def compare(a, b, *, label_a: str = "A", label_b: str = "B", top: int = 15, identical: str | None = None,
            window=None) -> Comparison:
    """Side-by-side comparison of two analyses (see the module docstring). ``identical``: the
    SHA-256 both inputs share, when they do; ``window``: the part of each trace compared."""
    if a.classification.taxonomy.name != b.classification.taxonomy.name:
        raise UsageError(f"compare: both sides need the same taxonomy, got {a.classification.taxonomy.name!r} "
                         f"and {b.classification.taxonomy.name!r}")
    if top < 1:
        raise UsageError(f"compare: top must be >= 1, got {top}")
    sa, sb = side_summary(a, label_a), side_summary(b, label_b)
    cats = _categories(a, b)
    kernels = _kernels(_kernel_table(a), _kernel_table(b))
    speedups = _speedups(sa, sb)
    only_a = [k for k in kernels if k.only_in == "a"]
    only_b = [k for k in kernels if k.only_in == "b"]
    launch_delta = (sb.launch_count - sa.launch_count
                    if sa.launch_count is not None and sb.launch_count is not None else None)
    changes = Changes(
        grew=tuple(sorted((c for c in cats if c.delta_ns > 0), key=lambda c: -c.delta_ns)),
        shrank=tuple(sorted((c for c in cats if c.delta_ns < 0), key=lambda c: c.delta_ns)),
        only_a_kernels=len(only_a), only_a_time_ns=sum(k.a_time_ns for k in only_a),
        only_b_kernels=len(only_b), only_b_time_ns=sum(k.b_time_ns for k in only_b),
        kernel_count_delta=sb.kernel_count - sa.kernel_count,
        launch_delta=launch_delta,
        launch_reduction=(-launch_delta / sa.launch_count) if launch_delta is not None and sa.launch_count else None,
        idle_fraction_delta=(sb.idle_fraction - sa.idle_fraction
                             if sa.idle_fraction is not None and sb.idle_fraction is not None else None),
    )
    c = Comparison(
        a=sa, b=sb, taxonomy=a.classification.taxonomy.name, speedups=speedups,
        headline=speedups[0] if speedups else None, categories=cats,
        kernels=tuple(kernels[:top]), families=_families(kernels), phases=_phases(a, b),
        fused=_fusions(kernels), changes=changes, identical=identical, window=window)
    return dataclasses.replace(c, findings=comparison_findings(c))


# ------------------------------------------------------------------ gates

# name -> (metric as in Speedup.metric or a Side field, unit: "ns", "count" or "points")
GATE_METRICS: dict[str, tuple[str, str]] = {
    "iteration": ("iteration median", "ns"),
    "iteration_mean": ("iteration mean", "ns"),
    "wall": ("wall", "ns"),
    "busy": ("GPU busy", "ns"),
    "gpu_time": ("GPU op time", "ns"),
    "kernels": ("kernel_count", "count"),
    "launches": ("launch_count", "count"),
    "idle": ("idle_fraction", "points"),
}
_GATE_LABELS = {"kernel_count": "kernels", "launch_count": "launches", "idle_fraction": "GPU idle share"}
TIME_GATES = ("iteration", "iteration_mean", "wall", "busy", "gpu_time")


@dataclass(frozen=True)
class GateCheck:
    name: str            # key of GATE_METRICS
    metric: str          # what it measures, as the tables name it
    a: float
    b: float
    change: float | None  # percent of A (points for idle); None when A is 0
    gate: float          # the limit, percent (points for idle)
    unit: str            # "ns", "count", "points"
    regressed: bool


def _gate_values(c: Comparison, name: str) -> tuple[float, float] | None:
    metric, unit = GATE_METRICS[name]
    if unit == "ns":
        s = next((s for s in c.speedups if s.metric == metric), None)
        return (s.a_ns, s.b_ns) if s is not None else None
    a, b = getattr(c.a, metric), getattr(c.b, metric)
    return (float(a), float(b)) if a is not None and b is not None else None


def check_gates(c: Comparison, gate: float | None = None, per_metric: dict[str, float] | None = None
                ) -> tuple[GateCheck, ...]:
    """One check per gated metric (the rule is in the module docstring): ``gate`` for every time
    metric both sides have, ``per_metric`` (name -> limit) on top, replacing ``gate`` for its
    metric. Raises :class:`UsageError` for an unknown name, a negative limit, or a named metric
    that a side lacks."""
    per_metric = dict(per_metric or {})
    for name, limit in per_metric.items():
        if name not in GATE_METRICS:
            raise UsageError(f"--gate-metric {name}: expected one of {', '.join(GATE_METRICS)}")
        if not limit >= 0:
            raise UsageError(f"--gate-metric {name}={limit:g}: expected a limit >= 0")
    if gate is not None and not gate >= 0:
        raise UsageError(f"--gate {gate:g}: expected a limit >= 0 (percent)")
    limits = {n: gate for n in TIME_GATES if gate is not None and _gate_values(c, n) is not None}
    limits.update(per_metric)
    out = []
    for name in GATE_METRICS:
        if name not in limits:
            continue
        values = _gate_values(c, name)
        if values is None:
            raise UsageError(f"--gate-metric {name}: expected {_GATE_LABELS.get(GATE_METRICS[name][0], GATE_METRICS[name][0])} "
                             f"on both sides, found {_why_missing(c, name)}")
        a, b = values
        unit = GATE_METRICS[name][1]
        change = 100.0 * (b - a) if unit == "points" else (100.0 * (b - a) / a if a else None)
        regressed = (change > limits[name]) if change is not None else b > a
        metric = GATE_METRICS[name][0]
        out.append(GateCheck(name=name, metric=_GATE_LABELS.get(metric, metric), a=a, b=b, change=change,
                             gate=float(limits[name]), unit=unit, regressed=bool(regressed)))
    return tuple(out)


def _why_missing(c: Comparison, name: str) -> str:
    """Why a gated metric has no pair of values: which side lacks it, or iteration families that differ."""
    metric, unit = GATE_METRICS[name]
    if metric.startswith("iteration"):
        ia, ib = c.a.iteration, c.b.iteration
        if ia is not None and ib is not None:
            return f"different iteration families ({c.a.label}: {ia.family}, {c.b.label}: {ib.family})"
        has = {s.label: s.iteration is not None for s in (c.a, c.b)}
        what = "no iteration family"
    elif unit != "ns":
        has = {s.label: getattr(s, metric) is not None for s in (c.a, c.b)}
        what = "no API calls" if metric == "launch_count" else "no timeline"
    else:
        field = {"wall": "wall_ns", "GPU busy": "busy_ns", "GPU op time": "gpu_time_ns"}[metric]
        has = {s.label: getattr(s, field) is not None for s in (c.a, c.b)}
        what = "no timeline"
    return f"{what} in " + " and ".join(label for label, ok in has.items() if not ok)


# ------------------------------------------------------------------ findings


def comparison_findings(c: Comparison) -> tuple[Finding, ...]:
    """"Compiled slower than eager" (or faster), or a plain "B vs A" verdict when both sides
    are compiled or both eager. Evidence in base units; the report formats it."""
    h = c.headline
    if h is None or h.speedup is None:
        return ()
    a, b = c.a, c.b
    if c.identical is not None:
        return (Finding("identical_inputs", "info", "The two inputs are identical (same SHA-256)",
                        (Evidence("SHA-256 of both inputs", c.identical, "text"),
                         Evidence(f"{a.label}: {h.metric}", h.a_ns, "ns"), Evidence(f"{b.label}: {h.metric}", h.b_ns, "ns")),
                        f"{a.label} and {b.label} are the same bytes: every number of the comparison is the same on both "
                        "sides, and no speedup or slowdown is measured.",
                        "Compare a capture of the changed run against the baseline (check that the paths name two "
                        "different captures)."),)
    ev = [Evidence(f"{a.label}: {h.metric}", h.a_ns, "ns"), Evidence(f"{b.label}: {h.metric}", h.b_ns, "ns"),
          Evidence(f"speedup of {b.label} vs {a.label} ({h.metric})", h.speedup, "x"),
          Evidence(f"{a.label}: compile evidence", a.compile_evidence, "text"),
          Evidence(f"{b.label}: compile evidence", b.compile_evidence, "text"),
          Evidence(f"{a.label}: kernels", a.kernel_count, "count"),
          Evidence(f"{b.label}: kernels", b.kernel_count, "count")]
    if a.launch_count is not None and b.launch_count is not None:
        ev += [Evidence(f"{a.label}: launches", a.launch_count, "count"),
               Evidence(f"{b.label}: launches", b.launch_count, "count")]
    if a.busy_ns is not None and b.busy_ns is not None:
        ev += [Evidence(f"{a.label}: GPU busy", a.busy_ns, "ns"), Evidence(f"{b.label}: GPU busy", b.busy_ns, "ns")]
    if a.idle_fraction is not None and b.idle_fraction is not None:
        ev += [Evidence(f"{a.label}: idle share of GPU window", a.idle_fraction, "fraction"),
               Evidence(f"{b.label}: idle share of GPU window", b.idle_fraction, "fraction")]
    s = h.speedup
    same = abs(s - 1.0) < 0.005
    faster = s >= 1.0
    factor = s if faster else 1.0 / s
    why = _why(c)
    if a.compiled != b.compiled:
        comp, eager = (b, a) if b.compiled else (a, b)
        comp_faster = faster == (comp is b)
        verdict = "as fast as" if same else f"{factor:.2f}x {'faster' if comp_faster else 'slower'} than"
        title = f"Compiled ({comp.label}) is {verdict} eager ({eager.label}) by {h.metric}"
        if same:
            sev = "low"
            imp = f"torch.compile changes little end to end here: {why}"
            rec = ("When the GPU idles most of its window, host time hides what fusion saves: capture "
                   "the step in CUDA graphs (torch.compile mode='reduce-overhead') or cut host work; "
                   "otherwise compare the top kernels of both runs.")
        elif comp_faster:
            sev = "info"
            imp = f"torch.compile pays off here: {why}"
            rec = ("Keep the compiled path. What is left: "
                   + ("host overhead (idle GPU): CUDA graphs (mode='reduce-overhead') remove per-launch cost."
                      if not comp.graph_launch_count else "the largest remaining category (per-category table)."))
        else:
            sev = "high" if factor >= 1.1 else "medium"
            imp = f"torch.compile costs time here: {why}"
            rec = ("Find the kernels that got slower in the top-kernels table. Try "
                   "torch.compile(mode='reduce-overhead') (CUDA graphs) when the GPU idles between "
                   "launches, mode='max-autotune' or keeping cuBLAS GEMMs (no Triton matmul templates) "
                   "when the compiled kernels are slower, and measure the first iterations apart "
                   "(recompilation).")
        rule = "compiled_vs_eager"
    else:
        verdict = "as fast as" if same else f"{factor:.2f}x {'faster' if faster else 'slower'} than"
        title = f"{b.label} is {verdict} {a.label} by {h.metric}"
        sev = "info" if faster or factor < 1.1 else "medium"
        imp = "What moved: " + why
        rec = ("Read the categories that changed most (per-category table) to see where the difference "
               "comes from.")
        rule = "run_comparison"
    return (Finding(rule, sev, title, tuple(ev), imp, rec),)


def _why(c: Comparison) -> str:
    """One sentence of facts: GPU busy vs the rest, the category that moved most, launches."""
    a, b, ch = c.a, c.b, c.changes
    parts = []
    ia, ib = a.iteration, b.iteration
    if c.headline is not None and c.headline.metric.startswith("iteration") and ia and ib:
        parts.append(f"per {ia.family} iteration (median) the GPU is busy {fmt_ns(ia.gpu_busy_median_ns)} of "
                     f"{fmt_ns(ia.median_ns)} in {a.label} and {fmt_ns(ib.gpu_busy_median_ns)} of "
                     f"{fmt_ns(ib.median_ns)} in {b.label}")
    elif a.busy_ns is not None and b.busy_ns is not None:
        parts.append(f"GPU busy {fmt_ns(a.busy_ns)} -> {fmt_ns(b.busy_ns)}")
    if ch.idle_fraction_delta is not None:
        parts.append(f"idle share {100 * a.idle_fraction:.1f}% -> {100 * b.idle_fraction:.1f}%")
    moved = sorted(ch.grew + ch.shrank, key=lambda d: -abs(d.delta_ns))
    if moved:
        d = moved[0]
        parts.append(f"{d.name} {'+' if d.delta_ns > 0 else '-'}{fmt_ns(abs(d.delta_ns))}")
    if ch.launch_delta is not None:
        parts.append(f"launches {a.launch_count} -> {b.launch_count}")
    return "; ".join(parts) + "." if parts else "no timeline to explain it."


# ------------------------------------------------------------------ two inputs, one call

_CHUNK = 1 << 20


def digest(path: str) -> str:
    """SHA-256 of a file's bytes (what ``sha256sum`` prints); of a folder, of every file under it
    (relative path, then the file's SHA-256, in name order), so two copies of one capture folder
    have one digest."""
    p = Path(path)
    if not p.is_dir():
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()
    h = hashlib.sha256()
    for f in sorted(f for f in p.rglob("*") if f.is_file()):
        h.update(f.relative_to(p).as_posix().encode() + b"\0" + digest(str(f)).encode() + b"\n")
    return h.hexdigest()


def identical(a: str, b: str) -> str | None:
    """The shared SHA-256 of ``a`` and ``b`` when they are byte-identical, else None (sizes are
    compared first, so two different files are rarely hashed)."""
    pa, pb = Path(a), Path(b)
    if pa.is_file() and pb.is_file() and os.path.getsize(pa) != os.path.getsize(pb):
        return None
    if pa.is_dir() != pb.is_dir():
        return None
    da = digest(a)
    return da if da == digest(b) else None


def _one_trace(path: str, taxonomy: Taxonomy | None, spec: WindowSpec | None) -> tuple[Analysis, TraceWindow | None]:
    """(analysis, TraceWindow or None) of the one trace of ``path``, restricted by ``spec``."""
    inputs = load_inputs([path])
    if len(inputs.traces) != 1:
        raise UsageError(
            f"{path}: compare takes one trace per side, found {len(inputs.traces)} (pass one rank's trace file)"
        )
    trace, tw = inputs.traces[0], None
    if spec is not None:
        (trace,), sel = window_traces([trace], spec)
        tw = sel.traces[0]
    return analyze(trace, taxonomy), tw


def compare_paths(path_a: str, path_b: str, taxonomy: Taxonomy | None = None, *, label_a: str = "A",
                  label_b: str = "B", top: int = 15, window: WindowSpec | None = None, gate: float | None = None,
                  gate_metrics: dict[str, float] | None = None) -> Comparison:
    """``tracestory compare`` as one call: each of ``path_a`` and ``path_b`` is one trace file or a
    capture folder holding one trace; both are restricted alike by ``window``; byte-identical
    inputs are named; with ``gate`` or ``gate_metrics`` the gates are checked (:func:`check_gates`)."""
    (an_a, tw_a), (an_b, tw_b) = _one_trace(path_a, taxonomy, window), _one_trace(path_b, taxonomy, window)
    sel = (WindowSelection(request=window.request, rule=rule_text(window), traces=(tw_a, tw_b))
           if window is not None and tw_a is not None and tw_b is not None else None)
    c = compare(an_a, an_b, label_a=label_a, label_b=label_b, top=top, identical=identical(path_a, path_b),
                window=sel)
    if gate is not None or gate_metrics:
        c = dataclasses.replace(c, gates=check_gates(c, gate, gate_metrics))
    return c
