"""Inputs -> :class:`Results`: every result of one report, computed once.

:func:`analyze_inputs` is the one place that

* resolves the GPU peaks (``--peaks`` file > capture manifest > built-in measurements >
  datasheet, :func:`~tracestory.specs.resolve_peaks`), once per device name;
* joins each Nsight Compute input to the first trace and places its kernels on the roofline
  against those peaks; without ncu input, estimates each trace's roofline from its op shapes;
* runs the standard analysis of each trace (:func:`~tracestory.analysis.analyze`), its memory
  timeline, its idle-gap causes, its kernel-family table, and **all** its findings, handing the
  rules what was computed above (so the Hardware section, the findings and the JSON quote the
  same roofline figures);
* combines several ranks into the multi-GPU result and its findings, and analyses the serving
  run's scheduler event log (joined with the first trace and the load summary when given).

Renderers read a :class:`Results` and never call an analysis function. Everything is frozen;
``repr`` is a one-line summary (the traces it holds are large). One exception to "computed
once, up front": GPU time per operator (:meth:`RunResults.operators`) costs seconds on
million-op traces, so it is computed on first request and cached in the run; the report asks
for it (:attr:`RunResults.report_operators`) only on traces of at most
:data:`REPORT_MAX_OPS` CPU ops and ranges. :meth:`Results.table` gives the named tables of
:mod:`tracestory.analysis.tables`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError
from ..ingest import Inputs
from ..lazy import entry
from ..specs import Peaks, peaks_warning, resolve_peaks
from ..trace import Trace
from . import Analysis, advice, analyze
from .categories import Taxonomy
from .claims import derive_findings, withheld
from .critical_path import CriticalPath
from .exposure import Exposure
from .facts import KernelMetricsResults, RunFacts, run_facts
from .findings import Evidence, Finding, ncu_findings
from .gaps import GapCause
from .hardware import hardware_analysis, waves
from .kernels import KernelFacts
from .limitations import (
    Limitation,
    RankCoverage,
    capture_limitations,
    input_limitations,
    limitations,
    rank_coverage,
    telemetry_limitations,
)
from .memory import MemoryTimeline
from .producer import Producer
from .roofline import Roofline, roofline
from .table_names import NSYS_TABLES, TABLES
from .workload import Workload

if TYPE_CHECKING:  # passes that only some inputs feed: run through tracestory.lazy when they do
    from .batching import BatchingResult
    from .multigpu import MultiGpu, RankSummary
    from .operators import Operators
    from .questions import Answer
    from .story import Story
    from .tables import Table
    from .telemetry import TelemetryResult
    from .window import WindowSpec

TOP_HARDWARE_KERNELS = 5
REPORT_MAX_OPS = 500_000  # the report tells GPU time per operator only up to this many CPU ops and ranges


@dataclass(frozen=True)
class AnalysisOptions:
    """What the user asked for: categories (``taxonomy``, default ``llm``), the Amdahl what-if
    factor ``k``, a ``--peaks`` file, the part of each trace to analyse (``window``: a time
    window, steps or the steady state; None = the whole trace), the report's goal and questions,
    and the command line."""

    taxonomy: Taxonomy | None = None
    k: float = 2.0
    peaks_path: str | None = None
    goal: str | None = None
    questions: tuple[str, ...] = ()
    command: str | None = None
    window: WindowSpec | None = None


@dataclass(frozen=True)
class RunResults:
    """One trace's results: its facts (computed once) and the findings the rules drew from them."""

    facts: RunFacts
    findings: tuple[Finding, ...]
    # GPU time per operator and the story model, computed on first request (seconds on million-op traces)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)
    _summaries: dict = field(default_factory=dict, compare=False, repr=False)  # nsys summary tables, on request

    @property
    def trace(self) -> Trace:
        return self.facts.analysis.trace

    @property
    def analysis(self) -> Analysis:
        return self.facts.analysis

    @property
    def device(self) -> str | None:
        return self.facts.device

    @property
    def peaks(self) -> Peaks | None:
        return self.facts.peaks

    @property
    def memory(self) -> MemoryTimeline | None:
        return self.facts.memory

    @property
    def gap_causes(self) -> tuple[GapCause, ...]:
        return self.facts.gaps

    @property
    def roofline_estimate(self) -> Roofline | None:
        return self.facts.estimate

    @property
    def families(self) -> tuple[tuple[str, int, int, str], ...]:
        return self.facts.families

    @property
    def producer(self) -> Producer:
        return self.facts.producer

    @property
    def workload(self) -> Workload:
        return self.facts.workload

    @property
    def exposure(self) -> Exposure:
        return self.facts.exposure

    @property
    def critical_path(self) -> CriticalPath | None:
        return self.facts.critical_path

    @property
    def critical_path_scope(self) -> str:
        return self.facts.critical_scope

    @property
    def kernel_facts(self) -> KernelFacts:
        return self.facts.kernel_facts

    @property
    def story(self) -> Story:
        """The Execution Story's model (:func:`tracestory.analysis.story.story`), built on first use."""
        if "story" not in self._cache:
            self._cache["story"] = entry("tracestory.analysis.story", "story")(self.facts)
        return self._cache["story"]

    @property
    def recapture(self) -> str:
        """How to capture this program again for a fuller report (:func:`advice.recapture`)."""
        return advice.recapture(self.facts)

    @property
    def op_count(self) -> int:
        """CPU ops and CPU-side ranges of the trace: what attributing GPU time to ops walks."""
        return len(self.trace.ops) + len(self.trace.ranges)

    def operators(self, modules: bool = False) -> Operators:
        """GPU time per top-level op, leaf op and module (:mod:`tracestory.analysis.operators`),
        computed on the first call and cached. ``modules=True`` also reads the ``nn.Module``
        ranges of a Kineto trace's file (a second read of the file; without it, only module
        ranges already in the trace count).

        >>> run = tracestory.analyze("trace.json.gz").runs[0]     # doctest: +SKIP
        >>> run.operators().top_level[0].name                      # doctest: +SKIP
        'aten::linear'
        """
        key = "modules" if modules else "ops"
        if key not in self._cache:
            if modules:
                mods = _module_ranges_of(self.trace)
                compute = entry("tracestory.analysis.operators", "operators")
                self._cache[key] = compute(self.trace, mods) if mods is not None else self.operators()
            else:
                self._cache[key] = entry("tracestory.analysis.operators", "operators")(self.trace)
        return self._cache[key]

    def kernels_frame(self):
        """:meth:`Trace.kernels_frame <tracestory.trace.Trace.kernels_frame>` (one row per kernel in
        start order, real names, units in the column names) with the analysis's columns:
        ``category`` (the taxonomy's kernel category), ``phase`` (the phase whose CPU range
        launched it: ``ProfilerStep#3``, ``decode_7``; ``<NA>`` outside every phase), ``op``
        (the innermost CPU op or range around its launch call, the ``leaf_ops`` table's op) and
        ``top_op`` (the outermost: the ``ops`` table's). ``<NA>`` where the trace does not say
        (no launch call, no op around it). pandas is optional (``pip install pandas``).

        >>> df = tracestory.analyze("trace.json.gz").kernels_frame()          # doctest: +SKIP
        >>> df.groupby(["phase", "category"])["dur_ns"].sum()                 # doctest: +SKIP
        """
        import pandas as pd

        trace, a = self.trace, self.analysis
        df = trace.kernels_frame()
        n = len(trace.kernels)
        cats = np.asarray(a.classification.taxonomy.categories, dtype=object)
        df["category"] = pd.array(cats[a.classification.kernel_category].tolist() if n else [], dtype="string")
        phase = np.full(n, None, dtype=object)
        for p in a.phases.phases:
            phase[p.kernel_rows] = p.name
        df["phase"] = pd.array(phase.tolist(), dtype="string")
        ops = self.operators()
        for col, codes in (("op", ops.leaf_name[:n]), ("top_op", ops.top_name[:n])):
            names = np.asarray(trace.names(np.maximum(codes, 0)) if n else [], dtype=object)
            names[codes < 0] = None
            df[col] = pd.array(names.tolist(), dtype="string")
        return df

    @property
    def nsys_tables(self) -> dict[str, Table]:
        """The ``nsys stats`` summary tables (cuda_api_sum, cuda_gpu_mem_time_sum,
        cuda_gpu_mem_size_sum, osrt_sum; :mod:`tracestory.analysis.nsys_tables`) of this trace,
        computed on first request; a table the input cannot give says why in ``.missing``."""
        if not self._summaries:
            make_table = entry("tracestory.analysis.tables", "table")
            self._summaries.update({n: make_table(n, self.analysis) for n in NSYS_TABLES})
        return dict(self._summaries)

    @property
    def op_limit(self) -> int:
        """The most CPU ops and ranges for which the report computes GPU time per operator."""
        return REPORT_MAX_OPS

    @property
    def report_operators(self) -> Operators | None:
        """:meth:`operators` when the trace has at most :attr:`op_limit` CPU ops and ranges,
        else None (the report then points to ``tracestory analyze --table ops``)."""
        return self.operators() if self.op_count <= self.op_limit else None

    def __repr__(self) -> str:
        return (
            f"RunResults({self.trace.label!r}, kernels={self.analysis.breakdown.kernel_count}, "
            f"findings={len(self.findings)}, device={self.device!r})"
        )


