"""The rules of one trace: each is ``rule(facts: RunFacts) -> list[Finding]``.

A rule reads only the run's facts (:mod:`tracestory.analysis.facts`: the analysis, the gaps with their
CPU cause, the roofline, the producer, the kind of trace, the workload, what the program already uses,
the exposure, the critical path, a rank's wait in collectives) and returns zero or more
:class:`Finding`: a title, the numbers behind it (:class:`Evidence`, raw values in base units), the
implication, a recommendation and a severity. Which rule may speak about which run is declared in
:mod:`tracestory.analysis.claims` (trace kinds, workloads, platforms, frameworks, modes); inside a
rule, each recommendation clause is chosen by :mod:`tracestory.analysis.advice` from the facts, so
it only names what fits the program. Rules never print and never guess.

* ``trace_kind``: a stream capture, a range-profiler trace, a summary or an empty capture is said
  first, with its evidence, and no timeline verdict follows.
* ``gpu_idle``: idle share of the GPU window and its split. Long gaps (most idle time in gaps of
  1 ms or more) are host work or waits, never "launch-bound"; with graph replays the idle time is
  between replays; a rank whose busy time is mostly waiting in collectives is paced by its peers.
* ``cpu_stall``: idle gaps of at least 1 ms grouped by the CPU op the launching thread ran during
  them (:mod:`tracestory.analysis.gaps`); it explains ``gpu_idle`` and goes first when as severe.
* ``dominant_category``: the category with the most GPU op time, with ONE ceiling: the GPU window
  if the category's exposed time (no other category running) were gone, ``W / (W - x)``; without a
  timeline, 1/(1-p) on summed time, named as such. Communication mostly spent waiting for a late
  peer, or from one rank of a job whose other ranks are not given, is told as such.
  Outside the taxonomy (a program without PyTorch, > 20% ``other``) the top kernels by name.
* ``first_step``, ``step_outlier``, ``step_trend``: :mod:`.steps` (KV-length advice only for LLM decode).
* ``bound`` (memory- vs compute-bound kernels, ncu counters or the shape estimate; a verdict on
  under half the kernel time says so), ``occupancy_limiter``, ``occupancy_achieved``: :mod:`.hardware`.
* ``small_grids``: kernel time in launches of fewer blocks than a tenth of the SMs (CUs).
* ``memcpy_share``, ``communication``, ``eager_fusion``: copies, collectives (overlap, exposure,
  waiting) and small-op launches, each folded into ``dominant_category`` when that category is on top.
* ``graph_replay``, ``critical_path``, ``memory`` (:mod:`.memory`).

The multi-GPU rules take the combined multi-GPU result: :mod:`.multigpu`. The records
(:class:`Finding`, :class:`Evidence`) live in :mod:`.base` and are re-exported here.
"""

from __future__ import annotations

import numpy as np

from ...trace import MEMOP_KINDS, Trace, factorize
from ...units import fmt_ns, fmt_pct, kernel_base, plural
from .. import advice, intervals
from ..facts import LONG_GAP_SHARE, RunFacts
from ..gaps import GapCause, gap_causes
from ..links import gpu_ops_column
from ..stream_overlap import kernel_serial_starts
from .base import SEVERITIES, Evidence, Finding, capital
from .hardware import ncu_only_findings, rule_bound, rule_occupancy
from .layout import rule_layout_conversion
from .memory import rule_memory
from .steps import rule_first_step, rule_step_outlier, rule_step_trend

__all__ = ["SEVERITIES", "Evidence", "Finding", "GapCause", "gap_causes", "category_mask", "ncu_findings",
           "rule_bound", "rule_occupancy", "rule_memory", "rule_first_step", "rule_step_outlier", "rule_step_trend",
           "rule_layout_conversion"]

SMALL_OP_CATEGORIES = ("elementwise", "norm", "reduction", "softmax", "rope", "embedding")
COMM_CATEGORIES = ("communication", "allreduce")
FEW_GPU_OPS = 50  # below this, an idle GPU is not a launch-overhead story
HOST_GAP_NS = 100_000  # a mean idle gap this long is host work, not per-launch cost (outside PyTorch)
MEMCPY_SHARE = 0.05
SMALL_COMM_COST = 0.05  # exposed communication below this share of GPU busy time is not a lever


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


# ------------------------------------------------------------------ rules

def _taxonomy_fits(f: RunFacts) -> bool:
    """The category story fits: a program that is not known to be outside PyTorch (the taxonomy
    is for ML work) whose kernels the taxonomy names (under 20% in ``other``)."""
    a = f.analysis
    other = next((c for c in a.breakdown.categories if c.name == "other"), None)
    other_share = other.time_ns / a.breakdown.total_time_ns if other and a.breakdown.total_time_ns else 0.0
    return f.producer.framework != "none" and other_share < 0.2


