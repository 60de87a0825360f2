"""Hardware rules: memory-bound vs compute-bound kernels (roofline) and the occupancy limiter.

* ``bound``: kernels placed on the roofline (:mod:`.roofline`): from Nsight Compute counters
  when ncu results are given, else estimated from the Kineto ops' shapes (labelled as an
  estimate). Kernels are grouped by name (time-weighted; a name's kind is the kind with most of
  its time). The finding gives the share of placed time on each side of the ridge point, the top
  kernels of each kind with their % of the roof, and how much of the GPU kernel time is placed
  at all. Severity: ``medium`` when the top kernel runs below ``HEADROOM`` of its roof (room to
  gain on that kernel itself), else ``low``.
* ``occupancy_limiter`` (ncu only): the longest kernel whose theoretical occupancy is below
  100% and whose grid fills at least one wave (below a wave the grid, not the limiter, caps
  occupancy): the limiter (registers, shared memory, warps/block size, blocks), the resources
  behind it, achieved vs theoretical. ``low`` when the kernel still reaches ``HEADROOM`` of its
  roof (low occupancy by design: large tiles, warp specialisation), else ``medium``.
* ``occupancy_achieved`` (ncu only): kernels whose achieved occupancy is below 80% of the
  theoretical (warps not resident for the whole kernel), with how many have a grid smaller
  than one wave: latency-bound launches.

Limits: the ncu kernels are a sample (``--launch-skip/--launch-count``); their share of the
trace's time is not known here, so ncu kernels are ranked by their own duration.
"""

from __future__ import annotations

import math

from .. import advice
from ..facts import RunFacts
from .base import Evidence, Finding
from ...units import fmt_pct
from ..hardware import waves

HEADROOM = 0.6
LATENCY_PCT = 0.1
MIN_VERDICT_COVERAGE = 0.25  # placed share of kernel time below which the bound verdict is informational
ACHIEVED_GAP = 0.8
TOP = 3


def roofline_points(hardware, estimate) -> tuple[list, bool]:
    """(roofline points, estimated?): the Nsight Compute inputs' rooflines when there are any, else
    the trace's shape estimate (both computed once, by the facts)."""
    if hardware:
        return [p for h in hardware for p in h.roofline.points], False
    return (list(estimate.points) if estimate is not None else []), True


def trace_time_by_name(a, hardware, joins) -> dict[str, int]:
    """For each ncu kernel name, the trace's total time of the kernel it joins to (``ncu_join``: name
    key and launch order; the matched trace name's summed durations), from the joins the facts made
    (one per ncu input, in order). Empty without a trace."""
    if a is None or len(a.trace.kernels) == 0 or not joins:
        return {}
    out: dict[str, int] = {}
    for h, join in zip(hardware, joins):
        for k in h.metrics.kernels:
            m = join.for_kernel(k.id)
            if m is not None and m.name_total_ns:
                out.setdefault(k.name, int(m.name_total_ns))
    return out


def _by_name(points, weights: dict[str, int] | None = None) -> list[tuple[str, int, str, float | None]]:
    """(name, time_ns, bound, time-weighted % of roof) per kernel name, longest first. With
    ``weights`` (the joined trace kernel's time per ncu name), a name found there gets the
    trace's time instead of the sum of its points' durations (ncu profiles a sample of the
    launches)."""
    acc: dict[str, dict] = {}
    for p in points:
        if p.bound is None or not p.duration_ns:
            continue
        d = acc.setdefault(p.label, {"t": 0, "mem": 0, "cmp": 0, "pct": 0.0, "pt": 0})
        d["t"] += p.duration_ns
        d["mem" if p.bound == "memory" else "cmp"] += p.duration_ns
        if p.pct_of_roof is not None and math.isfinite(p.pct_of_roof):
            d["pct"] += p.pct_of_roof * p.duration_ns
            d["pt"] += p.duration_ns
    w = weights or {}
    out = [(n, w.get(n, d["t"]), "memory" if d["mem"] >= d["cmp"] else "compute",
            d["pct"] / d["pt"] if d["pt"] else None) for n, d in acc.items()]
    return sorted(out, key=lambda r: (-r[1], r[0]))


