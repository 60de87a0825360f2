"""A :class:`~tracestory.analysis.compare.Comparison` as Markdown and as JSON.

The Markdown generalizes the classic eager-vs-compiled table (one row per time metric, the two
runs in ms and the speedup) and adds the counts, a per-category table with a paired bar
chart, the top kernels, kernel families, fusions, phases and a "What changed and why it
matters" section written from the comparison's facts. Every number printed is formatted from
a field of the comparison (or of its findings' evidence), which :func:`comparison_json`
writes out in base units; charts stay within 100 columns.
"""

from __future__ import annotations

import re
from typing import Any

from ..analysis.compare import Comparison
from ..units import plural
from .ascii import Bar, bar_chart, fmt_ms, fmt_ns, fmt_pct
from .jsonable import jsonable
from .md import fmt_evidence, md_table, short_name
from .window import window_json, window_lines

SCHEMA = "tracestory.comparison/1"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _delta_ns(ns: int) -> str:
    return ("+" if ns > 0 else "-" if ns < 0 else "±") + fmt_ns(abs(ns))


def _delta_count(n: int | None) -> str:
    return "n/a" if n is None else f"{n:+d}"


def _kname(name: str, width: int = 56) -> str:
    return f"`{short_name(name, width)}`"


def _verdict(s: float) -> str:
    if abs(s - 1.0) < 0.005:
        return "as fast as"
    return f"{s:.2f}x faster than" if s > 1 else f"{1 / s:.2f}x slower than"


# ------------------------------------------------------------------ sections


def summary_table(c: Comparison) -> list[str]:
    """The eager-vs-compiled table shape: time metrics of both runs in ms and the speedup (A / B)."""
    a, b = c.a, c.b
    rows = []
    for s in c.speedups:
        label = s.metric
        if s.metric.startswith("iteration") and a.iteration is not None and b.iteration is not None:
            label = (
                f"{a.iteration.family} iteration, {s.metric.split()[1]} ({a.iteration.count} vs {b.iteration.count})"
            )
        elif s.metric == "wall":
            label = "wall (first phase start to last end)" if a.phase_source != "none" else "wall (GPU window)"
        elif s.metric == "GPU busy":
            label = "GPU busy (union of GPU ops)"
        elif s.metric == "GPU op time":
            label = "GPU op time (sum of kernel + memop durations)"
        rows.append((label, fmt_ms(s.a_ns), fmt_ms(s.b_ns), "identical" if c.identical else _x(s.speedup)))
    return md_table(("", f"{a.label} [ms]", f"{b.label} [ms]", f"speedup {b.label} vs {a.label}"), rows, "lrrr")


def counts_table(c: Comparison) -> list[str]:
    a, b, ch = c.a, c.b, c.changes

    def na(v):
        return "n/a" if v is None else v

    idle = fmt_pct
    rows = [
        ("compiled", "yes" if a.compiled else "no", "yes" if b.compiled else "no", ""),
        ("kernels", a.kernel_count, b.kernel_count, _delta_count(ch.kernel_count_delta)),
        ("launches (API calls)", na(a.launch_count), na(b.launch_count), _delta_count(ch.launch_delta)),
        (
            "Triton/Inductor kernel runs",
            a.triton_kernel_count,
            b.triton_kernel_count,
            _delta_count(b.triton_kernel_count - a.triton_kernel_count),
        ),
        (
            "CUDA graph launches",
            na(a.graph_launch_count),
            na(b.graph_launch_count),
            _delta_count(
                b.graph_launch_count - a.graph_launch_count
                if a.graph_launch_count is not None and b.graph_launch_count is not None
                else None
            ),
        ),
        ("memcpy/memset ops", a.memop_count, b.memop_count, _delta_count(b.memop_count - a.memop_count)),
        (
            "GPU idle share of window",
            idle(a.idle_fraction),
            idle(b.idle_fraction),
            "n/a" if ch.idle_fraction_delta is None else f"{100 * ch.idle_fraction_delta:+.1f} pts",
        ),
    ]
    return md_table(("", a.label, b.label, f"{b.label} - {a.label}"), rows, "lrrr")


