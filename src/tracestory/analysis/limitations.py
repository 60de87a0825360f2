"""What the inputs could not support: each analysis that was skipped or weakened, and why.

A report states these next to its conclusions ("Limitations") so that a reader knows which
claims the trace could not make, instead of reading silence as "nothing to see". Each entry is
computed from what the inputs hold, never assumed:

* **ranks**: traces that declare a world size (Kineto ``distributedInfo``) and fewer distinct
  ranks given: "k of N ranks", and multi-GPU claims cover only those ranks.
* **phases**: no step markers (ProfilerStep, NVTX, ``record_function``), or phases that cover
  less than 90% of GPU op time (GPU ops launched outside every phase, such as a previous step's
  queued work whose launches precede the capture).
* **op shapes**: CPU ops present but no recorded input shapes, so shape-based FLOP/byte estimates
  are skipped; a trace without CPU ops says that instead.
* **launches**: no runtime API calls, so launch latency, graph replays and the critical path are
  unknown.
* **timeline**: summaries only (``nsys stats`` CSV): no idle time, phases or critical path.
* **kernel metrics**: no Nsight Compute input, so occupancy, stalls and measured roofline are
  not analysed.
* **categories**: more than 5% of GPU op time in kernels the taxonomy does not name.
* **kernel times** (:mod:`.stream_overlap`): kernels that start before the kernel ahead of them on
  their stream has ended (programmatic dependent launch on CUDA), over 1% of the summed kernel
  time: their times include the wait, so kernel, category and operator times overstate them.
* **roofline estimate**: shape-based points above their roof, dropped as estimate errors; ops
  left out of the estimate (fused MoE ops) and why.
* **damaged input**: what a reader dropped from a damaged file, and why (its warnings).
* **graph replays**: an Nsight Systems export made with graph-level tracing (nsys's default
  ``--cuda-graph-trace=graph``; ``meta.extra["cuda_graphs"]["whole_graph_launches"]``): each graph
  launch is one opaque row, the kernels inside are not in the input; how to capture them.
* **partial capture** (:func:`capture_limitations`): a report on a failed capture's kept files
  (``failed-<tool>/``): the capture's error and the files it lacks.
* **GPU telemetry** (:func:`telemetry_limitations`): a capture folder whose manifest records the
  sampler off (``--skip-power-monitor``, an ncu capture, no NVML) and no telemetry file read:
  "no GPU telemetry (clocks, power)" with the recorded reason; plain trace files say nothing
  (they never had a sampler). Damage in a telemetry file read is stated as well.

Traces (ranks) that share a limitation word for word are told once, with how many traces and
the first few of their names ("64 traces (rank0.trace.json.gz, ...): ..."), so a report on 64
ranks lists it in one line, not 64; the input-wide ones (ranks, kernel metrics) are stated once.
"""

from __future__ import annotations

from typing import Sequence

import msgspec
import numpy as np

from ..ingest.files import warnings_of
from ..trace import Trace
from ..units import fmt_ns, fmt_pct
from .derived import op_shapes_recorded
from .stream_overlap import stream_overlap, tells

PHASE_COVERAGE_FLOOR = 0.9
OTHER_SHARE_CEILING = 0.05


class Limitation(msgspec.Struct, frozen=True):
    analysis: str   # short name of the analysis affected
    reason: str     # one sentence, true for these inputs


class RankCoverage(msgspec.Struct, frozen=True):
    given: int                 # distinct ranks among the traces (or traces, when none has a rank)
    declared: int | None       # the largest world size the traces declare

    @property
    def partial(self) -> bool:
        return self.declared is not None and self.given < self.declared

    def phrase(self) -> str:
        return f"{self.given} of {self.declared} ranks" if self.declared else f"{self.given} ranks"


def rank_coverage(traces: Sequence[Trace]) -> RankCoverage:
    ranks = {t.meta.rank for t in traces if t.meta.rank is not None}
    sizes = [t.meta.world_size for t in traces if t.meta.world_size]
    return RankCoverage(len(ranks) or len(traces), max(sizes) if sizes else None)


class PhaseCoverage(msgspec.Struct, frozen=True):
    """How much of the kernel time the phases hold (kernels only: phases record kernel rows)."""

    share: float                 # of kernel time inside phases
    kernels_outside: int
    kernel_time_outside_ns: int


def coverage_of_phases(trace: Trace, phases) -> PhaseCoverage | None:
    """:func:`phase_coverage` as a :class:`PhaseCoverage`; None without kernel time or phases."""
    share, n_out, ns_out = phase_coverage(trace, phases)
    return None if share is None else PhaseCoverage(share, n_out, ns_out)


