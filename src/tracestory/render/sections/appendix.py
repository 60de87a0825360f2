"""Appendix: per trace the category table with Amdahl ceilings, top kernels, GPU time per
top-level operator, phases, timeline quantities, idle gaps and streams; then the inputs and the
command."""

from __future__ import annotations

from ...units import clip_text, fmt_count, fmt_ms, fmt_ns, fmt_pct
from ..ascii import queue_below_zero
from ..jsonout import REPORT_OPS
from ..md import fence, label, md_table, short_name
from . import Context


def operators_part(run) -> list[str]:
    """GPU time per top-level CPU op (the :data:`REPORT_OPS` largest groups by name and input
    shapes), or the one line that says where to get it on a trace too large for the report."""
    ops = run.report_operators
    if ops is None:
        return [
            "**GPU time per operator**: not computed for the report on a trace of "
            f"{fmt_count(run.op_count)} CPU ops and ranges; `tracestory analyze --table ops` gives it.",
            "",
        ]
    if not ops.top_level:
        return ["**GPU time per operator**: n/a (the trace has no CPU ops or ranges that launched GPU work).", ""]
    what = "name and input shapes" if ops.shapes_recorded else "name (no input shapes recorded)"
    out = [
        f"**GPU time per operator** (top-level CPU ops by {what}; share of GPU op time; "
        "all rows: `tracestory analyze --table ops`)",
        "",
    ]
    out += md_table(
        ("op", "input shapes", "GPU time", "share", "calls", "kernels", "top kernel"),
        [
            (
                f"`{clip_text(s.name, 48)}`",
                f"`{clip_text(s.input_dims, 60)}`" if s.input_dims else "n/a",
                fmt_ns(s.gpu_ns),
                fmt_pct(s.share),
                s.calls,
                s.kernel_count,
                f"`{short_name(s.top_kernels[0][0], 40)}`" if s.top_kernels else "n/a",
            )
            for s in ops.top_level[:REPORT_OPS]
        ],
        "llrrrrl",
    )
    total = ops.total_gpu_ns
    rest = [
        f"{what}: {fmt_ns(ns)} ({fmt_pct(ns / total)}, {n} GPU ops)"
        for what, n, ns in (
            ("launched outside every CPU op", ops.outside_ops_count, ops.outside_ops_ns),
            ("launch call not in the trace", ops.unattributed_count, ops.unattributed_ns),
        )
        if n and total
    ]
    if rest:
        out += ["", "GPU time no op can be given: " + "; ".join(rest) + "."]
    return out + [""]


FEW = 20  # below this many gaps or ops, a histogram says less than the list it summarises