def category_table(c: Comparison) -> list[str]:
    a, b = c.a.label, c.b.label
    rows = [
        (
            d.name,
            fmt_ms(d.a_time_ns),
            fmt_pct(d.a_share),
            d.a_count,
            fmt_ms(d.b_time_ns),
            fmt_pct(d.b_share),
            d.b_count,
            _delta_ns(d.delta_ns),
            _x(d.ratio),
        )
        for d in c.categories
    ]
    return md_table(
        (
            "category",
            f"{a} (ms)",
            f"{a} share",
            f"{a} ops",
            f"{b} (ms)",
            f"{b} share",
            f"{b} ops",
            "change",
            f"{b} / {a}",
        ),
        rows,
        "lrrrrrrrr",
    )


def category_chart(c: Comparison) -> list[str]:
    """Paired bars per category on one scale: A's bar above B's."""
    top = max([max(d.a_time_ns, d.b_time_ns) for d in c.categories] or [0])
    bars = []
    for d in c.categories:
        bars.append(Bar(f"{d.name} {c.a.label}", d.a_time_ns, f"{fmt_ms(d.a_time_ns):>10} ms"))
        bars.append(Bar(f"{d.name} {c.b.label}", d.b_time_ns, f"{fmt_ms(d.b_time_ns):>10} ms"))
    return bar_chart(
        bars, title=f"GPU op time per category, {c.a.label} vs {c.b.label} (one scale)", max_value=top or None
    )


def kernel_table(c: Comparison) -> list[str]:
    a, b = c.a.label, c.b.label
    where = {"a": f"only {a}", "b": f"only {b}", None: "both"}
    rows = [
        (
            _kname(k.name),
            k.category,
            where[k.only_in],
            fmt_ms(k.a_time_ns),
            k.a_count,
            fmt_ms(k.b_time_ns),
            k.b_count,
            _delta_ns(k.delta_ns),
        )
        for k in c.kernels
    ]
    return md_table(
        ("kernel", "category", "in", f"{a} (ms)", f"{a} runs", f"{b} (ms)", f"{b} runs", "change"), rows, "lllrrrrr"
    )


def family_table(c: Comparison) -> list[str]:
    a, b = c.a.label, c.b.label
    rows = [(f.name, fmt_ms(f.a_time_ns), f.a_count, fmt_ms(f.b_time_ns), f.b_count) for f in c.families]
    return md_table(("kernel family", f"{a} (ms)", f"{a} runs", f"{b} (ms)", f"{b} runs"), rows, "lrrrr")


def phase_table(c: Comparison) -> list[str]:
    a, b = c.a.label, c.b.label
    rows = [
        (p.family, p.a_count, fmt_ms(p.a_median_ns), p.b_count, fmt_ms(p.b_median_ns), _x(p.speedup)) for p in c.phases
    ]
    return md_table(
        ("phase family", f"{a} count", f"{a} median (ms)", f"{b} count", f"{b} median (ms)", "speedup"), rows, "lrrrrr"
    )


def fusion_lines(c: Comparison) -> list[str]:
    out = []
    label = {"a": c.a.label, "b": c.b.label}
    for f in c.fused:
        other = "b" if f.side == "a" else "a"
        line = f"- {label[f.side]}: {_kname(f.name, 60)} ({f.count} runs, {fmt_ns(f.time_ns)}) fuses {', '.join(f.ops)}"
        if f.replaces:
            line += (
                f"; it covers {label[other]}'s "
                + ", ".join(_kname(r, 40) for r in f.replaces)
                + f" ({f.replaced_count} runs, {fmt_ns(f.replaced_time_ns)})"
            )
        else:
            line += f"; no small-op kernel found only in {label[other]} matches those ops"
        out.append(line + ".")
    return out