def _top_kernels_finding(f: RunFacts) -> list[Finding]:
    """The headline when the taxonomy does not fit: the top kernels by name (a template's
    instantiations together, as a profiler's summary by base name shows them), with their shares."""
    tr, b = f.trace, f.analysis.breakdown
    k = tr.kernels
    if len(k) == 0 or b.total_time_ns <= 0:
        return []
    dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    codes, inverse = factorize(k["name"])
    base_of = [kernel_base(tr.name(int(c))) if c >= 0 else "" for c in codes]
    bases, base_idx = np.unique(np.array(base_of, dtype=object), return_inverse=True)
    per_base_t = np.bincount(base_idx[inverse], weights=dur, minlength=bases.size)
    per_base_n = np.bincount(base_idx[inverse], minlength=bases.size)
    per_base_kinds = np.bincount(base_idx, minlength=bases.size)
    order = np.argsort(-per_base_t, kind="stable")[:3]
    top = int(order[0])
    p = float(per_base_t[top]) / b.total_time_ns
    ev = [Evidence(f"{bases[i]} ({plural(int(per_base_n[i]), 'call')}, {plural(int(per_base_kinds[i]), 'instantiation')})",
                   float(per_base_t[i]) / b.total_time_ns, "fraction") for i in order]
    ev += [Evidence("top kernel time", int(per_base_t[top]), "ns"), Evidence("top kernel calls", int(per_base_n[top]), "count")]
    title = (f"The top kernel is {bases[top]}: {_p(p)} of GPU op time ({_t(int(per_base_t[top]))} across "
             f"{plural(int(per_base_n[top]), 'call')}")
    title += f", {int(per_base_kinds[top])} instantiations)" if per_base_kinds[top] > 1 else ")"
    sev = "high" if p >= 0.5 else "medium" if p >= 0.25 else "low"
    return [Finding("dominant_kernel", sev, title, tuple(ev),
                    "This program's kernels are outside the LLM categories, so the story names them: the top "
                    "kernel is where GPU time goes.",
                    f"Profile {bases[top]} with {advice.kernel_profiler(f, bases[top])} to see whether memory "
                    "bandwidth, compute or occupancy bounds it.")]


def _category_advice(f: RunFacts, name: str) -> str:
    if name == "gemm":
        return advice.gemm(f)
    if name == "attention":
        return advice.attention(f)
    if name in COMM_CATEGORIES:
        return advice.communication(f)
    if name in ("memcpy", "memset"):
        return advice.copies(f, "memset" if name == "memset" else None)
    if name in SMALL_OP_CATEGORIES:
        return advice.fusion(f)
    if name == "other":
        return ("look at the top kernels of 'other' and add a rule for them (--rules FILE) so the breakdown says "
                "what they are")
    return f"profile the top {name} kernels with {advice.kernel_profiler(f)} to see what bounds them"


def _top_category(f: RunFacts) -> str | None:
    """The category the dominant-category finding tells (None when it tells the top kernels instead)."""
    b = f.analysis.breakdown
    if not b.categories or b.total_time_ns <= 0 or not _taxonomy_fits(f):
        return None
    return max(b.categories, key=lambda c: c.time_ns).name


def rule_dominant_category(f: RunFacts) -> list[Finding]:
    """The category with the most GPU op time, with ONE ceiling: the GPU window (or, without a
    timeline, the summed GPU op time) if the category cost nothing, counting only its exposed time
    (the time no other category runs), so overlap is never counted as saving."""
    a, exposure = f.analysis, f.exposure
    b = a.breakdown
    if not b.categories or b.total_time_ns <= 0:
        return []
    if not _taxonomy_fits(f):
        return _top_kernels_finding(f)
    top = max(b.categories, key=lambda c: c.time_ns)
    p = top.time_ns / b.total_time_ns
    k = b.speedup_factor
    ev = [Evidence("share of GPU op time", p, "fraction"),
          Evidence("time", top.time_ns, "ns"),
          Evidence("ops", top.count, "count")]
    if top.top_kernels:
        ev.append(Evidence("top kernel", top.top_kernels[0].name, "text"))
    if top.name in COMM_CATEGORIES and exposure is not None and exposure.comm_busy_ns:
        ev.append(Evidence("overlapped with compute", exposure.comm_overlap_fraction, "fraction"))
    implication = f"{top.name} is {_p(p)} of GPU op time: it is where a kernel-level optimisation pays most."
    sev = "high" if p >= 0.5 else "medium" if p >= 0.25 else "low"
    tl = a.timeline
    exp = exposure.get(top.name) if exposure is not None else None
    if tl is not None and tl.window_ns > 0 and exp is not None:
        w, x = tl.window_ns, min(exp.exposed_ns, tl.window_ns - 1)
        ceiling, whatif = w / (w - x), w / (w - x + x / k)
        ev += [Evidence("exposed time (no other category running)", exp.exposed_ns, "ns"),
               Evidence("ceiling on the GPU window if it cost nothing (exposed time only)", ceiling, "x"),
               Evidence(f"GPU window if it ran {k:g}x faster (exposed time only)", whatif, "x")]
        of = exp.overlapped_fraction
        if of is not None and of >= 0.5:
            implication = (f"{top.name} is {_p(p)} of summed GPU op time, but {_p(of)} of it runs under other GPU "
                           f"work: removing it entirely would shorten the GPU window at most {ceiling:.2f}x.")
            sev = "medium" if x / w >= 0.25 else "low"
        elif tl.idle_fraction >= 0.2:
            implication += (f" But the GPU is idle {_p(tl.idle_fraction)} of its window, so removing {top.name} "
                            f"entirely would shorten the window only {ceiling:.2f}x: idle time is the bigger lever.")
        else:
            implication += f" Removing it entirely would shorten the GPU window at most {ceiling:.2f}x."
    else:
        ev += [Evidence("ceiling on summed GPU op time if it cost nothing (no timeline: overlap unknown)",
                        top.amdahl_max_speedup, "x"),
               Evidence(f"summed GPU op time if it ran {k:g}x faster", top.whatif_speedup, "x")]
    if sev == "high" and tl is not None and tl.idle_fraction >= 0.5:
        sev = "medium"  # the GPU is mostly idle: kernel time is not the first lever
    waiting = _collectives_not_work(f, top.name, top.time_ns, p, "medium" if sev == "high" else sev, ev)
    if waiting is not None:
        return [waiting]
    rec = _category_advice(f, top.name)
    return [Finding("dominant_category", sev, f"{top.name} dominates GPU op time ({_p(p)})",
                    tuple(ev), implication, capital(rec) + ".")]