def rule_bound(f: RunFacts) -> list[Finding]:
    """Memory- vs compute-bound kernels of one run (ncu counters, else the shape estimate)."""
    return _bound(f.analysis, f.hardware, f.joins, f.estimate, facts=f)


def rule_occupancy(f: RunFacts) -> list[Finding]:
    return _occupancy(f.analysis, f.hardware, graphs=bool(f.in_use.graphs))


def ncu_only_findings(hardware) -> list[Finding]:
    """Roofline and occupancy findings of Nsight Compute inputs without a trace."""
    return _bound(None, hardware, (), None) + _occupancy(None, hardware)


def _bound(a, hardware, joins, estimate, facts: RunFacts | None = None) -> list[Finding]:
    """The bound finding over ``hardware``'s rooflines (weighted by the joined trace's time) or the
    trace's shape ``estimate``; ``facts`` (None for ncu alone) picks the advice."""
    pts, est = roofline_points(hardware, estimate)
    weights = trace_time_by_name(a, hardware, joins) if not est else None
    rows = _by_name(pts, weights)
    if not rows:
        return []
    placed = sum(r[1] for r in rows)
    mem = [r for r in rows if r[2] == "memory"]
    cmp_ = [r for r in rows if r[2] == "compute"]
    mem_t = sum(r[1] for r in mem)
    src = "estimated from op shapes" if est else "Nsight Compute counters"
    weighted = "trace time of the joined kernel" if weights and any(r[0] in weights for r in rows) else (
        "kernel time in the trace" if est else "ncu kernel durations")
    slow = sum(r[1] for r in rows if r[3] is not None and r[3] < 100 * LATENCY_PCT)
    ev = [Evidence("source", src, "text"),
          Evidence("time weights", weighted, "text"),
          Evidence("kernel names placed on the roofline", len(rows), "count"),
          Evidence("memory-bound share of placed kernel time", mem_t / placed, "fraction"),
          Evidence("compute-bound share of placed kernel time", 1 - mem_t / placed, "fraction"),
          Evidence("share of placed time below 10% of its roof", slow / placed, "fraction")]
    coverage = None
    if a is not None and a.breakdown.kernel_time_ns > 0 and (est or weights):
        coverage = min(placed, a.breakdown.kernel_time_ns) / a.breakdown.kernel_time_ns
        ev.append(Evidence("placed share of all kernel time", coverage, "fraction"))
    for kind, group in (("memory-bound", mem), ("compute-bound", cmp_)):
        for i, (name, t, _, pct) in enumerate(group[:TOP], 1):
            ev += [Evidence(f"{kind} #{i}", name, "text"),
                   Evidence(f"{kind} #{i} time", t, "ns"),
                   Evidence(f"{kind} #{i} share of its roof", None if pct is None else pct / 100, "fraction")]
    top = rows[0]
    top_pct = top[3]
    share = mem_t / placed
    dom = "memory" if share >= 0.5 else "compute"
    title = (f"{'Memory' if dom == 'memory' else 'Compute'}-bound kernels take "
             f"{fmt_pct(share if dom == 'memory' else 1 - share)} of the kernel time placed on the roofline"
             + (f", which is {fmt_pct(coverage)} of all kernel time" if coverage is not None and coverage < 0.5 else "")
             + (" (estimate)" if est else ""))
    imp = (f"The longest kernel is {top[2]}-bound"
           + (f" at {fmt_pct(top_pct / 100)} of its roof" if top_pct is not None else "") + ". ")
    if dom == "memory":
        imp += ("Memory-bound kernels go faster only by moving fewer DRAM bytes: more FLOPs or "
                "faster math do not help them.")
        rec = (advice.memory_bound(facts) if facts is not None else
               "move fewer bytes: lower-precision data where accuracy allows, and fuse elementwise chains so "
               "intermediates stay on chip")
        rec = rec[:1].upper() + rec[1:] + "."
    else:
        imp += "Compute-bound kernels are limited by the tensor/CUDA-core FLOP rate."
        rec = (advice.compute_bound(facts) if facts is not None else
               "use a faster math path (a lower precision the GPU supports) or less work (skip padding, exploit "
               "sparsity or causality)")
        rec = rec[:1].upper() + rec[1:] + "."
    if top_pct is not None and top_pct < 100 * HEADROOM:
        sev = "medium"
        tool = advice.kernel_profiler(facts) if facts is not None else "Nsight Compute"
        rec += (f" The top kernel is at {fmt_pct(top_pct / 100)} of its roof: profile it with {tool} (occupancy, "
                "stalls) before changing the algorithm.")
    else:
        sev = "low"
    if slow / placed >= 0.25:
        imp += (f" {fmt_pct(slow / placed)} of the placed time is in kernels below a tenth of their roof: "
                "they are too small to load either the memory system or the math units "
                "(latency-bound: launch overhead, too few blocks).")
    if slow / placed >= 0.5:
        # most time is in kernels too small to reach either roof: the math or memory path is not the lever
        rec = ("Give each kernel more work before changing its math or precision: larger batches per launch, fewer "
               "and larger kernels (fusion), so the kernels load the GPU; the bound matters once they do.")
    if coverage is not None and coverage < 0.5:
        imp += (f" The verdict covers {fmt_pct(coverage)} of the kernel time: the rest could not be placed, so it "
                "says nothing about the whole run.")
    if coverage is not None and coverage < MIN_VERDICT_COVERAGE:
        sev = "info"   # a verdict on a sliver of the kernel time is context, not a lead
    if est:
        imp += (" (Estimate: FLOPs and bytes from recorded shapes, each tensor read once; confirm with a "
                "kernel profiler.)")
    return [Finding("bound", sev, title, tuple(ev), imp, rec)]