def what_changed(c: Comparison) -> list[str]:
    """The prose section: facts first, then why they matter. Every number from ``c``."""
    a, b, ch, h = c.a, c.b, c.changes, c.headline
    out = []
    if c.identical is not None:
        out.append(
            f"- **The two inputs are identical (same SHA-256 `{c.identical[:16]}`)**: every number below is "
            "the same on both sides."
        )
    elif h is not None and h.speedup is not None:
        out.append(
            f"- **{b.label} is {_verdict(h.speedup)} {a.label}** by {h.metric}: "
            f"{fmt_ns(h.a_ns)} -> {fmt_ns(h.b_ns)} ({_x(h.speedup)})."
        )
    out.append(
        f"- Execution mode: {a.label} is {'compiled' if a.compiled else 'eager'} ({a.compile_evidence}); "
        f"{b.label} is {'compiled' if b.compiled else 'eager'} ({b.compile_evidence})."
    )
    out.append(
        f"- GPU op time {fmt_ns(a.gpu_time_ns)} -> {fmt_ns(b.gpu_time_ns)} "
        f"({_delta_ns(b.gpu_time_ns - a.gpu_time_ns)})."
    )
    if ch.grew:
        out.append("- Grew most: " + ", ".join(f"{d.name} {_delta_ns(d.delta_ns)}" for d in ch.grew[:3]) + ".")
    if ch.shrank:
        out.append("- Shrank most: " + ", ".join(f"{d.name} {_delta_ns(d.delta_ns)}" for d in ch.shrank[:3]) + ".")
    out.append(
        f"- Kernels: {a.kernel_count} -> {b.kernel_count} runs; {ch.only_a_kernels} kernel names only in "
        f"{a.label} ({fmt_ns(ch.only_a_time_ns)}), {ch.only_b_kernels} only in {b.label} "
        f"({fmt_ns(ch.only_b_time_ns)})."
    )
    if ch.launch_delta is not None:
        red = (
            f", {fmt_pct(ch.launch_reduction)} fewer"
            if ch.launch_reduction is not None and ch.launch_reduction > 0
            else f", {fmt_pct(-ch.launch_reduction)} more"
            if ch.launch_reduction is not None and ch.launch_reduction < 0
            else ""
        )
        out.append(f"- Launches: {a.launch_count} -> {b.launch_count} API calls{red}.")
    if ch.idle_fraction_delta is not None:
        out.append(f"- GPU idle share of its window: {fmt_pct(a.idle_fraction)} -> {fmt_pct(b.idle_fraction)}.")
    fused = [f for f in c.fused if f.replaces]
    if fused:
        out.append(
            f"- Fusion: {plural(len(fused), 'Inductor kernel')} cover small-op kernels of the other run (list below)."
        )
    out += ["", "Why it matters:", ""]
    out += [f"- {s}" for s in _why_it_matters(c)]
    return out


def _why_it_matters(c: Comparison) -> list[str]:
    a, b, ch = c.a, c.b, c.changes
    out = []
    for f in c.findings:
        out.append(f"{f.title}. {f.implication} {f.recommendation}")
    idle = [s for s in (a, b) if s.idle_fraction is not None and s.idle_fraction >= 0.5]
    if idle:
        names = " and ".join(f"{s.label} ({fmt_pct(s.idle_fraction)} idle)" for s in idle)
        out.append(
            f"The GPU is idle more than half its window in {names}: there, host time, not kernel "
            f"time, sets the pace, so kernel-level differences show little in the wall time."
        )
    if ch.launch_reduction is not None and ch.launch_reduction >= 0.2:
        out.append(
            f"{fmt_pct(ch.launch_reduction)} fewer launches: each launch avoided saves host time "
            f"and a memory round trip between kernels (fusion or CUDA graphs)."
        )
    for s in (a, b):
        it = s.iteration
        if it is not None and it.slowest_ratio is not None and it.slowest_ratio >= 1.5:
            out.append(
                f"In {s.label} the slowest {it.family} iteration, {it.slowest}, took {fmt_ns(it.max_ns)}, "
                f"{it.slowest_ratio:.1f}x the median: warm-up inside the capture (JIT compilation, "
                f"autotuning, CUDA-graph recording, allocator growth). Totals, means and the wall time "
                f"include it; the median does not. Warm up before profiling to compare steady states."
            )
    return out
    return out


def gate_value(g, v: float) -> str:
    """A gated metric's value as the tables show it."""
    if g.unit == "ns":
        return fmt_ns(v)
    if g.unit == "points":
        return fmt_pct(v)
    return f"{v:,.0f}"