PEER_WAIT_SHARE = 0.5   # above this share of collective time spent waiting, the collectives are not the work


def _collectives_not_work(f: RunFacts, name: str, time_ns: int, p: float, sev: str,
                          ev: list[Evidence]) -> Finding | None:
    """The dominant-category finding when the category is communication whose time is mostly a wait
    for late peers (measured across the ranks given), or may be (ranks of the job are missing); else None."""
    wait = _peer_wait(f, name, time_ns)
    if wait is not None:
        ev.append(Evidence("of it, waiting inside collectives for the last rank to arrive", f.comm_wait_ns, "ns"))
        title = f"{name} kernels hold {_p(p)} of GPU op time, {_p(wait)} of that waiting for late peers"
        imp = (f"Most of this rank's {name} time is spent waiting inside collectives for a rank that arrives later "
               f"(Multi-GPU: the straggler); the transfer itself is {_t(time_ns - (f.comm_wait_ns or 0))}. "
               "Shrinking the collectives here would not help: the late rank sets the pace.")
        rec = ("Fix the late rank first (Multi-GPU findings: its extra work or late host), then overlap what remains "
               "of the collectives with compute.")
    elif name in COMM_CATEGORIES and f.some_ranks_missing:
        declared = f.ranks[1]
        title = f"{name} kernels hold {_p(p)} of GPU op time, waiting for other ranks included"
        imp = (f"A collective kernel runs from this rank's arrival until the last rank's, so part of this time may be "
               f"waiting, not transfer; with {f.ranks[0]} of the job's {declared} ranks in the inputs, the wait on "
               "the others cannot be told apart.")
        rec = (f"Pass every rank's trace (all {declared}) to split waiting from transfer before shrinking the "
               "collectives; a late rank, not this one's collectives, may set the pace.")
    else:
        return None
    return Finding("dominant_category", sev, title, tuple(ev), imp, rec)


def _peer_wait(f: RunFacts, category: str, time_ns: int) -> float | None:
    """Share of ``category``'s time that this rank waited in collectives for a late peer, when it is
    communication and the wait is most of it (several ranks only); else None."""
    if category not in COMM_CATEGORIES or not f.comm_wait_ns or time_ns <= 0:
        return None
    share = min(f.comm_wait_ns / time_ns, 1.0)
    return share if share >= PEER_WAIT_SHARE else None


