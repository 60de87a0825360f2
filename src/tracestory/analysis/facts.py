"""Typed facts of one run, computed once: what every rule and renderer reads.

:func:`run_facts` builds a frozen :class:`RunFacts` per trace: the standard analysis (categories,
timeline, phases), the GPU peaks, the memory timeline, the idle gaps with the CPU work under them,
the roofline (Nsight Compute counters, else the shape estimate, with which one it is), the joins
of the ncu inputs to the trace, the producer, the kind of trace, the workload with its evidence,
what the program already uses, the per-category exposure, the critical path and the kernel facts.

Rules (:mod:`tracestory.analysis.claims`) take a :class:`RunFacts` and nothing else; nothing
downstream computes one of these again. Fields are ``None`` only where the input cannot support
them (no timeline: no gaps, no critical path; no PyTorch memory events: no memory timeline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..lazy import entry
from ..specs import Peaks, peaks_for
from ..trace import Trace
from . import Analysis
from .critical_path import CriticalPath, step_critical_path
from .exposure import Exposure, exposure
from .families import family_table, kernel_precision
from .gaps import GapCause, gap_causes
from .gpu_ops import GpuOps, IdleGaps, gpu_ops, idle_gaps
from .hardware import KernelHardware
from .kernels import KernelFacts, kernel_facts
from .limitations import PhaseCoverage, coverage_of_phases
from .memory import MemoryTimeline, memory_timeline
from .producer import Producer, detect_producer
from .roofline import Roofline, estimate_roofline
from .trace_kind import TraceKind, trace_kind
from .workload import Workload, classify_workload

if TYPE_CHECKING:  # Nsight Compute's reader and join are imported when such an input comes (tracestory.lazy)
    from ..ingest.ncu import KernelMetrics
    from .ncu_join import NcuJoin

LONG_GAP_SHARE = 0.5  # idle time in gaps >= 1 ms above this share is host work or waits, not launch cost
LOW_PRECISIONS = ("nvfp4", "mxfp4", "mxfp8", "fp8", "int8", "int4")


@dataclass(frozen=True)
class KernelMetricsResults:
    """One Nsight Compute input: its kernels joined to the first trace and on the roofline."""

    path: str
    metrics: KernelMetrics
    device: str | None
    peaks: Peaks | None
    peaks_warning: str | None  # why the roofline percentages are n/a, else None
    join: NcuJoin | None  # None without a trace
    roofline: Roofline
    kernels: tuple[KernelHardware, ...]  # the top kernels, interpreted
    waves: tuple[float | None, ...]  # per kernel of ``metrics``: grid blocks / (SMs x blocks per SM)

    def __repr__(self) -> str:
        return f"KernelMetricsResults({self.path!r}, kernels={len(self.metrics.kernels)}, device={self.device!r})"


@dataclass(frozen=True)
class InUse:
    """What the program already does, so no advice tells it to adopt it. Each entry is the name
    that shows it (``None``: not seen)."""

    graphs: str | None  # kernels replayed from CUDA/HIP graph launches
    compiled: str | None  # torch.compile (Inductor) kernels or regions
    fused_norm: str | None  # an RMSNorm/LayerNorm kernel (not decomposed elementwise ops)
    fused_activation: str | None  # a gated activation kernel (silu_and_mul, act_and_mul)
    fused_rope: str | None  # a rotary-embedding kernel
    paged_kv: str | None  # paged KV cache (paged attention, cache writes)
    split_kv: str | None  # split-KV / flash-decoding attention
    low_precision_gemm: tuple[str, ...]  # precisions below 16 bits that GEMM kernels name
    fused_attention: str | None  # a fused attention kernel (FlashAttention, cuDNN SDPA, ...)


@dataclass(frozen=True)
class RunFacts:
    """Everything known about one trace, computed once (see the module docstring)."""

    analysis: Analysis
    device: str | None
    peaks: Peaks | None
    kind: TraceKind
    producer: Producer
    workload: Workload
    in_use: InUse
    memory: MemoryTimeline | None
    gaps: tuple[GapCause, ...]
    estimate: Roofline | None  # the shape estimate; None when ncu metrics were given
    hardware: tuple[KernelMetricsResults, ...]
    joins: tuple[NcuJoin, ...]  # each ncu input joined to this trace, in input order
    exposure: Exposure
    critical_path: CriticalPath | None
    critical_scope: str  # "the whole trace" or "the median step (NAME)"
    kernel_facts: KernelFacts
    families: tuple[tuple[str, int, int, str], ...]
    gpu_ops: GpuOps  # kernels then memops with category and launch, built once
    idle: IdleGaps  # every idle gap between busy periods, with its launch wait
    phase_coverage: PhaseCoverage | None  # kernel time inside the phases; None without phases
    # with several ranks: this rank's time inside collectives spent waiting for the last rank to
    # arrive (kernels running, no data moving); None with one rank, where the wait cannot be told
    comm_wait_ns: int | None = None
    # the ranks of the job among the inputs: (given, declared world size or None)
    ranks: tuple[int, int | None] = (1, None)

    @property
    def some_ranks_missing(self) -> bool:
        """The job ran on more ranks than the inputs hold: waits on the missing ones cannot be told."""
        given, declared = self.ranks
        return declared is not None and given < declared

    @property
    def trace(self) -> Trace:
        return self.analysis.trace

    @property
    def platform(self) -> str:
        return self.producer.platform

    @property
    def long_gap_share(self) -> float | None:
        """Share of the idle time that sits in gaps of 1 ms or more (the longest 50): host work or
        waits, which per-launch overhead cannot make. None without idle time."""
        tl = self.analysis.timeline
        if tl is None or not tl.idle_ns:
            return None
        return sum(g.dur_ns for g in self.gaps) / tl.idle_ns

    @property
    def launch_bound(self) -> bool:
        """The timeline's launch-bound verdict, unless most idle time is in long gaps (host work, waits)."""
        tl = self.analysis.timeline
        return bool(
            tl is not None
            and self.kind.kind == "timeline"
            and tl.launch_bound
            and (self.long_gap_share or 0.0) < LONG_GAP_SHARE
        )

    def __repr__(self) -> str:
        return (
            f"RunFacts({self.trace.label!r}, kind={self.kind.kind}, workload={self.workload.kind}, "
            f"platform={self.platform})"
        )


