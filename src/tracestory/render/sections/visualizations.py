"""Visualizations: category breakdown, per-stream timeline, op-duration histogram, memory over
time, the multi-GPU timeline, roofline availability, interactive viewers and the PNG plots."""

from __future__ import annotations

import numpy as np

from ...analysis.facts import RunFacts
from ...units import fmt_ms, fmt_ns
from ..ascii import Bar, Lane, bar_chart, lanes_timeline, log_histogram
from ..md import fence, label, short_name
from ..memory import memory_section
from ..multigpu import render_multigpu_section
from . import Context

FEW_OPS = 100  # below this many GPU ops the duration histogram says less than the Appendix's kernel table


def _visualizations(runs) -> list[str]:
    out = []
    for run in runs:
        a = run.analysis
        if len(runs) > 1:
            out += [f"### {label(a)}", ""]
        b = a.breakdown
        bars = [Bar(c.name, c.time_ns, f"{fmt_ms(c.time_ns):>10} ms {c.percent:5.1f}%") for c in b.categories]
        out += ["GPU time breakdown by category (share of GPU op time, kernels + memops):", ""]
        out += fence(bar_chart(bars, title=f"category   (total {fmt_ns(b.total_time_ns)} of GPU op time)"))
        out.append("")
        tl = a.timeline
        if tl is None:
            out += ["Timeline: n/a (the input has no per-op start times)", ""]
            continue
        out += [
            "GPU timeline, one lane per stream (each column: the category with the most "
            "time in it; `·` idle), phases above:",
            "",
        ]
        out += fence(_timeline_chart(run.facts, tl.start_ns, tl.end_ns))
        out.append("")
        zoom = next((p for p in a.phases.phases if p.gpu_span_ns), None)
        if tl.busy_ns < 0.2 * tl.window_ns and zoom is not None and a.phases.source != "none":
            out += [f"Zoom on the first phase, `{zoom.name}` (GPU span {fmt_ns(zoom.gpu_span_ns)}):", ""]
            out += fence(_timeline_chart(run.facts, zoom.gpu_start_ns, zoom.gpu_end_ns))
            out.append("")
        dur = np.concatenate([a.trace.kernels.dur_ns, a.trace.memops.dur_ns])
        hist = log_histogram(dur, title="GPU op durations (count of ops per log bin):") if len(dur) >= FEW_OPS else None
        if hist:
            out += fence(hist) + [""]
    return out


def _visual_extras(results, inputs, has_roofline: bool, shown=None) -> list[str]:
    """Memory over time (of the ``shown`` runs: all, or the ones a many-rank report tells),
    multi-GPU timeline (or why either is n/a), roofline availability, interactive viewers."""
    analyses, multigpu = results.analyses, results.multigpu
    out = []
    for run in results.runs if shown is None else shown:
        head = [f"Memory over time, {label(run)}:", ""] if len(analyses) > 1 else ["Memory over time:", ""]
        out += head + memory_section(run.memory) + [""]
    if multigpu is not None:
        out += ["### Multi-GPU communication timeline", "", render_multigpu_section(multigpu), ""]
    else:
        ws = [a.trace.meta.world_size for a in analyses if (a.trace.meta.world_size or 1) > 1]
        if ws:
            out += [
                f"Multi-GPU timeline: n/a: the input holds {len(analyses)} of {max(ws)} ranks; pass every "
                "rank's trace (a folder, a glob or a `--torchrun` capture folder) for the per-GPU lanes, "
                "collective skew and stragglers.",
                "",
            ]
    amd = bool(results.runs) and all(r.facts.platform == "ROCm" for r in results.runs)
    counters = "no hardware-counter input" if amd else "no Nsight Compute metrics"
    if not has_roofline:
        if any(f.rule == "bound" for r in results.runs for f in r.findings):
            out += [
                f"Roofline chart: n/a here ({counters}); the roofline estimated from op "
                "shapes is summarized in Observations (memory- vs compute-bound kernels).",
                "",
            ]
        else:
            why = "; ".join(
                dict.fromkeys(
                    r.roofline_estimate.note
                    for r in results.runs
                    if r.roofline_estimate is not None and r.roofline_estimate.note
                )
            )
            out += [
                f"Roofline: n/a: {counters}, and no shape estimate ({why or 'no ops'})"
                + ("." if amd else "; add an ncu report to place kernels against the roofline."),
                "",
            ]
    ins = " ".join(inputs) if inputs else "TRACE"
    out += [
        "Interactive exploration: `tracestory export perfetto " + ins + " -o timeline.json.gz` writes this "
        "analyzed timeline (categories, phases, idle gaps as annotations) for https://ui.perfetto.dev or "
        "chrome://tracing; the raw inputs also open there (Kineto JSON)"
        + ("." if amd else " or in the Nsight Systems / Nsight Compute UIs (.nsys-rep, .ncu-rep)."),
        "",
    ]
    return out