@dataclass(frozen=True)
class FindingRecord:
    """One finding of a report, as the Python API gives it (:attr:`Results.findings`): what the
    Observations print and ``findings[]`` in the JSON hold, with where it comes from.

    ``trace``: the label of the trace it is about (``None`` for the multi-GPU findings and the
    findings of Nsight Compute input without a trace); ``scope``: ``trace``, ``multigpu`` or
    ``ncu``; ``rule`` and ``severity`` (``high``, ``medium``, ``low``, ``info``); ``title``;
    ``text``: what it means (the report's **Implication**); ``recommendation``; ``evidence``:
    the numbers it rests on, each ``Evidence(label, value, unit)`` in base units; ``basis``: the
    facts the claim depends on (workload, platform, trace kind)."""

    trace: str | None
    scope: str
    rule: str
    severity: str
    title: str
    text: str
    recommendation: str
    evidence: tuple[Evidence, ...]
    basis: tuple[str, ...]

    @classmethod
    def of(cls, f: Finding, trace: str | None, scope: str) -> FindingRecord:
        return cls(
            trace,
            scope,
            f.rule,
            f.severity,
            f.title,
            f.implication,
            f.recommendation,
            tuple(f.evidence),
            tuple(f.basis),
        )


@dataclass(frozen=True)
class Results:
    """Every result of one report."""

    inputs: Inputs
    options: AnalysisOptions
    runs: tuple[RunResults, ...]
    hardware: tuple[KernelMetricsResults, ...]
    ncu_findings: tuple[Finding, ...]  # findings of the kernel metrics when no trace was given
    peaks: dict  # device name -> Peaks | None, as resolved
    multigpu: MultiGpu | None
    multigpu_findings: tuple[Finding, ...]
    batching: BatchingResult | None
    limitations: tuple[Limitation, ...] = ()  # what these inputs could not support, and why
    answers: tuple[Answer, ...] = ()  # the goal and questions, each mapped to findings
    ranks: RankCoverage | None = None  # ranks given and declared (multi-rank inputs)
    selection: RankSelection | None = None  # many traces: the ones the per-trace sections tell
    telemetry: TelemetryResult | None = None  # GPU clocks, power, energy over the traced window

    @property
    def analyses(self) -> list[Analysis]:
        return [r.analysis for r in self.runs]

    @property
    def findings(self) -> tuple[FindingRecord, ...]:
        """Every finding of the report as typed records: each trace's in run order (in the
        order the Observations print them), then the multi-GPU findings, then those of Nsight
        Compute input without a trace. ``RunResults.findings`` holds one trace's as the rules
        built them.

        >>> [(f.severity, f.title) for f in tracestory.analyze("trace.json.gz").findings]   # doctest: +SKIP
        """
        out = [FindingRecord.of(f, r.trace.label, "trace") for r in self.runs for f in r.findings]
        out += [FindingRecord.of(f, None, "multigpu") for f in self.multigpu_findings]
        out += [FindingRecord.of(f, None, "ncu") for f in self.ncu_findings]
        return tuple(out)

    @property
    def manifest(self) -> dict | None:
        return self.inputs.manifest

    def table(self, name: str, run: int | None = 0) -> Table:
        """The named table (one of :data:`~tracestory.analysis.tables.TABLES`: kernels,
        categories, ops, leaf_ops, modules, phases, gaps, collectives, roofline, and the nsys
        summaries cuda_api_sum, cuda_gpu_mem_time_sum, cuda_gpu_mem_size_sum, osrt_sum) of trace
        ``run``; with ``run=None`` the tables of every trace one after the other, a ``trace``
        column (the trace's label) first. A table the input cannot give has no rows and says
        why in ``.missing`` (``osrt_sum`` of an export captured without ``--trace=osrt``).
        Columns are in base units, the unit in the name (``total_ns``, ``share`` 0..1);
        ``.to_pandas()``, ``.to_arrow()``, ``.to_csv(f)``, ``.to_markdown()``.

        >>> results = tracestory.analyze("trace.json.gz")          # doctest: +SKIP
        >>> results.table("ops").to_pandas().head()                 # doctest: +SKIP
        """
        if name not in TABLES:
            raise UsageError(f"unknown table {name!r}: expected one of {', '.join(TABLES)}")
        if run is not None:
            r = self.runs[run]
            ops = r.operators(modules=name == "modules") if name in ("ops", "leaf_ops", "modules") else None
            make_table = entry("tracestory.analysis.tables", "table")
            return make_table(name, r.analysis, operators=ops, roofline=self._roofline_of(run))
        Table = entry("tracestory.analysis.tables", "Table")
        parts = [self.table(name, i) for i in range(len(self.runs))]
        if not parts:
            return Table(name, {})
        given = [(p, r) for p, r in zip(parts, self.runs, strict=False) if p.missing is None]
        if not given:  # no trace can give it: the first one's reason
            return parts[0]
        notes = [f"{r.trace.label}: {p.missing}" for p, r in zip(parts, self.runs, strict=False) if p.missing]
        notes += [f"{r.trace.label}: {p.note}" for p, r in given if p.note]
        parts, runs = [p for p, _ in given], [r for _, r in given]
        labels = np.concatenate(
            [np.full(len(p), r.trace.label, dtype=object) for p, r in zip(parts, runs, strict=False)]
        )
        columns: dict[str, Any] = {"trace": labels}
        for c in parts[0].columns:
            vals = [p[c] for p in parts]
            if all(isinstance(v, np.ndarray) for v in vals):
                columns[c] = np.concatenate(vals)
            else:
                columns[c] = [x for v in vals for x in (v.tolist() if isinstance(v, np.ndarray) else v)]
        return Table(name, columns, note="; ".join(notes) or None)

    def kernels_frame(self, run: int = 0):
        """The kernels of trace ``run`` as a pandas DataFrame with their ``category``, ``phase``,
        ``op`` and ``top_op`` (:meth:`RunResults.kernels_frame`)."""
        return self.runs[run].kernels_frame()

    def _roofline_of(self, run: int) -> tuple[Roofline | None, str, str | None]:
        """The roofline of trace ``run`` for its table: Nsight Compute's (joined to the first
        trace) when given, else the shape estimate; with the reason when there is none."""
        if self.hardware:
            if run == 0:
                return self.hardware[0].roofline, "ncu", None
            return None, "", "Nsight Compute metrics are joined to the first trace only (no estimate beside them)"
        return self.runs[run].roofline_estimate, "estimate", None

    def __repr__(self) -> str:
        labels = [r.trace.label for r in self.runs[:3]] + (["..."] if len(self.runs) > 3 else [])
        return (
            f"Results(runs={labels!r}, ncu_inputs={len(self.hardware)}, "
            f"findings={sum(len(r.findings) for r in self.runs) + len(self.ncu_findings)}, "
            f"multigpu={self.multigpu is not None}, batching={self.batching is not None})"
        )