def _appendix(runs, inputs, command) -> list[str]:
    out = []
    analyses = [r.analysis for r in runs]
    for run, a in zip(runs, analyses, strict=False):
        if len(analyses) > 1:
            out += [f"### {label(a)}", ""]
        b, tl, phs = a.breakdown, a.timeline, a.phases
        out += [
            "**Categories** (share of GPU op time; ceiling = 1/(1-p); "
            f"what-if = category {b.speedup_factor:g}x faster)",
            "",
        ]
        out += md_table(
            ("category", "time (ms)", "ops", "share", "mean", "Amdahl ceiling", "what-if"),
            [
                (
                    c.name,
                    fmt_ms(c.time_ns),
                    c.count,
                    f"{c.percent:.1f}%",
                    fmt_ns(c.mean_ns),
                    f"{c.amdahl_max_speedup:.2f}x" if c.amdahl_max_speedup is not None else "unbounded",
                    f"{c.whatif_speedup:.2f}x",
                )
                for c in b.categories
            ],
            "lrrrrrr",
        )
        out += ["", "**Top kernels**", ""]
        out += md_table(
            ("kernel", "category", "time (ms)", "count", "mean", "share"),
            [
                (
                    f"`{short_name(x.name, 60)}`",
                    x.category,
                    fmt_ms(x.time_ns),
                    x.count,
                    fmt_ns(x.mean_ns),
                    f"{x.percent:.1f}%",
                )
                for x in b.kernels
            ],
            "llrrrr",
        )
        out += [""] + operators_part(run)
        if len(phs.phases) > 1:  # one phase is the whole story above, with these numbers
            out += [f"**Phases** (source: {phs.source})", ""]
            out += md_table(
                ("#", "phase", "CPU wall (ms)", "GPU span (ms)", "GPU busy (ms)", "kernels", "memops"),
                [
                    (
                        p.index,
                        p.name,
                        fmt_ms(p.wall_ns),
                        fmt_ms(p.gpu_span_ns),
                        fmt_ms(p.gpu_busy_ns),
                        p.kernel_count,
                        p.memop_count,
                    )
                    for p in phs.phases[:64]
                ],
                "rlrrrrr",
            )
            if len(phs.phases) > 64:
                out.append(f"({len(phs.phases) - 64} more phases not listed)")
        if tl is not None:
            out += ["", "**Timeline**", ""]
            la, lq = tl.launch_api, tl.launch_queue
            out += md_table(
                ("quantity", "value"),
                [
                    ("GPU window", fmt_ns(tl.window_ns)),
                    ("busy (union)", fmt_ns(tl.busy_ns)),
                    ("plain sum of op durations", fmt_ns(tl.sum_ns)),
                    ("idle", fmt_ns(tl.idle_ns)),
                    ("idle waiting for launch", fmt_ns(tl.idle_launch_wait_ns)),
                    ("idle other", fmt_ns(tl.idle_other_ns)),
                    ("gaps", tl.gap_count),
                    ("kernels per ms", f"{tl.kernels_per_ms:.2f}"),
                    (f"kernels < {fmt_ns(tl.short_kernel_ns)}", fmt_pct(tl.short_kernel_share)),
                    (
                        "launch call CPU time p50 / p90 / p99",
                        f"{fmt_ns(la.p50_ns)} / {fmt_ns(la.p90_ns)} / {fmt_ns(la.p99_ns)} ({la.count} ops)",
                    ),
                    (
                        "queue time (GPU start - call end) p50 / p90 / p99",
                        f"{fmt_ns(lq.p50_ns)} / {fmt_ns(lq.p90_ns)} / {fmt_ns(lq.p99_ns)} ({lq.count} ops"
                        f"{queue_below_zero(tl.launch_queue_negative)})",
                    ),
                    (
                        "idle time mostly waiting for launches",
                        f"not judged ({tl.verdict_withheld})"
                        if tl.verdict_withheld
                        else "yes"
                        if run.facts.launch_bound
                        else f"no: {fmt_pct(run.facts.long_gap_share)} of it is in gaps of 1 ms or more"
                        if tl.launch_bound and run.facts.long_gap_share
                        else "no",
                    ),
                ],
                "lr",
            )
            if tl.gap_count >= FEW:  # a handful of gaps is the largest-gaps table below, whole
                out += ["", "**Idle gap histogram**", ""]
                out += md_table(
                    ("gap length", "count", "total"), [(lab, n, fmt_ns(t)) for lab, n, t in tl.gap_histogram], "lrr"
                )
            out += ["", "**Largest gaps**", ""]
            out += md_table(
                ("at (ms from window start)", "length", "launch wait", "after", "before"),
                [
                    (
                        fmt_ms(g.start_ns - tl.start_ns),
                        fmt_ns(g.dur_ns),
                        fmt_ns(g.launch_wait_ns),
                        f"`{short_name(g.before, 40)}`",
                        f"`{short_name(g.after, 40)}`",
                    )
                    for g in tl.largest_gaps
                ],
                "rrrll",
            )
            if len(tl.streams) > 1:  # one stream's busy time and ops are the timeline's own
                out += ["", "**Streams**", ""]
                out += md_table(
                    ("device", "stream", "busy", "ops"),
                    [(s.device, s.stream, fmt_ns(s.busy_ns), s.op_count) for s in tl.streams],
                    "rrrr",
                )
        out.append("")
    # the command that made this report is in the Reproduction Guide
    out += ["**Inputs**", ""] + ([f"- `{p}`" for p in inputs] or ["- n/a (not given)"]) + [""]
    return out


def render(c: Context) -> list[str]:
    if c.no_trace:
        return [
            "**Inputs**",
            "",
            *[f"- `{p}`" for p in c.inputs],
            "",
            "**Command**",
            "",
            *fence([c.command or "n/a (not given)"], "bash"),
            "",
        ]
    r = c.results
    table = _per_trace_table(r) if r.selection is not None else []
    return table + _appendix(list(c.shown), list(c.inputs), c.command)


def _per_trace_table(r) -> list[str]:
    """Every trace in one table (many ranks are told once above; their numbers are here)."""
    rows = []
    for i, run in enumerate(r.runs):
        a = run.analysis
        tl = a.timeline
        top = a.breakdown.categories[0] if a.breakdown.categories else None
        rows.append(
            (
                label(a),
                a.breakdown.kernel_count,
                fmt_ms(a.breakdown.total_time_ns),
                fmt_pct(tl.busy_ns / tl.window_ns) if tl is not None and tl.window_ns else "n/a",
                f"{top.name} {top.percent:.1f}%" if top else "n/a",
                "median" if i == r.selection.median else next((w for j, w in r.selection.outliers if j == i), ""),
            )
        )
    return (
        ["**Every trace** (the sections above tell the median trace and the ones that differ):", ""]
        + md_table(
            ("trace", "kernels", "GPU op time (ms)", "GPU busy", "top category", "told above as"), rows, "lrrrll"
        )
        + [""]
    )