def rule_gpu_idle(f: RunFacts) -> list[Finding]:
    a, producer, critical_path = f.analysis, f.producer, f.critical_path
    tl = a.timeline
    if tl is None or tl.window_ns <= 0 or tl.verdict_withheld:
        return []   # no idle verdict on kernel times the trace does not hold (the Limitations say why)
    wait_share = tl.idle_launch_wait_ns / tl.idle_ns if tl.idle_ns > 0 else None
    replayed = producer.replays_graphs
    ev = [Evidence("GPU window", tl.window_ns, "ns"),
          Evidence("GPU busy (union)", tl.busy_ns, "ns"),
          Evidence("idle share of window", tl.idle_fraction, "fraction"),
          Evidence("idle waiting for launches", tl.idle_launch_wait_ns, "ns"),
          Evidence("idle for other reasons (sync, dependencies)", tl.idle_other_ns, "ns"),
          Evidence("launch-wait share of idle", wait_share, "fraction"),
          Evidence("kernels shorter than 10 us", tl.short_kernel_share, "fraction"),
          Evidence("kernels per ms of window", tl.kernels_per_ms, "per_ms"),
          # the host's cost per launch; the queue time (GPU start - call end) is in the Appendix
          Evidence("launch call CPU time p50 (GPU ops launched directly: call end - call start)",
                   tl.launch_api.p50_ns, "ns"),
          Evidence("idle gaps", tl.gap_count, "count"),
          Evidence("mean gap", tl.idle_ns / tl.gap_count if tl.gap_count else None, "ns"),
          Evidence("largest gap", tl.largest_gaps[0].dur_ns if tl.largest_gaps else None, "ns")]
    if replayed:
        g = producer.graphs
        ev.append(Evidence("kernel time replayed from graphs", g.graph_time_fraction, "fraction"))
        if tl.idle_fraction < 0.2:
            return [Finding("gpu_idle", "info", f"GPU kept busy: idle {_p(tl.idle_fraction)} of its window",
                            tuple(ev), "The run replays CUDA graphs and the GPU stays busy: kernel time is what "
                            "to optimise.", "Work on the dominant category's kernels.")]
        bound = critical_path.dominant if critical_path is not None else None
        why = {"host": "host work between replays (scheduling, sampling, input preparation)",
               "sync": "host synchronisation between replays",
               "wait": "waits on work the trace does not show (events, other streams or processes)",
               "launch": "the launch of the replays themselves"}.get(bound, "work between replays")
        return [Finding(
            "gpu_idle", "high" if tl.idle_fraction >= 0.5 else "medium",
            f"GPU idle {_p(tl.idle_fraction)} of its window in a graph-replayed run", tuple(ev),
            f"{_p(g.graph_time_fraction)} of kernel time is replayed from {g.graph_launches} graph "
            f"launch{'es' if g.graph_launches != 1 else ''}, so the per-kernel launch cost is already gone; "
            f"the idle time is {why}" + (f" (the critical path is mostly {bound})" if bound else "") + ".",
            _between_replays_advice(bound))]
    n_gpu_ops = len(a.trace.kernels) + len(a.trace.memops)
    mean_gap = tl.idle_ns / tl.gap_count if tl.gap_count else 0.0
    host_work = not producer.is_pytorch and mean_gap > HOST_GAP_NS
    if tl.idle_fraction >= 0.2 and (n_gpu_ops < FEW_GPU_OPS or host_work):
        # A handful of GPU ops, or a program without PyTorch whose gaps are far longer than a
        # launch: per-launch cost cannot be what keeps the GPU idle.
        why = (f"only {n_gpu_ops} GPU ops ran" if n_gpu_ops < FEW_GPU_OPS
               else f"gaps of {_t(mean_gap)} on average, far longer than a launch")
        return [Finding(
            "gpu_idle", "medium", f"GPU idle {_p(tl.idle_fraction)} of its window: {why}",
            tuple(ev), "The program spends its time outside GPU work (host computation, I/O, waits); "
            "launch overhead is not what keeps the GPU idle.",
            f"Profile the CPU side between the GPU ops ({advice.cpu_profiler(f)}) and move work to the GPU or "
            "overlap it with GPU work.")]
    long_gaps = _long_gaps_finding(f, ev)
    if long_gaps:
        return long_gaps
    if tl.launch_bound:
        sev = "high" if tl.idle_fraction >= 0.5 else "medium"
        title = f"Launch-bound: the GPU is idle {_p(tl.idle_fraction)} of its window"
        imp = ("The host, not the GPU, sets the pace: "
               + (f"{_p(wait_share)} of the idle time is spent before the next GPU op was even "
                  f"launched. " if wait_share is not None else "")
               + "Faster kernels would not shorten this run; less host work per GPU op would.")
        if producer.engine == "vLLM":
            rec = ("This step ran without graph replays: vLLM replays CUDA graphs only when --enforce-eager is off "
                   "and the batch fits its CUDA-graph capture sizes; check both, and look at what the CPU does "
                   "inside the largest gaps (Appendix: largest gaps).")
        elif producer.engine == "SGLang":
            rec = ("This step ran without graph replays: SGLang replays CUDA graphs unless --disable-cuda-graph is "
                   "set and only up to --cuda-graph-max-bs; check both, and look at what the CPU does inside the "
                   "largest gaps (Appendix: largest gaps).")
        else:
            graphs = advice.graph_capture(f)
            fuse = "fuse small ops, " if producer.is_pytorch else "launch fewer, larger kernels, "
            rec = ("Cut host work per GPU op: " + (graphs + ", " if graphs else "") + fuse
                   + "remove host synchronisation from the loop, and look at what the CPU does inside the largest "
                   "gaps (Appendix: largest gaps).")
    elif tl.idle_fraction >= 0.2:
        sev = "medium"
        title = f"GPU idle {_p(tl.idle_fraction)} of its window, mostly not launch wait"
        imp = ("Ops were submitted but waited: synchronisation, cross-stream dependencies or "
               "copies gate the GPU.")
        rec = ("Look for host syncs (.item(), .cpu(), cudaStreamSynchronize) and event waits in the largest gaps."
               if producer.is_pytorch else
               "Look for host synchronisation (cudaDeviceSynchronize, blocking copies) and event waits in the "
               "largest gaps.")
    elif f.comm_wait_ns and tl.busy_ns and f.comm_wait_ns >= 0.25 * tl.busy_ns:
        sev = "medium"
        share = f.comm_wait_ns / tl.busy_ns
        title = (f"GPU busy {_p(1 - tl.idle_fraction)} of its window, {_p(share)} of that busy time in collectives "
                 "waiting for late peers")
        imp = ("This rank is paced by its peers: its collective kernels run while they wait for the last rank to "
               "arrive, so its own kernels are not what bounds the step.")
        rec = "Fix the late rank first (Multi-GPU findings); then work on this rank's dominant category."
    else:
        sev = "info"
        title = f"GPU kept busy: idle {_p(tl.idle_fraction)} of its window"
        imp = "The run is GPU-bound: kernel time is what to optimise."
        rec = "Work on the kernels that take the most GPU time (the dominant-category or top-kernel finding)."
    return [Finding("gpu_idle", sev, title, tuple(ev), imp, rec)]