def _module_ranges_of(trace: Trace):
    """The ``nn.Module`` call ranges of a Kineto trace's file, None when there are none or the
    file cannot be read again (another source, or a trace built in memory)."""
    path = trace.meta.source_path
    if trace.meta.source_format != "kineto" or not path or not os.path.isfile(path):
        return None
    mods = entry("tracestory.ingest.kineto_modules", "load_module_ranges")(path)
    through = ((trace.meta.extra or {}).get("truncated") or {}).get("complete_through_ns")
    if through is not None and len(mods):  # a cut file: the calls past the cut (ingest.kineto)
        mods = mods.take(mods["end_ns"] <= through)
    return mods if len(mods) else None


def _device(trace: Trace) -> str | None:
    devs = trace.meta.devices
    return devs[0].name if devs and devs[0].name else None


def is_multigpu(traces) -> bool:
    """Several ranks: two traces or more, with distinct ranks or with collectives."""
    if len(traces) < 2:
        return False
    ranks = {t.meta.rank for t in traces if t.meta.rank is not None}
    return len(ranks) >= 2 or any(len(t.collectives) for t in traces)


def multigpu_of(summaries: Sequence[RankSummary]) -> MultiGpu:
    """The multi-GPU result of the ranks' summaries (:func:`~.multigpu.combine`) with its
    one-sentence headline (``MultiGpu.headline``) told once."""
    mg = entry("tracestory.analysis.multigpu", "combine")(summaries)
    return dataclasses.replace(mg, headline=entry("tracestory.analysis.findings.multigpu", "headline")(mg))