def gate_change(g) -> str:
    if g.change is None:
        return "n/a (A is 0)"
    return f"{g.change:+.1f} pts" if g.unit == "points" else f"{g.change:+.1f}%"


def gate_line(g) -> str:
    """One line per regression (stderr in CI): metric, A -> B, change, gate."""
    limit = f"{g.gate:g} pts" if g.unit == "points" else f"{g.gate:g}%"
    return f"regression: {g.metric} {gate_value(g, g.a)} -> {gate_value(g, g.b)} ({gate_change(g)}, gate {limit})"


def gate_table(c: Comparison) -> list[str]:
    rows = [
        (
            g.metric,
            gate_value(g, g.a),
            gate_value(g, g.b),
            gate_change(g),
            f"{g.gate:g} pts" if g.unit == "points" else f"{g.gate:g}%",
            "REGRESSION" if g.regressed else "ok",
        )
        for g in c.gates
    ]
    return md_table(("metric", c.a.label, c.b.label, "change", "gate", "result"), rows, "lrrrrl")


def findings_lines(c: Comparison) -> list[str]:
    out = []
    for i, f in enumerate(c.findings, 1):
        out += [f"#### {i}. [{f.severity.upper()}] {f.title}", ""]
        out += [f"- {e.label}: {fmt_evidence(e)}" for e in f.evidence]
        out += ["", f"**Implication**: {f.implication}", "", f"**Recommendation**: {f.recommendation}", ""]
    return out


def comparison_section(c: Comparison) -> list[str]:
    """The comparison as a report section body (``###`` subsections)."""
    a, b = c.a, c.b
    out = [
        f"{a.label}: `{a.source}`" + (f" on {a.device}" if a.device else "") + "; "
        f"{b.label}: `{b.source}`" + (f" on {b.device}" if b.device else "") + f". Taxonomy: {c.taxonomy}. "
        f"Speedup = {a.label} time / {b.label} time (> 1: {b.label} is faster).",
        "",
    ]
    out += window_lines(c.window)
    out += summary_table(c) + [""] + counts_table(c) + [""]
    out += ["### What changed and why it matters", ""] + what_changed(c) + [""]
    out += ["### Per category", ""] + category_table(c) + [""]
    out += ["```text", *category_chart(c), "```", ""]
    out += ["### Top kernels", ""] + kernel_table(c) + [""]
    out += ["### Kernel families", ""] + family_table(c) + [""]
    fl = fusion_lines(c)
    if fl:
        out += [
            "### Fusion",
            "",
            (
                "Inductor kernels are named after the ops they fuse; each is matched "
                "to the small-op kernels found only in the other run whose names carry "
                "those ops."
            ),
            "",
        ]
        out += fl + [""]
    if c.phases:
        out += (
            [
                "### Phases",
                "",
                ("Iteration time = CPU range start to the later of the range end and its last GPU op end."),
                "",
            ]
            + phase_table(c)
            + [""]
        )
    if c.gates:
        bad = sum(g.regressed for g in c.gates)
        out += [
            "### Regression gate",
            "",
            (
                f"{bad} of {len(c.gates)} gated metrics regressed"
                if bad
                else f"All {len(c.gates)} gated metrics within their gates"
            )
            + f" (a regression: {b.label} worse than {a.label} by more than the gate).",
            "",
        ]
        out += gate_table(c) + [""]
    fs = findings_lines(c)
    if fs:
        out += ["### Findings", ""] + fs
    return out


def render_comparison(c: Comparison, *, title: str | None = None) -> str:
    """The whole comparison document (ends with one newline)."""
    out = [f"# {title or f'Run comparison: {c.a.label} vs {c.b.label}'}", ""] + comparison_section(c)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def comparison_json(c: Comparison) -> dict:
    """All of the comparison in base units (ns, counts, fractions), plus its findings."""
    doc: dict[str, Any] = {"schema": SCHEMA}
    doc.update(jsonable(c))
    doc["window"] = window_json(c.window)
    doc["findings"] = [jsonable(f) for f in c.findings]
    return doc