def _long_gaps_finding(f: RunFacts, ev: list) -> list[Finding]:
    """The idle verdict when most idle time sits in a few gaps of 1 ms or more: per-launch overhead
    cannot make gaps that long, so the launch-bound story and CUDA-graph advice do not apply."""
    tl = f.analysis.timeline
    share = f.long_gap_share
    if tl is None or tl.idle_fraction < 0.2 or share is None or share < LONG_GAP_SHARE:
        return []
    long_ns = sum(g.dur_ns for g in f.gaps)
    ev = ev + [Evidence("idle gaps of 1 ms or more (longest 50)", len(f.gaps), "count"),
               Evidence("idle time in them", long_ns, "ns"),
               Evidence("their share of idle time", share, "fraction")]
    named = {}
    for g in f.gaps:
        if g.op_name:
            named[g.op_name] = named.get(g.op_name, 0) + g.dur_ns
    cp = f.critical_path
    if cp is not None and cp.dominant == "wait":
        rec = ("The GPU waited on work this trace does not show (events on other streams or processes, or work queued "
               "before the capture): capture all processes and streams around the gaps to find it.")
    elif f.producer.mode == "training":
        rec = ("Find what the host does in the largest gaps (Appendix: largest gaps): feed data off the critical path "
               "(loader workers, prefetch, pinned memory), keep one-off setup out of the measured steps (warm up "
               "first), or remove the synchronisation.")
    else:
        rec = ("Find what the host does in the largest gaps (Appendix: largest gaps): per-step host work (scheduling, "
               "input preparation, sampling), one-off setup kept out of the measured steps (warm up first), or a "
               "synchronisation.")
    where = ""
    if named:
        op, ns = max(named.items(), key=lambda kv: kv[1])
        where = f" The host was inside {op} for {_t(ns)} of it."
        if ns >= LONG_GAP_SHARE * long_ns:
            rec = (f"Shorten what the host does inside {op} between GPU ops (the finding on {op} says how); the GPU "
                   "has nothing to run meanwhile.")
    return [Finding(
        "gpu_idle", "high" if tl.idle_fraction >= 0.5 else "medium",
        f"GPU idle {_p(tl.idle_fraction)} of its window, {_p(share)} of that in {plural(len(f.gaps), 'gap')} of 1 ms or more",
        tuple(ev),
        "Gaps this long are host work or waits (data loading, one-off setup such as library autotuning or module "
        "loading, synchronisation), not per-launch overhead: faster launches or graph capture would not remove "
        "them." + where, rec)]


def _between_replays_advice(bound: str | None) -> str:
    if bound == "wait":
        return ("Find what the GPU waited for: the largest gap (Appendix) ends with an op that was submitted long "
                "before it ran; look for event waits (cudaStreamWaitEvent / hipStreamWaitEvent) on work outside "
                "this trace (another stream, process or the previous step) and for blocking copies that wait "
                "behind them.")
    if bound == "sync":
        return ("Remove the host synchronisation between replays (a blocking copy or .item() per step): keep "
                "results on the GPU or copy them asynchronously and read them one step later.")
    return ("Shorten what runs between replays: overlap the host's per-step work with the running replay "
            "(prepare step N+1 while N runs), move remaining eager ops into the graph, and look at what the "
            "host does inside the largest gaps (Appendix: largest gaps).")