@dataclass(frozen=True)
class RankResults:
    """``tracestory ranks``: the multi-GPU result of many rank traces and its findings."""

    multigpu: MultiGpu
    findings: tuple[Finding, ...]

    def __repr__(self) -> str:
        return f"RankResults(ranks={len(self.multigpu.ranks)}, findings={len(self.findings)})"


def analyze_ranks(paths: Sequence[str], workers: int | None = None, dask_address: str | None = None) -> RankResults:
    """Each rank trace of ``paths`` (files, folders, globs, a ``--torchrun`` capture) summarised in
    a worker (:func:`~tracestory.parallel.map_ranks`: a process pool, or a dask cluster at
    ``dask_address``), then combined: the multi-GPU result and its findings. At least 2 ranks."""
    sources = entry("tracestory.ingest.ranks", "rank_sources")(paths)
    if len(sources) < 2:
        raise UsageError(f"{' '.join(paths)}: expected the traces of at least 2 ranks, found {len(sources)}")
    rank_summary = entry("tracestory.analysis.multigpu", "rank_summary")
    map_ranks = entry("tracestory.parallel", "map_ranks")
    mg = multigpu_of(map_ranks(sources, rank_summary, workers=workers, dask_address=dask_address))
    return RankResults(
        multigpu=mg, findings=tuple(entry("tracestory.analysis.findings.multigpu", "multigpu_findings")(mg))
    )