def phase_coverage(trace: Trace, phases) -> tuple[float | None, int, int]:
    """(share of kernel time inside phases, kernels outside, their time in ns); phases record
    the kernel rows they hold, so coverage is judged on kernels (memops are not counted)."""
    dur = trace.kernels.dur_ns.astype(np.int64)
    total = int(dur.sum())
    if total == 0 or phases.source == "none":
        return None, 0, 0
    inside = np.zeros(len(trace.kernels), dtype=bool)
    for p in phases.phases:
        inside[p.kernel_rows] = True
    outside = ~inside
    return float(dur[inside].sum()) / total, int(outside.sum()), int(dur[outside].sum())


def limitations(traces: Sequence[Trace], analyses: Sequence, *, has_kernel_metrics: bool,
                dropped_estimates: int = 0, kernel_metrics_warnings: Sequence[tuple[str, str]] = (),
                not_estimated: Sequence[tuple[str, int, str]] = (),
                platforms: Sequence[str] = ()) -> tuple[Limitation, ...]:
    """The limitations of one set of inputs (``analyses``: one :class:`~tracestory.analysis.Analysis`
    per trace, same order; ``dropped_estimates``: shape-based roofline points dropped as above
    their roof; ``not_estimated``: (op, kernel count, reason) of ops the estimate leaves out)."""
    out: list[Limitation] = []
    cov = rank_coverage(traces)
    if cov.partial:
        out.append(Limitation("multi-GPU", f"{cov.phrase()} given (the traces declare a world size of "
                              f"{cov.declared}): balance, straggler and collective claims cover only these ranks."))
    if traces and not has_kernel_metrics and platforms and all(p == "ROCm" for p in platforms):
        out.append(Limitation("hardware counters", "no hardware-counter input (rocprof-compute output is not read "
                              "yet): occupancy, wavefront stalls and the measured roofline are not analysed."))
    elif traces and not has_kernel_metrics:
        out.append(Limitation("hardware counters", "no Nsight Compute input: occupancy, warp stalls and the "
                              "measured roofline are not analysed."))
    for path, w in kernel_metrics_warnings:
        out.append(Limitation("damaged input", f"{path}: {w}"))
    if dropped_estimates:
        out.append(Limitation("roofline estimate", f"{dropped_estimates} kernel{'s' if dropped_estimates != 1 else ''}"
                              " whose shape-based estimate came out above the roof were dropped as estimate "
                              "errors; no finding is built on them."))
    left_out: dict[tuple[str, str], int] = {}
    for op, n, reason in not_estimated:
        left_out[(op, reason)] = left_out.get((op, reason), 0) + n
    for (op, reason), n in left_out.items():
        out.append(Limitation("roofline estimate", f"the {n} kernel{'s' if n != 1 else ''} of {op} are not estimated: "
                              f"{reason}."))
    for i, (t, a) in enumerate(zip(traces, analyses)):
        who = f"{t.meta.source_path}: " if len(traces) > 1 else ""
        for w in warnings_of(t):
            out.append(Limitation("damaged input", f"{t.meta.source_path}: {w}"))
        whole = int(((t.meta.extra or {}).get("cuda_graphs") or {}).get("whole_graph_launches") or 0)
        if whole:
            out.append(Limitation("graph replays", f"{who}{whole} CUDA graph launch{'es were' if whole != 1 else ' was'}"
                                  " traced whole (nsys --cuda-graph-trace=graph, its default): each replay is one "
                                  "opaque 'CUDA graph N replay' op; the kernels inside it, their categories and the "
                                  "gaps between them are not in this input. Capture with `nsys profile "
                                  "--cuda-graph-trace=node` (`tracestory capture nsys` passes it where nsys supports "
                                  "it)."))
        if not t.meta.has_timeline:
            out.append(Limitation("timeline", f"{who}summary tables only (no per-event timeline): idle time, "
                                  "phases and the critical path cannot be computed."))
            continue
        if len(t.api) == 0 and len(t.kernels):
            out.append(Limitation("launches", f"{who}no runtime API calls in this input: launch latency, "
                                  "graph replays and the critical path are unknown."))
        if a.phases.source == "none" and len(t.kernels):
            out.append(Limitation("phases", f"{who}no step markers (ProfilerStep, NVTX or record_function "
                                  "ranges): the trace is told as one phase, with no per-step trend."))
        else:
            share, n_out, ns_out = phase_coverage(t, a.phases)
            if share is not None and share < PHASE_COVERAGE_FLOOR:
                out.append(Limitation("phases", f"{who}the phases cover {fmt_pct(share)} of kernel time: {n_out} "
                                      f"kernels ({fmt_ns(ns_out)}) were launched outside every phase (before the "
                                      "first marker, e.g. a previous step's queued work, or between steps)."))
        if len(t.ops) == 0:
            if len(t.kernels):
                out.append(Limitation("op shapes", f"{who}no CPU operators in this input: no GPU time per "
                                      "operator and no shape-based FLOP/byte estimates."))
        elif not op_shapes_recorded(t):
            out.append(Limitation("op shapes", f"{who}no recorded op shapes: shape-based FLOP/byte estimates are "
                                  "skipped (capture with record_shapes=True)."))
        overlap = stream_overlap(t)
        if tells(overlap):
            cuda = i < len(platforms) and platforms[i] == "CUDA"
            out.append(Limitation("kernel times", _overlap_reason(who, overlap, cuda)))
        other = next((c for c in a.breakdown.categories if c.name == "other"), None)
        if other is not None and other.percent / 100 > OTHER_SHARE_CEILING:
            out.append(Limitation("categories", f"{who}{other.percent:.1f}% of GPU op time is in kernels the "
                                  f"'{a.breakdown.taxonomy}' taxonomy does not name ('other')."))
    return _told_once(out, [t.meta.source_path for t in traces])