def rule_graph_replay(f: RunFacts) -> list[Finding]:
    """How much of the run is replayed from CUDA/HIP graphs (kernel origin by launch call)."""
    producer = f.producer
    if producer.graphs.graph_kernels == 0:
        return []
    g = producer.graphs
    return [Finding(
        "graph_replay", "info",
        f"Graph replays: {_p(g.graph_time_fraction)} of kernel time is replayed from {g.graph_launches} graph "
        f"launch{'es' if g.graph_launches != 1 else ''} ({g.graph_kernels} of {g.kernel_count} kernels)",
        (Evidence("graph launches", g.graph_launches, "count"),
         Evidence("kernels replayed from graphs", g.graph_kernels, "count"),
         Evidence("kernels launched directly", g.direct_kernels, "count"),
         Evidence("kernels with no launch call in the trace", g.unlinked_kernels, "count"),
         Evidence("most kernels in one replay", g.max_kernels_per_graph_launch, "count"),
         Evidence("share of kernel time from graphs", g.graph_time_fraction, "fraction")),
        "Replayed kernels pay no per-kernel launch cost; launch latency and the launch-bound verdict are "
        "read from the directly launched kernels only, and a gap inside a replay is a device-side "
        "dependency, not launch overhead.",
        "Nothing to add for the replayed part; look at the directly launched kernels and the host work "
        "between replays.")]


_BOUND_TEXT = {
    "gpu": ("GPU execution", "kernel time is what shortens this run"),
    "communication": ("communication kernels", "overlap or shrink the collectives on the path"),
    "launch": ("waiting for the host to submit work", "the GPU has nothing queued until the host launches the next op"),
    "host": ("host work between API calls", "the CPU (framework, Python, scheduling) sets the pace"),
    "sync": ("host synchronisation", "the host blocks on the GPU and then has to catch up"),
    "wait": ("waits on work the trace does not show", "a submitted op waited for an event, another "
             "stream or process, or work queued before the capture"),
}


def rule_critical_path(f: RunFacts) -> list[Finding]:
    cp, critical_scope = f.critical_path, f.critical_scope
    if cp is None or cp.span_ns <= 0 or cp.dominant is None:
        return []
    what, why = _BOUND_TEXT[cp.dominant]
    share = cp.share(cp.dominant)
    ev = tuple(Evidence(f"{label} on the critical path", ns, "ns") for label, ns in cp.by_label if ns) + (
        Evidence(f"{cp.dominant} share of the critical path", share, "fraction"),
        Evidence("critical path span", cp.span_ns, "ns"),
        Evidence("GPU ops on the path", cp.gpu_ops_on_path, "count"),
        Evidence("CPU calls on the path", cp.cpu_calls_on_path, "count"))
    return [Finding(
        "critical_path", "info",
        f"{_p(share)} of the critical path over {critical_scope or 'the trace'} is {what}", ev,
        f"Walking back from the last GPU op along stream order, launch links and host calls, "
        f"{_p(share)} of {_t(cp.span_ns)} is {what}: {why}.",
        "Shorten the dominant part first: time that is not on the critical path (work overlapped with "
        "it) does not shorten the run.")]


def rule_cpu_stall(f: RunFacts) -> list[Finding]:
    tl = f.analysis.timeline
    if tl is None or tl.idle_ns <= 0:
        return []
    causes = [g for g in f.gaps if g.op_name]
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
            f"The GPU waits on the CPU inside {name}: {plural(len(gs), 'gap')}, {_t(total)} idle",
            ev,
            f"While the GPU sat idle the host was inside {name} (each gap lasts at least "
            f"{_t(int(durs.min()))}); this CPU work, not GPU execution, is {_p(share)} of the "
            f"idle time.",
            _stall_advice(f, name)))
    return out


def _stall_advice(f: RunFacts, name: str) -> str:
    low = name.lower()
    if "cudnn" in low and f.workload.decodes and ("sdpa" in low or "attention" in low or "mha" in low):
        return ("cuDNN builds an execution plan for every new shape; with a growing KV length each decode step is a "
                "new shape. Use a backend without per-shape planning for decode (torch.backends.cuda."
                "enable_cudnn_sdp(False) to fall back to FlashAttention / efficient SDPA, or a paged-KV decode "
                "kernel), or pad the KV length to a few bucket sizes so plans are reused.")
    if "cudnn" in low or "miopen" in low:
        return ("The library chooses an algorithm (benchmarking candidates with cudnn.benchmark) and loads its kernels "
                "the first time it sees a shape: warm up with the shapes you will measure and leave those first calls "
                "out of the measured steps; if every step brings a new shape, keep the shapes fixed (pad or bucket "
                "them) so the choice is made once.")
    return (f"Profile the CPU side of {name} ({advice.cpu_profiler(f)}) and move its work out of the step, cache it, "
            "or overlap it with GPU work.")


def rule_memcpy_share(f: RunFacts) -> list[Finding]:
    b, m = f.analysis.breakdown, f.trace.memops
    if len(m) == 0 or b.total_time_ns <= 0 or _top_category(f) in ("memcpy", "memset"):
        return []   # none, or the dominant-category finding tells the copies already
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
                    capital(advice.copies(f, MEMOP_KINDS[int(np.argmax(t))] if t.sum() > 0 else None)) + ".")]