def analyze_inputs(inputs: Inputs, options: AnalysisOptions | None = None) -> Results:
    """All results of ``inputs`` (see the module docstring for what is computed, once)."""
    options = options or AnalysisOptions()
    if options.window is not None:  # --window, --steps, --steady-state
        inputs = entry("tracestory.analysis.window", "window_inputs")(inputs, options.window)
    traces = list(inputs.traces)
    first = traces[0] if traces else None
    names = [_device(t) for t in traces]
    names += [km.device_name or (_device(first) if first else None) for _, km in inputs.kernel_metrics]
    peaks = resolve_peaks(names, options.peaks_path, manifest=inputs.manifest)

    hw: list[KernelMetricsResults] = []
    for path, km in inputs.kernel_metrics:
        device = km.device_name or (_device(first) if first else None)
        pk = peaks.get(device) if device else None
        join = entry("tracestory.analysis.ncu_join", "join_ncu")(first, km) if first is not None else None
        rf = roofline(km, pk)
        hw.append(
            KernelMetricsResults(
                path=path,
                metrics=km,
                device=device,
                peaks=pk,
                peaks_warning=peaks_warning(device) if pk is None else None,
                join=join,
                roofline=rf,
                kernels=hardware_analysis(km, join, rf, pk, top=TOP_HARDWARE_KERNELS),
                waves=tuple(waves(k) for k in km.kernels),
            )
        )
    hardware = tuple(hw)

    coverage = rank_coverage(traces) if traces else None
    mg: MultiGpu | None = None
    if is_multigpu(traces):
        rank_summary = entry("tracestory.analysis.multigpu", "rank_summary")
        mg = multigpu_of([rank_summary(t) for t in traces])
    waits = (mg.rank_wait_ns or {}) if mg is not None else {}
    log = inputs.scheduler_log
    serving = (
        ", ".join(x for x in (log.meta.engine, log.meta.model and f"model '{log.meta.model}'") if x)
        or "a scheduler log"
        if log is not None
        else None
    )
    runs = []
    for i, trace in enumerate(traces):
        device = _device(trace)
        facts = run_facts(
            analyze(trace, options.taxonomy, k=options.k),
            peaks.get(device) if device else None,
            hardware,
            first=i == 0,
            comm_wait_ns=waits.get(trace.meta.rank) if trace.meta.rank is not None else None,
            ranks=(coverage.given, coverage.declared) if coverage else (1, None),
            serving_log=serving,
        )
        runs.append(RunResults(facts=facts, findings=derive_findings(facts)))

    batching = None
    if inputs.scheduler_log is not None:
        batching = entry("tracestory.analysis.batching", "analyze_batching")(
            inputs.scheduler_log, trace=first, client=inputs.load_summary, manifest=inputs.manifest
        )
    return Results(
        inputs=inputs,
        options=options,
        runs=tuple(runs),
        hardware=hardware,
        ncu_findings=ncu_findings(hardware) if hardware and not runs else (),
        peaks=peaks,
        multigpu=mg,
        multigpu_findings=tuple(
            entry("tracestory.analysis.findings.multigpu", "multigpu_findings")(
                mg, coverage, [r.facts.workload.kind for r in runs], [r.facts.producer.mode for r in runs]
            )
        )
        if mg is not None
        else (),
        batching=batching,
        limitations=limitations(
            traces,
            [r.analysis for r in runs],
            has_kernel_metrics=bool(hardware),
            dropped_estimates=sum(len(r.roofline_estimate.dropped) for r in runs if r.roofline_estimate is not None),
            kernel_metrics_warnings=[(h.path, w) for h in hardware for w in getattr(h.metrics, "warnings", ()) or ()],
            not_estimated=[
                x for r in runs if r.roofline_estimate is not None for x in r.roofline_estimate.not_estimated
            ],
            platforms=[r.facts.platform for r in runs],
        )
        + _withheld(runs)
        + capture_limitations(inputs)
        + input_limitations(inputs)
        + telemetry_limitations(inputs),
        answers=entry("tracestory.analysis.questions", "answer_all")(
            options.goal,
            options.questions,
            [f for r in runs for f in r.findings],
            _sections_with_data(runs, hardware, mg, batching),
        )
        if options.goal or any(options.questions)  # the report's questions, when asked
        else (),
        ranks=coverage,
        selection=select_runs(runs),
        telemetry=entry("tracestory.analysis.telemetry", "analyze_telemetry")(
            inputs.telemetry, traces, inputs.scheduler_log
        )
        if inputs.telemetry
        else None,
    )