def _kernels(hardware) -> list:
    """The ncu kernel records, the longest record per name, longest first."""
    best: dict[str, object] = {}
    for km in (h.metrics for h in hardware):
        for k in km.kernels:
            cur = best.get(k.name)
            if cur is None or (k.duration_ns or 0) > (cur.duration_ns or 0):
                best[k.name] = k
    return sorted(best.values(), key=lambda k: (-(k.duration_ns or 0), k.name))


_FIX = {
    "registers": "cap registers per thread (__launch_bounds__ / -maxrregcount) or use smaller tiles",
    "shared memory": "use smaller tiles or fewer pipeline stages so two blocks fit in an SM's shared memory",
    "warps": "use smaller blocks (fewer warps per block) so more blocks fit",
    "blocks": "use larger blocks: the SM's block-slot limit is reached before its warp limit",
    "barriers": "use fewer named barriers per block",
}


def _occupancy(a, hardware, graphs: bool = False) -> list[Finding]:
    ks = _kernels(hardware or ())
    if not ks:
        return []
    pts, _ = roofline_points(hardware, None)
    pct = {}
    for p in pts:
        if p.pct_of_roof is not None:
            pct.setdefault(p.label, p.pct_of_roof)
    out = []
    limited = [k for k in ks if k.theoretical_occupancy_pct is not None and k.theoretical_occupancy_pct < 100
               and k.occupancy_limiters and (waves(k) is None or waves(k) >= 1)]
    if limited:
        k = limited[0]
        lim = " and ".join(k.occupancy_limiters)
        smem = None
        if k.static_shared_mem_bytes is not None or k.dynamic_shared_mem_bytes is not None:
            smem = (k.static_shared_mem_bytes or 0) + (k.dynamic_shared_mem_bytes or 0)
        roof = pct.get(k.name)
        limits = [getattr(k, f"occupancy_limit_{f}") for f in ("registers", "shared_mem", "warps", "blocks")]
        ev = [Evidence("kernel", k.name, "text"),
              Evidence("duration", k.duration_ns, "ns"),
              Evidence("theoretical occupancy", k.theoretical_occupancy_pct / 100, "fraction"),
              Evidence("achieved occupancy", None if k.achieved_occupancy_pct is None
                       else k.achieved_occupancy_pct / 100, "fraction"),
              Evidence("limiter", lim, "text"),
              Evidence("blocks per SM allowed by the limiter",
                       min(v for v in limits if v is not None) if any(v is not None for v in limits) else None,
                       "count"),
              Evidence("registers per thread", k.registers_per_thread, "count"),
              Evidence("shared memory per block", smem, "bytes"),
              Evidence("threads per block", k.block_size, "count"),
              Evidence("share of its roof", None if roof is None else roof / 100, "fraction"),
              Evidence("other profiled kernels below 100% theoretical occupancy", len(limited) - 1, "count")]
        fix = "; ".join(_FIX.get(x, x) for x in k.occupancy_limiters)
        if roof is not None and roof >= 100 * HEADROOM:
            sev = "low"
            imp = (f"Occupancy is low by design here: the kernel still reaches {fmt_pct(roof / 100)} of "
                   f"its roof (large tiles, warp specialisation hide latency with few warps).")
            rec = "No action: more resident warps would not make this kernel faster."
        else:
            sev = "medium"
            imp = ("Fewer resident warps hide less memory and pipeline latency; the limiter, not the "
                   "grid, caps how many warps each SM can keep in flight.")
            rec = f"Raise occupancy: {fix}; then re-check achieved occupancy and stalls with ncu."
        out.append(Finding("occupancy_limiter", sev,
                           f"Occupancy of the longest limited kernel is capped at "
                           f"{fmt_pct(k.theoretical_occupancy_pct / 100)} by {lim}",
                           tuple(ev), imp, rec))
    gap = [k for k in ks if k.theoretical_occupancy_pct and k.achieved_occupancy_pct is not None
           and k.achieved_occupancy_pct < ACHIEVED_GAP * k.theoretical_occupancy_pct]
    if gap:
        k = gap[0]
        w = waves(k)
        small = [x for x in gap if waves(x) is not None and waves(x) < 1]
        roof = pct.get(k.name)
        ev = (Evidence("kernels with achieved < 80% of theoretical", len(gap), "count"),
              Evidence("profiled kernel names", len(ks), "count"),
              Evidence("of them with a grid smaller than one wave", len(small), "count"),
              Evidence("longest such kernel", k.name, "text"),
              Evidence("its achieved occupancy", k.achieved_occupancy_pct / 100, "fraction"),
              Evidence("its theoretical occupancy", k.theoretical_occupancy_pct / 100, "fraction"),
              Evidence("its blocks", k.grid_size, "count"),
              Evidence("its waves per SM", w, "ratio"),
              Evidence("its share of its roof", None if roof is None else roof / 100, "fraction"))
        if w is not None and w < 1:
            sev = "low" if roof is not None and roof >= 100 * HEADROOM else "medium"
            imp = ("The longest one's grid is smaller than one wave: SMs sit idle for the whole "
                   "kernel, which is latency-bound (launch and tail), not limited by occupancy "
                   "settings.")
            rec = ("Give each launch more parallel work: batch requests or tokens, fuse small kernels, split-K or "
                   "persistent kernels for skinny GEMMs" + ("." if graphs else
                                                            "; capture the sequence in CUDA Graphs to cut the launch "
                                                            "cost of tiny kernels."))
        else:
            sev = "low"
            imp = ("Warps are not resident for the whole kernel: a partial last wave (tail), load "
                   "imbalance between blocks, or a kernel too short to ramp up.")
            rec = "Check the grid against the SM count (waves per SM) and the per-block work balance."
        out.append(Finding("occupancy_achieved", sev,
                           f"{len(gap)} of {len(ks)} profiled kernels reach less than 80% of their "
                           f"theoretical occupancy", ev, imp, rec))
    return out