def rule_communication(f: RunFacts) -> list[Finding]:
    a, exposure = f.analysis, f.exposure
    km, mm = category_mask(a, COMM_CATEGORIES)
    if not km.any() or _top_category(f) in COMM_CATEGORIES:
        return []   # none, or the dominant-category finding tells it already (one finding per fact)
    tr, b = a.trace, a.breakdown
    k = tr.kernels
    comm_time = int((k["end_ns"][km] - k["start_ns"][km]).sum())
    share = comm_time / b.total_time_ns if b.total_time_ns else 0.0
    if exposure is not None and exposure.comm_busy_ns:
        ov = exposure.comm_overlap_fraction
        cx = exposure.get(exposure.comm_category)
    else:
        comm = (k["start_ns"][km], k["end_ns"][km])
        s_, e_ = gpu_ops(tr)
        other = np.concatenate([~km, np.ones(len(tr.memops), dtype=bool)])
        comm_busy = intervals.union_length(*comm)
        ov = intervals.intersection_length(comm, (s_[other], e_[other])) / comm_busy if comm_busy else None
        cx = None
    ev = [Evidence("communication kernels", int(km.sum()), "count"),
          Evidence("communication time", comm_time, "ns"),
          Evidence("share of GPU op time", share, "fraction"),
          Evidence("overlapped with compute", ov, "fraction")]
    exposed_share = None
    if cx is not None and exposure.busy_ns:
        exposed_share = cx.exposed_ns / exposure.busy_ns
        ev.append(Evidence("exposed communication (nothing else running)", cx.exposed_ns, "ns"))
        ev.append(Evidence("exposed share of GPU busy time", exposed_share, "fraction"))
        ev.append(Evidence("ceiling on GPU busy time without it", cx.exposed_ceiling, "x"))
    if f.some_ranks_missing:
        given, declared = f.ranks
        ev.append(Evidence("ranks of the job in the inputs", f"{given} of {declared}", "text"))
    cost = exposed_share if exposed_share is not None else share * (1 - (ov or 0.0))
    sev = "medium" if cost >= 0.1 else "low"
    title = f"Communication is {_p(share)} of GPU op time" + (
        f", {_p(ov)} of it overlapped with compute" if ov is not None else "")
    imp = ("Collective time that is not overlapped adds directly to the step; overlapped "
           "time mostly does not (it still competes for SMs and memory bandwidth).")
    if cx is not None and cx.exposed_ceiling is not None:
        imp += f" Removing it entirely would shorten GPU busy time at most {cx.exposed_ceiling:.2f}x."
    if f.some_ranks_missing:
        imp += (f" With {f.ranks[0]} of the job's {f.ranks[1]} ranks in the inputs, part of this time may be waiting "
                "for the others, which one rank's trace cannot tell apart.")
    wait = _peer_wait(f, "communication", comm_time)
    if wait is not None:
        ev.append(Evidence("waiting inside collectives for the last rank to arrive", f.comm_wait_ns, "ns"))
        title += f"; {_p(wait)} of it is waiting for late peers"
        imp += (" Most of it here is waiting for a rank that arrives later: the late rank, not this one's "
                "transfers, sets the pace.")
        return [Finding("communication", sev, title, tuple(ev), imp,
                        "Fix the late rank first (Multi-GPU findings), then overlap the remaining collective time "
                        "with compute.")]
    if cost < SMALL_COMM_COST:
        return [Finding("communication", "info", title, tuple(ev), imp,
                        "Communication costs little here: it is not what to work on first.")]
    return [Finding("communication", sev, title, tuple(ev), imp, capital(advice.communication(f)) + ".")]


def rule_eager_fusion(f: RunFacts) -> list[Finding]:
    a, producer = f.analysis, f.producer
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
    if (small_share < 0.3 or producer.replays_graphs or _top_category(f) in SMALL_OP_CATEGORIES
            or len(k) < FEW_GPU_OPS):
        # not eager-launch heavy, a graph replay (no launch each), the dominant-category finding
        # already gives the same fusion advice for the small-op category on top, or too few launches
        # for their count to be what costs time
        return []  # a graph replay is not an eager run: its small kernels pay no launch each
    return [Finding("eager_fusion", "medium" if small_share >= 0.5 else "low",
                    f"Eager run: {_p(small_share)} of kernel launches are small unfused ops",
                    (Evidence("small-op launches", int(km.sum()), "count"),
                     Evidence("share of launches", small_share, "fraction"),
                     Evidence("their share of kernel time", float(dur[km].sum() / max(dur.sum(), 1)), "fraction"),
                     Evidence("Triton kernel launches", 0, "count")),
                    "Each small op is a separate launch and a round-trip through memory"
                    + ("; in this launch-bound run each one also adds host time." if f.launch_bound else "."),
                    capital(advice.fusion(f)) + ".")]


def ncu_findings(hardware) -> tuple[Finding, ...]:
    """Findings of Nsight Compute results alone (no timeline trace): roofline and occupancy."""
    found = ncu_only_findings(hardware)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return tuple(sorted(found, key=lambda f: order[f.severity]))