def _withheld(runs: list[RunResults]) -> tuple[Limitation, ...]:
    """What the inputs could not tell that hides advice (:func:`claims.withheld`), once per reason."""
    seen: dict[str, list[str]] = {}
    for r in runs:
        for reason in withheld(r.facts):
            seen.setdefault(reason, []).append(r.trace.label)
    return tuple(
        Limitation("advice", reason if len(labels) == len(runs) else f"{', '.join(labels[:3])}: {reason}")
        for reason, labels in seen.items()
    )


MANY_RANKS = 4  # above this many traces, the per-trace story is told once
OUTLIER_SPREAD = 0.10  # a rank whose GPU op time or busy share differs from the median by more


@dataclass(frozen=True)
class RankSelection:
    """Many traces told once: the median trace (by GPU op time) stands for the rest, and the
    traces that differ from it by more than 10% in GPU op time or GPU busy share are named with
    what sets them apart. Per-trace numbers stay in the Appendix table and the JSON."""

    median: int  # index into Results.runs
    outliers: tuple[tuple[int, str], ...]  # (index, what sets it apart), at most 3
    total_ns: tuple[float, float, float]  # GPU op time: min, median, max over traces
    busy: tuple[float, float, float] | None  # GPU busy share: min, median, max

    @property
    def shown(self) -> tuple[int, ...]:
        return (self.median, *(i for i, _ in self.outliers))


