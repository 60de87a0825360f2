"""Observations rule engine: findings derived from the analysis results.

Each rule reads the results of one trace (breakdown, timeline, phases, plus a few cheap
lookups on the trace itself) and returns zero or more :class:`Finding`: a title, the numbers
that support it (:class:`Evidence`, raw values in base units so the report can format them and
tests can trace every printed number back to a result), the implication, a recommendation and
a severity. Rules never print and never guess: a rule whose inputs are absent returns nothing.

Rules, in report order within a severity (a dominant category is at most "medium" when the
GPU is idle half its window, since kernel time is then not the first lever):

* ``gpu_idle`` (launch-bound): idle share of the GPU window, its split (launch wait vs other),
  short kernels, kernels per ms, launch latency, gap count, mean and largest gap; the verdict is
  the timeline's ``launch_bound``.
* ``cpu_stall``: idle gaps of at least 1 ms whose cause is one CPU op. The cause of a gap
  ``[g0, g1)`` is the innermost CPU op (same thread as the launch call) that encloses the launch
  call of the GPU op starting at ``g1`` and lasts at least half the gap: the host was inside it
  while the GPU waited. Gaps are grouped by that op's name.
* ``dominant_category``: the category with the most GPU op time, its share p, the Amdahl
  ceiling ``1/(1-p)`` (that category at zero cost) and the what-if ``1/((1-p)+p/k)``. Because
  the breakdown's base is GPU op time, not wall time, the finding also gives the ceiling on the
  GPU window when idle time is kept: ``W / (W - c)`` with W the window and c the category's
  busy time inside it (its union, overlaps counted once) - the honest end-to-end bound.
* ``first_step``, ``step_outlier``, ``step_trend`` (ITL against KV length): :mod:`.steps`.
* ``bound`` (memory- vs compute-bound kernels, from ncu counters or the shape estimate),
  ``occupancy_limiter``, ``occupancy_achieved`` (ncu only): :mod:`.hardware`.
* ``memcpy_share``: memcpy + memset >= 5% of GPU op time, split by copy kind.
* ``communication``: communication kernels' share and the part of their time overlapped by
  other GPU ops (intersection of unions).
* ``eager_fusion``: no Triton kernels and >= 30% of launches in small-op categories
  (elementwise, norm, reduction, softmax, rope, embedding): a fusion candidate; or, with Triton
  kernels, a note that the run is compiled.
* ``memory`` (peak, fragmentation, what ran at the peak): :mod:`.memory`.

The multi-GPU rules (straggler, imbalance, communication, clocks, bandwidth) take the combined
multi-GPU result instead of one trace: :mod:`.multigpu`. The comparison rules stay with their
model in :mod:`tracestory.analysis.compare`. Every rule runs once per report, from
:func:`~tracestory.analysis.results.analyze_inputs`.

The records (:class:`Finding`, :class:`Evidence`) live in :mod:`.base` and are
re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...trace import MEMOP_KINDS, Trace
from .. import intervals
from ..links import gpu_ops_column, launch_index
from .base import SEVERITIES, Evidence, Finding, capital
from ...units import fmt_ns, fmt_pct
from .hardware import rule_bound, rule_occupancy
from .memory import rule_memory
from .steps import rule_first_step, rule_step_outlier, rule_step_trend

__all__ = ["SEVERITIES", "Evidence", "Finding", "GapCause", "derive_findings", "ncu_findings",
           "gap_causes", "category_mask"]

SMALL_OP_CATEGORIES = ("elementwise", "norm", "reduction", "softmax", "rope", "embedding")
COMM_CATEGORIES = ("communication", "allreduce")
STALL_MIN_NS = 1_000_000
MEMCPY_SHARE = 0.05


@dataclass(frozen=True)
class GapCause:
    start_ns: int
    dur_ns: int
    launch_wait_ns: int
    after: str               # GPU op that ended the gap
    op_name: str | None      # CPU op the host was inside while the GPU waited
    op_dur_ns: int | None


# ------------------------------------------------------------------ small helpers


_t, _p = fmt_ns, fmt_pct


def _cat_names(analysis) -> tuple[str, ...]:
    return tuple(analysis.classification.taxonomy.categories)


def category_mask(analysis, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks over kernels and memops whose category is one of ``names``."""
    cats = _cat_names(analysis)
    codes = [i for i, c in enumerate(cats) if c in names]
    cl = analysis.classification
    return np.isin(cl.kernel_category, codes), np.isin(cl.memop_category, codes)