SMALL_GRID_PER_SM = 0.1    # fewer blocks than a tenth of the SMs: most of the GPU sits idle during the kernel
SMALL_GRID_SHARE = 0.3     # of kernel time, before it is a finding


def rule_small_grids(f: RunFacts) -> list[Finding]:
    """Kernel time spent in launches whose grid holds fewer blocks than a tenth of the SMs (CUs): the
    rest of the GPU idles for the whole kernel, whatever its code. Needs grid sizes and the SM count.
    A kernel's time counts from the end of the kernel ahead of it on its stream where it started
    earlier (programmatic dependent launch: until then it waits, and the kernel ahead runs)."""
    tr = f.trace
    k = tr.kernels
    sms = next((d.sm_count for d in tr.meta.devices if d.sm_count), None)
    if not len(k) or not sms or not (k["grid_x"] >= 0).any():
        return []
    known = k["grid_x"] >= 0
    blocks = (k["grid_x"].astype(np.int64) * np.maximum(k["grid_y"], 1) * np.maximum(k["grid_z"], 1))
    end = k["end_ns"].astype(np.int64)
    # real start times: the order on a stream means something
    dur = end - (kernel_serial_starts(tr) if tr.meta.has_timeline else k["start_ns"].astype(np.int64))
    small = known & (blocks < SMALL_GRID_PER_SM * sms)
    total = int(dur[known].sum())
    if not total or dur[small].sum() < SMALL_GRID_SHARE * total:
        return []
    share = float(dur[small].sum()) / total
    unit = "CUs" if f.platform == "ROCm" else "SMs"
    rows = np.flatnonzero(small)
    top = rows[np.argmax(dur[rows])]
    codes, per = np.unique(k["name"][rows], return_counts=True)
    t_by = {int(c): int(dur[rows][k["name"][rows] == c].sum()) for c in codes}
    worst = max(t_by, key=t_by.get)
    ev = (Evidence(f"kernel time in launches with fewer than {SMALL_GRID_PER_SM:g} blocks per {unit[:-1]}", share,
                   "fraction"),
          Evidence("such launches", int(small.sum()), "count"),
          Evidence(f"{unit} on the GPU", sms, "count"),
          Evidence("kernel with the most such time", tr.name(worst), "text"),
          Evidence("its grid (blocks) in its longest launch", int(blocks[top]), "count"))
    return [Finding(
        "small_grids", "medium" if share >= 0.5 else "low",
        f"{_p(share)} of kernel time runs in launches of fewer than {int(SMALL_GRID_PER_SM * sms) or 1} blocks on "
        f"a GPU of {sms} {unit}", ev,
        f"Those launches leave most {unit} idle for their whole duration: their time is latency, not throughput, "
        "and a faster kernel body or a lower precision would barely change it.",
        "Give each launch more parallel work: larger batches or inputs per launch, split long one-block loops "
        "across blocks (grid-stride loops, split-K for skinny GEMMs), or fuse small launches into one.")]


_KIND_STORY = {
    "stream_capture": ("The trace records a stream capture, not its execution",
                       "The launches inside the capture were recorded into a graph and ran nothing here; the few "
                       "kernels that ran are not the workload, so no busy, idle or category verdict is drawn from "
                       "them.",
                       "Profile an iteration that replays the graph (after the capture) to see the execution."),
    "range_profiler": ("The trace holds per-kernel profiler ranges, not a timeline",
                       "Each kernel was replayed alone to read its counters: durations are profiling passes and the "
                       "gaps between them are the profiler's, so no idle, launch or critical-path verdict is drawn.",
                       "For the timeline, profile again without the range profiler (torch.profiler with "
                       "ProfilerActivity.CUDA and no profiler metrics); keep this trace for the per-kernel counters."),
    "summary_only": ("The input holds totals per kernel name, not a timeline",
                     "Without start times per launch there is no idle time, overlap or order to tell; the category "
                     "shares and ceilings are over summed kernel time.",
                     "For the timeline, export the per-launch table (nsys stats -r cuda_gpu_trace --format csv) or "
                     "pass the .sqlite export."),
    "empty": ("The trace holds no GPU work to tell",
              "The capture window ran no kernel: it missed the GPU work (profiling started late or stopped early, or "
              "the GPU activities were not recorded).",
              "Capture again around the steps that run on the GPU (a profiler schedule with warm-up and active "
              "steps), with CUDA activities on."),
}


def rule_trace_kind(f: RunFacts) -> list[Finding]:
    """What the trace is when it is not a timeline of execution: said first, with its evidence."""
    told = _KIND_STORY.get(f.kind.kind)
    if told is None:
        return []
    title, imp, rec = told
    return [Finding("trace_kind", "high" if f.kind.kind in ("stream_capture", "empty") else "medium", title,
                    tuple(Evidence("evidence", e, "text") for e in f.kind.evidence), imp, rec)]