def _timeline_chart(f: RunFacts, t0: int, t1: int) -> list[str]:
    a, g = f.analysis, f.gpu_ops
    tr, cats = a.trace, g.categories
    dev, stream, s, e, c = g.device, g.stream, g.start_ns, g.end_ns, g.category
    lanes = []
    pairs = [tuple(map(int, p)) for p in np.unique(np.stack([dev, stream], axis=1), axis=0)] if len(dev) else []
    for d, x in pairs[:8]:
        sel = (dev == d) & (stream == x)
        lanes.append(Lane(f"gpu{d} s{x}", s[sel], e[sel], c[sel]))
    phs = [p for p in a.phases.phases if p.gpu_start_ns is not None]
    markers = []
    if a.phases.source != "none" and phs:
        segs = np.array([[p.gpu_start_ns, p.gpu_end_ns] for p in phs])
        markers.append(("phases(GPU)", segs, [p.name for p in phs]))
    inside = np.flatnonzero((s < t1) & (e > t0))
    hot = int(inside[np.argmax((e - s)[inside])]) if inside.size else int(np.argmax(e - s))
    hotspot = (int(s[hot]), f"longest op: {short_name(tr.name(int(g.name[hot])), 40)} {fmt_ns(int(e[hot] - s[hot]))}")
    lines = lanes_timeline(lanes, cats, t0, t1, hotspot=hotspot, markers=markers)
    if len(pairs) > 8:
        lines.append(f"({len(pairs) - 8} more streams not drawn)")
    return lines


def _has_roofline(r) -> bool:
    return bool(r.hardware) or any(run.roofline_estimate is not None and run.roofline_estimate.points for run in r.runs)


def _without_trace(c: Context) -> list[str]:
    if c.results.batching is not None:
        return [
            "The charts of this serving run (KV cache blocks and device memory over time) are in the "
            "Execution Story. Kernel timeline, breakdown and roofline: n/a (no trace; capture the "
            "server with `tracestory capture ... --load` to add one).",
            "",
            "Interactive exploration: add a Kineto or nsys trace of the run and open it with "
            "`tracestory export perfetto` in https://ui.perfetto.dev.",
            "",
        ]
    if c.results.hardware:
        return [
            (c.no_trace or "").replace("n/a:", "Timeline: n/a:"),
            "",
            "Interactive exploration: open the .ncu-rep in the Nsight Compute UI (ncu-ui) for the "
            "source-level and per-section views behind these numbers.",
            "",
        ]
    return [c.no_trace or "", ""]


def render(c: Context) -> list[str]:
    if c.no_trace:
        out = _without_trace(c)
    else:
        out = _visualizations(c.shown) + _visual_extras(c.results, list(c.inputs), _has_roofline(c.results), c.shown)
    if c.plots:
        out += ["Plots (PNG):", "", "\n".join(f"![{p.stem}]({p.name})" for p in c.plots), ""]
    return out