def select_runs(runs) -> RankSelection | None:
    """The :class:`RankSelection` of more than :data:`MANY_RANKS` traces, else None."""
    if len(runs) <= MANY_RANKS:
        return None
    total = [float(r.analysis.breakdown.total_time_ns) for r in runs]
    busy = [
        r.analysis.timeline.busy_ns / r.analysis.timeline.window_ns
        if r.analysis.timeline is not None and r.analysis.timeline.window_ns
        else None
        for r in runs
    ]
    order = sorted(range(len(runs)), key=lambda i: (total[i], i))
    median = order[len(order) // 2]
    med_t = total[median]
    known = [b for b in busy if b is not None]
    med_b = sorted(known)[len(known) // 2] if known else None
    scored = []
    for i in range(len(runs)):
        if i == median:
            continue
        why = []
        if med_t > 0 and abs(total[i] / med_t - 1) > OUTLIER_SPREAD:
            why.append(f"GPU op time {total[i] / med_t:.2f}x the median trace's")
        bi = busy[i]
        if med_b and bi is not None and abs(bi - med_b) > OUTLIER_SPREAD:
            why.append(f"GPU busy {bi * 100:.1f}% against {med_b * 100:.1f}%")
        if why:
            scored.append((abs(total[i] / med_t - 1) if med_t else 0.0, i, "; ".join(why)))
    scored.sort(reverse=True)
    return RankSelection(
        median,
        tuple((i, w) for _, i, w in scored[:3]),
        (min(total), med_t, max(total)),
        (min(known), sorted(known)[len(known) // 2], max(known)) if known else None,
    )


def _sections_with_data(runs, hardware, multigpu, batching) -> tuple[str, ...]:
    """The report sections that hold numbers for these inputs (for answering questions)."""
    out = ["Executive Summary"] if runs or hardware else []
    if runs:
        out += ["Execution Story", "Visualizations", "Appendix"]
    if hardware or any(r.roofline_estimate is not None and r.roofline_estimate.points for r in runs):
        out.append("Hardware Behavior Analysis")
    if any(r.memory is not None for r in runs):
        out.append("Memory")
    if multigpu is not None:
        out.append("Multi-GPU")
    if batching is not None:
        out.append("Continuous Batching")
    return tuple(out)