def gpu_ops(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of every GPU op (kernels then memops)."""
    return gpu_ops_column(trace, "start_ns"), gpu_ops_column(trace, "end_ns")


def gap_causes(trace: Trace, *, min_ns: int = STALL_MIN_NS, limit: int = 50) -> tuple[GapCause, ...]:
    """The longest idle gaps (>= ``min_ns``, at most ``limit``, longest first) with the CPU op
    the host was inside while the GPU waited (see the module docstring); ``op_name`` is None
    when no enclosing op lasts half the gap or the next op's launch is unknown."""
    s, e = gpu_ops(trace)
    g0, g1 = intervals.gaps(s, e)
    dur = g1 - g0
    keep = np.flatnonzero(dur >= min_ns)
    keep = keep[np.argsort(-dur[keep], kind="stable")][:limit]
    if keep.size == 0:
        return ()
    k, m = trace.kernels, trace.memops
    k_launch, m_launch = launch_index(trace, k), launch_index(trace, m)
    api, ops = trace.api, trace.ops
    out = []
    for gi in keep:
        a, b = int(g0[gi]), int(g1[gi])
        # The op starting at the gap end: a kernel if one starts there, else a memop.
        hit = np.flatnonzero(k["start_ns"] == b)
        if hit.size:
            row, li, name_code = hit[0], k_launch[hit[0]], k["name"][hit[0]]
        else:
            hit = np.flatnonzero(m["start_ns"] == b)
            row = hit[0] if hit.size else -1
            li = m_launch[row] if row >= 0 else -1
            name_code = m["name"][row] if row >= 0 else -1
        after = trace.name(int(name_code)) if row >= 0 else ""
        wait, op_name, op_dur = 0, None, None
        if li >= 0:
            ls, le, tid = api["start_ns"][li], api["end_ns"][li], api["tid"][li]
            wait = int(np.clip(le - a, 0, b - a))
            od = ops["end_ns"] - ops["start_ns"]
            enc = (ops["start_ns"] <= ls) & (ops["end_ns"] >= le) & (od >= (b - a) // 2)
            if tid >= 0:
                enc &= ops["tid"] == tid
            cand = np.flatnonzero(enc)
            if cand.size:
                j = cand[np.argmin(od[cand])]
                op_name, op_dur = trace.name(int(ops["name"][j])), int(od[j])
        out.append(GapCause(a, b - a, wait, after, op_name, op_dur))
    return tuple(out)


# ------------------------------------------------------------------ rules

_ADVICE = {
    "gemm": "check the GEMM shapes and precision: batch more tokens per GEMM, keep dimensions "
            "multiples of 64/128 for the tensor cores, and try a lower precision (fp8) where "
            "accuracy allows",
    "attention": "use a fused attention backend suited to the phase (FlashAttention / "
                 "FlashInfer; a decode-specialised kernel for one-token queries)",
    "communication": "overlap collectives with compute (bucketing, async all-reduce) or "
                     "reduce their volume (gradient compression, larger buckets)",
    "allreduce": "overlap collectives with compute or reduce their volume",
    "memcpy": "remove host<->device copies from the step (pinned memory, keep tensors on the "
              "GPU, avoid .item()/.cpu() in the loop)",
    "memset": "avoid re-zeroing buffers every step (reuse or torch.empty)",
    "other": "look at the top kernels of 'other' and add a rule for them (--rules FILE) so the "
             "breakdown says what they are",
}
_FUSE = ("fuse the small ops: torch.compile (Inductor) or fused kernels (fused RMSNorm, fused "
         "SwiGLU, fused RoPE) cut launches and memory round-trips")


def rule_dominant_category(a) -> list[Finding]:
    b = a.breakdown
    if not b.categories or b.total_time_ns <= 0:
        return []
    top = max(b.categories, key=lambda c: c.time_ns)
    p = top.time_ns / b.total_time_ns
    ev = [Evidence("share of GPU op time", p, "fraction"),
          Evidence("time", top.time_ns, "ns"),
          Evidence("ops", top.count, "count"),
          Evidence("Amdahl ceiling (category at zero cost)", top.amdahl_max_speedup, "x"),
          Evidence(f"what-if {b.speedup_factor:g}x faster category", top.whatif_speedup, "x")]
    if top.top_kernels:
        ev.append(Evidence("top kernel", top.top_kernels[0].name, "text"))
    implication = (f"{top.name} is {_p(p)} of GPU op time: it is where a kernel-level "
                   f"optimisation pays most.")
    tl = a.timeline
    if tl is not None and tl.window_ns > 0:
        km, mm = category_mask(a, (top.name,))
        s = np.concatenate([a.trace.kernels["start_ns"][km], a.trace.memops["start_ns"][mm]])
        e = np.concatenate([a.trace.kernels["end_ns"][km], a.trace.memops["end_ns"][mm]])
        c = intervals.union_length(s, e)
        if c < tl.window_ns:
            wc = tl.window_ns / (tl.window_ns - c)
            ev.append(Evidence("ceiling on the GPU window (idle kept)", wc, "x"))
            if tl.idle_fraction >= 0.2:
                implication += (f" But the GPU is idle {_p(tl.idle_fraction)} of its window, so "
                                f"removing {top.name} entirely would shorten the window only "
                                f"{wc:.2f}x: idle time is the bigger lever.")
    sev = "high" if p >= 0.5 else "medium" if p >= 0.25 else "low"
    if sev == "high" and tl is not None and tl.idle_fraction >= 0.5:
        sev = "medium"  # the GPU is mostly idle: kernel time is not the first lever
    rec = _ADVICE.get(top.name, _FUSE if top.name in SMALL_OP_CATEGORIES else
                      f"profile the top {top.name} kernels with Nsight Compute to see what bounds them")
    return [Finding("dominant_category", sev, f"{top.name} dominates GPU op time ({_p(p)})",
                    tuple(ev), implication, rec[:1].upper() + rec[1:] + ".")]


def rule_gpu_idle(a) -> list[Finding]:
    tl = a.timeline
    if tl is None or tl.window_ns <= 0:
        return []
    wait_share = tl.idle_launch_wait_ns / tl.idle_ns if tl.idle_ns > 0 else None
    ev = (Evidence("GPU window", tl.window_ns, "ns"),
          Evidence("GPU busy (union)", tl.busy_ns, "ns"),
          Evidence("idle share of window", tl.idle_fraction, "fraction"),
          Evidence("idle waiting for launches", tl.idle_launch_wait_ns, "ns"),
          Evidence("idle for other reasons (sync, dependencies)", tl.idle_other_ns, "ns"),
          Evidence("launch-wait share of idle", wait_share, "fraction"),
          Evidence("kernels shorter than 10 us", tl.short_kernel_share, "fraction"),
          Evidence("kernels per ms of window", tl.kernels_per_ms, "per_ms"),
          Evidence("launch latency p50 (call start -> GPU start)", tl.launch_latency.p50_ns, "ns"),
          Evidence("idle gaps", tl.gap_count, "count"),
          Evidence("mean gap", tl.idle_ns / tl.gap_count if tl.gap_count else None, "ns"),
          Evidence("largest gap", tl.largest_gaps[0].dur_ns if tl.largest_gaps else None, "ns"))
    if tl.launch_bound:
        sev = "high" if tl.idle_fraction >= 0.5 else "medium"
        title = f"Launch-bound: the GPU is idle {_p(tl.idle_fraction)} of its window"
        imp = ("The host, not the GPU, sets the pace: "
               + (f"{_p(wait_share)} of the idle time is spent before the next GPU op was even "
                  f"launched. " if wait_share is not None else "")
               + "Faster kernels would not shorten this run; less host work per GPU op would.")
        rec = ("Cut host overhead per step: capture the step in CUDA Graphs (torch.compile "
               "mode='reduce-overhead' or torch.cuda.graphs), fuse small ops, remove host syncs, "
               "and look at what the CPU does inside the largest gaps (Appendix: largest gaps).")
    elif tl.idle_fraction >= 0.2:
        sev = "medium"
        title = f"GPU idle {_p(tl.idle_fraction)} of its window, mostly not launch wait"
        imp = ("Ops were submitted but waited: synchronisation, cross-stream dependencies or "
               "copies gate the GPU.")
        rec = "Look for host syncs (.item(), .cpu(), cudaStreamSynchronize) and event waits in the largest gaps."
    else:
        sev = "info"
        title = f"GPU kept busy: idle {_p(tl.idle_fraction)} of its window"
        imp = "The run is GPU-bound: kernel time is what to optimise."
        rec = "Work on the dominant category's kernels."
    return [Finding("gpu_idle", sev, title, ev, imp, rec)]


def rule_cpu_stall(a, gaps=None) -> list[Finding]:
    tl = a.timeline
    if tl is None or tl.idle_ns <= 0:
        return []
    causes = [g for g in (gap_causes(a.trace) if gaps is None else gaps) if g.op_name]
    if not causes:
        return []
    groups: dict[str, list[GapCause]] = {}
    for g in causes:
        groups.setdefault(g.op_name, []).append(g)
    out = []
    for name, gs in sorted(groups.items(), key=lambda kv: -sum(g.dur_ns for g in kv[1])):
        total = sum(g.dur_ns for g in gs)
        share = total / tl.idle_ns
        if share < 0.1:
            continue
        durs = np.array([g.dur_ns for g in gs])
        ev = (Evidence("gaps", len(gs), "count"),
              Evidence("idle time in them", total, "ns"),
              Evidence("share of all idle time", share, "fraction"),
              Evidence("share of GPU window", total / tl.window_ns, "fraction"),
              Evidence("median gap", float(np.median(durs)), "ns"),
              Evidence("shortest of these gaps", int(durs.min()), "ns"),
              Evidence("GPU op waiting after the gap", gs[0].after, "text"))
        out.append(Finding(
            "cpu_stall", "high" if share >= 0.5 else "medium",
            f"The GPU waits on the CPU inside {name}: {len(gs)} gap(s), {_t(total)} idle",
            ev,
            f"While the GPU sat idle the host was inside {name} (each gap lasts at least "
            f"{_t(int(durs.min()))}); this CPU work, not GPU execution, is {_p(share)} of the "
            f"idle time.",
            _stall_advice(name)))
    return out


def _stall_advice(name: str) -> str:
    if "cudnn" in name.lower():
        return ("cuDNN builds an execution plan for every new shape; with a growing KV length "
                "each decode step is a new shape. Use a backend without per-shape planning for "
                "decode (torch.backends.cuda.enable_cudnn_sdp(False) to fall back to "
                "FlashAttention / efficient SDPA, or a paged-KV decode kernel), or pad the KV "
                "length to a few bucket sizes so plans are reused.")
    return (f"Profile the CPU side of {name} (py-spy, or torch.profiler with_stack=True) and move "
            f"its work out of the step, cache it, or overlap it with GPU work.")


def rule_memcpy_share(a) -> list[Finding]:
    b, m = a.breakdown, a.trace.memops
    if len(m) == 0 or b.total_time_ns <= 0:
        return []
    share = b.memop_time_ns / b.total_time_ns
    if share < MEMCPY_SHARE:
        return []
    dur = m["end_ns"] - m["start_ns"]
    t = np.bincount(m["kind"].clip(0), weights=dur, minlength=len(MEMOP_KINDS))
    n = np.bincount(m["kind"].clip(0), minlength=len(MEMOP_KINDS))
    ev = [Evidence("memcpy+memset share of GPU op time", share, "fraction"),
          Evidence("memcpy+memset time", b.memop_time_ns, "ns")]
    for k in np.flatnonzero(n):
        ev.append(Evidence(f"{MEMOP_KINDS[k]} ({int(n[k])} ops)", int(t[k]), "ns"))
    return [Finding("memcpy_share", "medium" if share >= 0.1 else "low",
                    f"Memory copies and sets take {_p(share)} of GPU op time", tuple(ev),
                    "Copies occupy the GPU (and host<->device copies often imply a host sync).",
                    capital(_ADVICE["memcpy"]) + ".")]


def rule_communication(a) -> list[Finding]:
    km, mm = category_mask(a, COMM_CATEGORIES)
    if not km.any():
        return []
    tr, b = a.trace, a.breakdown
    k = tr.kernels
    comm = (k["start_ns"][km], k["end_ns"][km])
    s, e = gpu_ops(tr)
    other = np.concatenate([~km, np.ones(len(tr.memops), dtype=bool)])
    comm_busy = intervals.union_length(*comm)
    overlap = intervals.intersection_length(comm, (s[other], e[other]))
    comm_time = int((comm[1] - comm[0]).sum())
    share = comm_time / b.total_time_ns if b.total_time_ns else 0.0
    ov = overlap / comm_busy if comm_busy else None
    ev = (Evidence("communication kernels", int(km.sum()), "count"),
          Evidence("communication time", comm_time, "ns"),
          Evidence("share of GPU op time", share, "fraction"),
          Evidence("overlapped with other GPU work", ov, "fraction"))
    sev = "medium" if share >= 0.1 and (ov is None or ov < 0.5) else "low"
    title = f"Communication is {_p(share)} of GPU op time" + (
        f", {_p(ov)} of it overlapped with compute" if ov is not None else "")
    return [Finding("communication", sev, title, ev,
                    "Collective time that is not overlapped adds directly to the step; overlapped "
                    "time mostly does not (it still competes for SMs and memory bandwidth).",
                    capital(_ADVICE["communication"]) + ".")]


def rule_eager_fusion(a) -> list[Finding]:
    tr = a.trace
    k = tr.kernels
    if len(k) == 0:
        return []
    codes, inverse = np.unique(k["name"], return_inverse=True)
    is_triton = np.array([tr.name(int(c)).startswith("triton_") for c in codes])[inverse]
    n_triton = int(is_triton.sum())
    km, _ = category_mask(a, SMALL_OP_CATEGORIES)
    small_share = float(km.mean())
    dur = k["end_ns"] - k["start_ns"]
    if n_triton:
        return [Finding("eager_fusion", "info",
                        f"Compiled run: {n_triton} Triton (Inductor) kernel launches",
                        (Evidence("Triton kernel launches", n_triton, "count"),
                         Evidence("share of kernel time", float(dur[is_triton].sum() / max(dur.sum(), 1)), "fraction")),
                        "torch.compile has fused part of the graph into generated kernels.",
                        "Compare against the eager run (tracestory compare) to see what fusion bought.")]
    if small_share < 0.3:
        return []
    return [Finding("eager_fusion", "medium" if small_share >= 0.5 else "low",
                    f"Eager run: {_p(small_share)} of kernel launches are small unfused ops",
                    (Evidence("small-op launches", int(km.sum()), "count"),
                     Evidence("share of launches", small_share, "fraction"),
                     Evidence("their share of kernel time", float(dur[km].sum() / max(dur.sum(), 1)), "fraction"),
                     Evidence("Triton kernel launches", 0, "count")),
                    "Each small op is a separate launch and a round-trip through memory; in a "
                    "launch-bound run each one also adds host time.",
                    _FUSE[:1].upper() + _FUSE[1:] + ".")]


# Rules of one analysis; the hardware and memory rules take their optional inputs by keyword.
RULES = (rule_gpu_idle, rule_cpu_stall, rule_dominant_category, rule_first_step, rule_step_outlier,
         rule_step_trend, rule_bound, rule_occupancy, rule_memcpy_share, rule_communication,
         rule_eager_fusion, rule_memory)
_TAKES = {rule_bound: ("kernel_metrics", "peaks", "hardware", "joins", "estimate"),
          rule_occupancy: ("kernel_metrics", "peaks", "hardware"),
          rule_memory: ("memory",), rule_cpu_stall: ("gaps",)}


def derive_findings(analysis, *, kernel_metrics=None, peaks=None, memory=None, hardware=None, joins=None,
                    estimate=None, gaps=None) -> tuple[Finding, ...]:
    """All findings for one analysed trace, most severe first (rule order within a severity).

    ``analysis`` has ``trace``, ``classification``, ``breakdown``, ``timeline`` (or None) and
    ``phases`` (``tracestory.analysis.Analysis``). Optional inputs:

    * ``kernel_metrics``: Nsight Compute results (a ``KernelMetrics``, a list of them, or
      ``Inputs.kernel_metrics`` pairs): the roofline rule uses their counters instead of the
      shape estimate, and the occupancy rules fire;
    * ``peaks``: a ``specs.Peaks`` (``--peaks FILE`` / a manifest's measured peaks); default
      the built-in table for the trace's (or ncu's) device name;
    * ``memory``: a precomputed ``analysis.memory.memory_timeline`` result (else computed);
    * ``hardware`` / ``joins`` / ``estimate`` / ``gaps``: what
      :func:`~tracestory.analysis.results.analyze_inputs` computed once (the ncu inputs with
      their peaks, joins and rooflines; the joins of this trace to them; the trace's shape
      roofline; its gap causes), used instead of computing them again."""
    given = {"kernel_metrics": kernel_metrics, "peaks": peaks, "memory": memory, "hardware": hardware,
             "joins": joins, "estimate": estimate, "gaps": gaps}
    found: list[Finding] = []
    for rule in RULES:
        found.extend(rule(analysis, **{k: given[k] for k in _TAKES.get(rule, ())}))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return tuple(sorted(found, key=lambda f: order[f.severity]))  # stable: rule order kept


def ncu_findings(kernel_metrics, *, peaks=None, hardware=None) -> tuple[Finding, ...]:
    """Findings for Nsight Compute results alone (no timeline trace): roofline and occupancy."""
    found = (rule_bound(None, kernel_metrics, peaks, hardware=hardware)
             + rule_occupancy(None, kernel_metrics, peaks, hardware=hardware))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return tuple(sorted(found, key=lambda f: order[f.severity]))