def _overlap_reason(who: str, o, cuda: bool) -> str:
    cause = " (programmatic dependent launch)" if cuda else ""
    most = ", ".join(f"`{name}` {fmt_ns(ns)}" for name, ns in o.most)
    return (f"{who}{o.early} of {o.kernels} kernels start before the kernel ahead of them on their stream has "
            f"ended{cause}: {fmt_ns(o.overlap_ns)} ({fmt_pct(o.share)} of the summed kernel time) is counted twice. "
            f"Such a kernel's time includes its wait for the one ahead, so kernel, category and operator times "
            f"overstate it (most: {most}); busy and idle time count the overlap once.")


NAMED_TRACES = 3  # traces named in a limitation shared by several


def _told_once(items: list[Limitation], paths: Sequence[str]) -> tuple[Limitation, ...]:
    """Per-trace limitations ("<path>: <reason>") with the same analysis and reason merged into one,
    in order of first appearance; input-wide ones are kept as they are."""
    known = set(paths)
    groups: dict[tuple[str, str], list[str]] = {}
    for lim in items:
        path, sep, rest = lim.reason.partition(": ")
        key = (lim.analysis, rest) if sep and path in known else (lim.analysis, lim.reason)
        groups.setdefault(key, []).append(path if sep and path in known else "")
    out = []
    for (analysis, reason), who in groups.items():
        named = [w for w in who if w]
        if len(named) <= 1:
            out.append(Limitation(analysis, f"{named[0]}: {reason}" if named else reason))
            continue
        names = ", ".join(p.rsplit("/", 1)[-1] for p in named[:NAMED_TRACES])
        more = f", +{len(named) - NAMED_TRACES} more" if len(named) > NAMED_TRACES else ""
        out.append(Limitation(analysis, f"{len(named)} traces ({names}{more}): {reason}"))
    return tuple(out)


def capture_limitations(inputs) -> tuple[Limitation, ...]:
    """A failed capture read from the files it kept (``failed-<tool>/``): the report is partial;
    one line per such folder with the capture's error and the files it lacks."""
    out = []
    for m in inputs.manifests:
        for p in m.get("partial") or ():
            missing = ", ".join(p.get("missing") or ()) or "none of the files a complete capture writes"
            err = " ".join(str(p.get("error") or "no error recorded").split())
            if len(err) > 300:
                err = err[:297] + "..."
            out.append(Limitation("partial capture", f"the {p.get('tool')} capture failed ({err}); this report "
                                  f"reads the files it kept in {p.get('folder')}/; missing: {missing}."))
    return tuple(out)


def input_limitations(inputs) -> tuple[Limitation, ...]:
    """Inputs that disagree with each other (``Inputs.warnings``: a load summary that is not of
    the scheduler log's run), one line each."""
    return tuple(Limitation("serving inputs", w) for w in getattr(inputs, "warnings", ()))


def telemetry_limitations(inputs) -> tuple[Limitation, ...]:
    """GPU telemetry limitations of ``inputs`` (an :class:`~tracestory.ingest.Inputs`); see the
    module docstring."""
    if inputs.telemetry is not None:
        return tuple(Limitation("GPU telemetry", w) for w in inputs.telemetry.warnings)
    out = []
    for m in inputs.manifests:
        for cap in m.get("captures") or ():
            t = cap.get("telemetry") if isinstance(cap, dict) else None
            if cap.get("status") == "complete" and isinstance(t, dict) and t.get("status") == "off":
                out.append(Limitation("GPU telemetry", f"no GPU telemetry (clocks, power) in the {cap.get('tool')} "
                                      f"capture: the sampler was off ({t.get('reason') or 'no reason recorded'})."))
    return tuple(out)