def _in_use(a: Analysis, producer: Producer, workload: Workload, kf: KernelFacts) -> InUse:
    w = workload
    cats = tuple(a.classification.taxonomy.categories)
    gemm_names: set[str] = set()
    if "gemm" in cats:
        codes = np.unique(a.trace.kernels["name"][a.classification.kernel_category == cats.index("gemm")])
        gemm_names = {a.trace.name(int(c)) for c in codes}
    low = tuple(sorted({kernel_precision(n) for n in gemm_names} & set(LOW_PRECISIONS)))
    g = producer.graphs
    fused_attn = next((impl for impl, _, _ in kf.attention if impl and "unfused" not in impl.lower()), None)
    return InUse(
        graphs=f"{g.graph_kernels} kernels from {g.graph_launches} graph launches" if g.graph_kernels else None,
        compiled="torch.compile (Inductor)" if producer.compiled else None,
        fused_norm=w.shown_by("rms_norm_fused") if w.has("rms_norm_fused") else None,
        fused_activation=w.shown_by("gated_act_fused"),
        fused_rope=w.shown_by("rope_fused"),
        paged_kv=w.shown_by("paged_kv") or (f"{producer.engine} (paged KV cache)" if producer.engine else None),
        split_kv=w.shown_by("split_kv"),
        low_precision_gemm=low,
        fused_attention=fused_attn,
    )


def _device(trace: Trace) -> str | None:
    devs = trace.meta.devices
    return devs[0].name if devs and devs[0].name else None


def run_facts(
    analysis: Analysis,
    peaks: Peaks | None,
    hardware: tuple[KernelMetricsResults, ...] = (),
    first: bool = True,
    comm_wait_ns: int | None = None,
    ranks: tuple[int, int | None] = (1, None),
    serving_log: str | None = None,
) -> RunFacts:
    """The :class:`RunFacts` of one analysed trace. ``hardware``: the Nsight Compute inputs
    (joined to the first trace already; ``first=False`` joins them to this one); ``comm_wait_ns``:
    this rank's wait inside collectives, from the multi-GPU result; ``serving_log``: the engine and
    model of a scheduler event log given with the trace (evidence of the workload)."""
    trace = analysis.trace
    producer = detect_producer(trace)
    cats = tuple(analysis.classification.taxonomy.categories)
    attention_ran = "attention" in cats and bool(
        (analysis.classification.kernel_category == cats.index("attention")).any()
    )
    kf = kernel_facts(analysis, producer)
    workload = classify_workload(trace, producer, attention_ran, kf.unfused_attention, serving_log)
    has_timeline = analysis.timeline is not None
    path, scope = step_critical_path(trace, analysis.classification, analysis.phases) if has_timeline else (None, "")
    ops = gpu_ops(trace, analysis.classification)
    joins = (
        tuple(h.join for h in hardware if h.join is not None)
        if first
        else tuple(entry("tracestory.analysis.ncu_join", "join_ncu")(trace, h.metrics) for h in hardware)
    )
    return RunFacts(
        analysis=analysis,
        device=_device(trace),
        peaks=peaks,
        kind=trace_kind(trace),
        producer=producer,
        workload=workload,
        in_use=_in_use(analysis, producer, workload, kf),
        memory=memory_timeline(trace, analysis.phases),
        gaps=tuple(gap_causes(trace, steps=analysis.phases)) if has_timeline else (),
        estimate=estimate_roofline(trace, peaks) if not hardware else None,
        hardware=tuple(hardware),
        joins=joins,
        exposure=exposure(trace, analysis.classification),
        critical_path=path,
        critical_scope=scope,
        kernel_facts=kf,
        families=tuple(family_table(trace)),
        gpu_ops=ops,
        idle=idle_gaps(ops, trace),
        phase_coverage=coverage_of_phases(trace, analysis.phases),
        comm_wait_ns=comm_wait_ns,
        ranks=ranks,
    )


__all__ = ["InUse", "KernelMetricsResults", "RunFacts", "run_facts"]


def facts_for(analysis: Analysis, peaks: Peaks | None = None) -> RunFacts:
    """:func:`run_facts` of one analysed trace without Nsight Compute input; ``peaks`` default to the
    built-in table for the trace's device (``None`` for an unknown GPU). For tests and notebooks."""
    name = _device(analysis.trace)
    return run_facts(
        analysis,
        peaks if peaks is not None else (peaks_for(name) if name else None),
        ranks=(1, analysis.trace.meta.world_size),
    )
