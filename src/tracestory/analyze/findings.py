"""Observations rule engine: findings derived from the analysis results.

Each rule reads the results of one trace (breakdown, timeline, phases, plus a few cheap
lookups on the trace itself) and returns zero or more :class:`Finding`: a title, the numbers
that support it (:class:`Evidence`, raw values in base units so the report can format them and
tests can trace every printed number back to a result), the implication, a recommendation and
a severity. Rules never print and never guess: a rule whose inputs are absent returns nothing.

Rules (in report order within a severity; a dominant category is at most "medium" when the GPU
is idle half its window, since kernel time is then not the first lever):

* ``dominant_category``: the category with the most GPU op time, its share p, the Amdahl
  ceiling ``1/(1-p)`` (that category at zero cost) and the what-if ``1/((1-p)+p/k)``. Because
  the breakdown's base is GPU op time, not wall time, the finding also gives the ceiling on the
  GPU window when idle time is kept: ``W / (W - c)`` with W the window and c the category's
  busy time inside it (its union, overlaps counted once) - the honest end-to-end bound.
* ``gpu_idle``: idle share of the GPU window, its split (launch wait vs other), short kernels,
  kernels per ms, launch latency; the verdict is the timeline's ``launch_bound``.
* ``cpu_stall``: idle gaps of at least 1 ms whose cause is one CPU op. The cause of a gap
  ``[g0, g1)`` is the innermost CPU op (same thread as the launch call) that encloses the launch
  call of the GPU op starting at ``g1`` and lasts at least half the gap: the host was inside it
  while the GPU waited. Gaps are grouped by that op's name.
* ``step_outlier``: phases >= 1.5x their family median (phases.outliers), typically warm-up.
* ``step_trend``: per family of >= 3 steps, the least-squares slope of step time vs step and
  its r2; "grows" when r2 >= 0.5 and the fitted change over the run is >= 10% of the mean.
  Also reports how much of the step is GPU busy time.
* ``memcpy_share``: memcpy + memset >= 5% of GPU op time, split by copy kind.
* ``communication``: communication kernels' share and the part of their time overlapped by
  other GPU ops (intersection of unions).
* ``eager_fusion``: no Triton kernels and >= 30% of launches in small-op categories
  (elementwise, norm, reduction, softmax, rope, embedding): a fusion candidate; or, with Triton
  kernels, a note that the run is compiled.
* ``memory``: peak allocated and reserved from ``[memory]`` samples, and a fragmentation /
  caching note when reserved exceeds allocated by >= 1.5x and >= 1 GiB.

Limits: hardware-counter findings (memory- vs compute-bound, occupancy limiter) need Nsight
Compute input and belong to the ncu module; this engine does not invent them from names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..trace import MEMOP_KINDS, Trace
from . import intervals
from .links import gpu_ops_column, launch_index

SEVERITIES = ("high", "medium", "low", "info")
SMALL_OP_CATEGORIES = ("elementwise", "norm", "reduction", "softmax", "rope", "embedding")
COMM_CATEGORIES = ("communication", "allreduce")
STALL_MIN_NS = 1_000_000
MEMCPY_SHARE = 0.05


@dataclass(frozen=True)
class Evidence:
    label: str
    value: float | int | str | None
    unit: str  # "ns", "fraction", "x", "count", "per_ms", "ns_per_step", "bytes", "text", "ratio"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # one of SEVERITIES
    title: str
    evidence: tuple[Evidence, ...]
    implication: str
    recommendation: str


@dataclass(frozen=True)
class GapCause:
    start_ns: int
    dur_ns: int
    launch_wait_ns: int
    after: str               # GPU op that ended the gap
    op_name: str | None      # CPU op the host was inside while the GPU waited
    op_dur_ns: int | None


# ------------------------------------------------------------------ small helpers


def _t(ns: float | None) -> str:
    """Duration for titles (the report formats evidence itself)."""
    if ns is None:
        return "n/a"
    a = abs(ns)
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if a >= scale:
            v = ns / scale
            return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:.0f} {unit}"
    return f"{ns:.0f} ns"


def _p(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


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
          Evidence("launch latency p50 (call start -> GPU start)", tl.launch_latency.p50_ns, "ns"))
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


def rule_cpu_stall(a) -> list[Finding]:
    tl = a.timeline
    if tl is None or tl.idle_ns <= 0:
        return []
    causes = [g for g in gap_causes(a.trace) if g.op_name]
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


def rule_step_outlier(a) -> list[Finding]:
    out = []
    for o in a.phases.outliers:
        out.append(Finding(
            "step_outlier", "medium",
            f"{o.name} took {o.ratio:.1f}x its family median ({_t(o.time_ns)})",
            (Evidence("step time", o.time_ns, "ns"),
             Evidence("family median", o.family_median_ns, "ns"),
             Evidence("ratio", o.ratio, "x")),
            "A one-off slow step (warm-up: JIT compilation, autotuning, allocator growth, cold "
            "caches) skews means and totals computed over the capture.",
            "Warm up before profiling (torch.profiler schedule with wait/warmup steps) and "
            "exclude this step from steady-state numbers."))
    return out


def rule_step_trend(a) -> list[Finding]:
    out = []
    by_family: dict[str, list] = {}
    for ph in a.phases.phases:
        by_family.setdefault(ph.family, []).append(ph)
    for f in a.phases.families:
        steps = by_family.get(f.family, [])
        busy = np.array([p.gpu_busy_ns for p in steps], dtype=np.float64)
        mean_busy = float(busy.mean()) if busy.size else None
        change = abs(f.slope_ns_per_step) * max(f.count - 1, 1)
        grows = f.r2 is not None and f.r2 >= 0.5 and change >= 0.1 * f.mean_ns
        ev = [Evidence("steps", f.count, "count"),
              Evidence("mean step time", f.mean_ns, "ns"),
              Evidence("min step time", f.min_ns, "ns"),
              Evidence("max step time", f.max_ns, "ns"),
              Evidence("slope per step", f.slope_ns_per_step, "ns_per_step"),
              Evidence("r2 of the linear fit", f.r2, "ratio")]
        if mean_busy is not None:
            ev.append(Evidence("mean GPU busy per step", mean_busy, "ns"))
        busy_share = mean_busy / f.mean_ns if mean_busy is not None and f.mean_ns > 0 else None
        if busy_share is not None:
            ev.append(Evidence("GPU busy share of step time", busy_share, "fraction"))
        if grows:
            title = (f"{f.family} step time {'grows' if f.slope_ns_per_step > 0 else 'shrinks'} "
                     f"by {_t(abs(f.slope_ns_per_step))} per step (r2 {f.r2:.2f})")
            imp = ("Step time follows the step number: for decode, work that scales with the KV "
                   "length (attention reads the whole cache).")
            rec = ("Expect per-token latency to keep rising with context; a paged / split-KV "
                   "decode kernel keeps it flatter.")
            sev = "medium"
        else:
            spread = f.max_ns / f.min_ns if f.min_ns > 0 else None
            title = (f"{f.family}: {f.count} steps, {_t(f.min_ns)}-{_t(f.max_ns)} per step, "
                     f"no linear trend" + (f" (r2 {f.r2:.2f})" if f.r2 is not None else ""))
            imp = "Step time does not follow the step number"
            if spread is not None and spread >= 2:
                imp += f"; it varies {spread:.1f}x between the fastest and the slowest step"
            imp += "."
            rec = "Compare the fastest and slowest steps' kernel sequences in the Execution Story."
            sev = "low"
            if spread is not None:
                ev.append(Evidence("slowest / fastest step", spread, "x"))
        if busy_share is not None and busy_share < 0.2:
            imp += (f" The GPU is busy only {_p(busy_share)} of each step: step time is host "
                    f"time, not kernel time.")
            sev = "medium" if sev == "low" else sev
        out.append(Finding("step_trend", sev, title, tuple(ev), imp, rec))
    return out


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
                    _ADVICE["memcpy"][:1].upper() + _ADVICE["memcpy"][1:] + ".")]


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
                    _ADVICE["communication"][:1].upper() + _ADVICE["communication"][1:] + ".")]


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


def rule_memory(a) -> list[Finding]:
    mem = a.trace.memory
    if len(mem) == 0:
        return []
    alloc = mem["allocated_bytes"]
    alloc = alloc[alloc >= 0]
    res = mem["reserved_bytes"]
    res = res[res >= 0]
    if alloc.size == 0:
        return []
    pa = int(alloc.max())
    pr = int(res.max()) if res.size else None
    ev = [Evidence("peak allocated", pa, "bytes")]
    if pr is not None:
        ev.append(Evidence("peak reserved", pr, "bytes"))
    total = next((d.total_memory_bytes for d in a.trace.meta.devices if d.total_memory_bytes), None)
    if total:
        ev.append(Evidence("peak allocated share of device memory", pa / total, "fraction"))
    if pr is not None and pr >= 1.5 * pa and pr - pa >= 1 << 30:
        return [Finding("memory", "low",
                        f"Caching allocator holds {pr / max(pa, 1):.1f}x the peak allocated memory",
                        tuple(ev),
                        "Reserved memory far above allocated is fragmentation or cached blocks "
                        "from earlier, larger tensors: it is unavailable to other processes.",
                        "Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or "
                        "torch.cuda.empty_cache() between phases if another process needs it.")]
    return [Finding("memory", "info", f"Peak allocated GPU memory {_bytes(pa)}", tuple(ev),
                    "Memory is not what limits this run.", "No action needed on memory.")]


def _bytes(n: int) -> str:
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:.3g} {unit}"
        v /= 1024
    return f"{v:.3g} GiB"


RULES: tuple[Callable[[Any], list[Finding]], ...] = (
    rule_gpu_idle, rule_cpu_stall, rule_dominant_category, rule_step_outlier, rule_step_trend,
    rule_memcpy_share, rule_communication, rule_eager_fusion, rule_memory,
)


def derive_findings(analysis) -> tuple[Finding, ...]:
    """All findings for one analysed trace, most severe first (rule order within a severity).

    ``analysis`` has ``trace``, ``classification``, ``breakdown``, ``timeline`` (or None) and
    ``phases`` (``tracestory.analyze.Analysis``)."""
    found: list[Finding] = []
    for rule in RULES:
        found.extend(rule(analysis))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return tuple(sorted(found, key=lambda f: order[f.severity]))  # stable: rule order kept
