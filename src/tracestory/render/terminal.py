"""Results -> rich renderables for the terminal. Nothing here prints; the CLI does."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from .ascii import fmt_ns, fmt_pct, queue_below_zero
from .md import short_name

if TYPE_CHECKING:  # a type only: importing compare (hashlib, its dataclasses) costs `analyze` ~20 ms
    from ..analysis.compare import Comparison


def _summary(a) -> Table:
    t, b, m = a.timeline, a.breakdown, a.trace.meta
    dev = m.devices[0].name if m.devices else "unknown GPU"
    title = f"{a.trace.label} — {dev}"
    tab = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    tab.add_column(style="bold")
    tab.add_column()
    tab.add_row("kernels", f"{b.kernel_count:,}  ({fmt_ns(b.kernel_time_ns)} summed)")
    tab.add_row("memcpy/memset", f"{b.memop_count:,}  ({fmt_ns(b.memop_time_ns)} summed)")
    if t is None:
        tab.add_row("timeline", "n/a (input has no per-kernel start times)")
        return tab
    tab.add_row("GPU window", fmt_ns(t.window_ns))
    tab.add_row(
        "GPU busy (union)",
        f"{fmt_ns(t.busy_ns)}  ({fmt_pct(t.busy_ns / t.window_ns if t.window_ns else None)} of window;"
        f" plain sum {fmt_ns(t.sum_ns)})",
    )
    tab.add_row(
        "GPU idle",
        f"{fmt_ns(t.idle_ns)}  in {t.gap_count:,} gaps; waiting for launches {fmt_ns(t.idle_launch_wait_ns)},"
        f" other {fmt_ns(t.idle_other_ns)}",
    )
    la, lq = t.launch_api, t.launch_queue
    tab.add_row(
        "launch call (CPU)",
        "n/a (no launch calls linked)"
        if not la.count
        else f"p50 {fmt_ns(la.p50_ns)}  p90 {fmt_ns(la.p90_ns)}  p99 {fmt_ns(la.p99_ns)}  (n={la.count:,})",
    )
    tab.add_row(
        "queue (GPU start - call end)",
        "n/a (no launch calls linked)"
        if not lq.count
        else f"p50 {fmt_ns(lq.p50_ns)}  p90 {fmt_ns(lq.p90_ns)}  p99 {fmt_ns(lq.p99_ns)}  (n={lq.count:,})"
        + queue_below_zero(t.launch_queue_negative),
    )
    tab.add_row(
        "kernel rate",
        f"{t.kernels_per_ms:.1f} kernels/ms; {fmt_pct(t.short_kernel_share)} shorter than {fmt_ns(t.short_kernel_ns)}",
    )
    tab.add_row(
        "verdict",
        Text(f"not judged ({t.verdict_withheld})", style="bold red")
        if t.verdict_withheld
        else Text("launch-bound", style="bold red")
        if t.launch_bound
        else Text("not launch-bound"),
    )
    return tab


def _categories(a) -> Table:
    b = a.breakdown
    tab = Table(title=f"GPU time by category ({b.taxonomy} taxonomy; % of kernel+memop time)", title_justify="left")
    for col in ("category", "time", "%", "count", "mean", "ceiling if 0 s", f"if {b.speedup_factor:g}x faster"):
        tab.add_column(col, justify="left" if col == "category" else "right", no_wrap=True)
    for c in b.categories:
        ceiling = "unbounded" if c.amdahl_max_speedup is None else f"{c.amdahl_max_speedup:.2f}x"
        tab.add_row(
            c.name,
            fmt_ns(c.time_ns),
            f"{c.percent:.1f}",
            f"{c.count:,}",
            fmt_ns(c.mean_ns),
            ceiling,
            f"{c.whatif_speedup:.2f}x",
        )
    return tab


def _top_kernels(a, n: int = 10) -> Table:
    tab = Table(title="Top kernels by GPU time", title_justify="left")
    for col, just in (
        ("kernel", "left"),
        ("category", "left"),
        ("time", "right"),
        ("%", "right"),
        ("count", "right"),
        ("mean", "right"),
    ):
        tab.add_column(
            col,
            justify=cast(JustifyMethod, just),
            overflow="ellipsis",
            no_wrap=True,
            max_width=56 if col == "kernel" else None,
        )
    for k in a.breakdown.kernels[:n]:
        tab.add_row(k.name, k.category, fmt_ns(k.time_ns), f"{k.percent:.1f}", f"{k.count:,}", fmt_ns(k.mean_ns))
    return tab


def _phases(a, limit: int = 40) -> Table | None:
    ph = a.phases
    if not ph.phases or ph.source == "none":
        return None
    tab = Table(title=f"Phases (from {ph.source})", title_justify="left")
    for col in ("phase", "wall", "GPU span", "GPU busy", "kernels"):
        tab.add_column(col, justify="left" if col == "phase" else "right")
    outliers = {o.phase_index for o in ph.outliers}
    for p in ph.phases[:limit]:
        name = f"{p.name} (outlier)" if p.index in outliers else p.name
        tab.add_row(name, fmt_ns(p.wall_ns), fmt_ns(p.gpu_span_ns), fmt_ns(p.gpu_busy_ns), f"{p.kernel_count:,}")
    if len(ph.phases) > limit:
        tab.add_row(f"... {len(ph.phases) - limit} more", "", "", "", "")
    return tab


def analysis_renderables(a) -> list[Table | Text]:
    out: list[Table | Text] = [_summary(a), _categories(a), _top_kernels(a)]
    ph = _phases(a)
    if ph is not None:
        out.append(ph)
    for fam in a.phases.families:
        r2 = "n/a" if fam.r2 is None else f"{fam.r2:.2f}"
        out.append(
            Text(
                f"{fam.family}: {fam.count} steps, {fmt_ns(fam.min_ns)}..{fmt_ns(fam.max_ns)} per step, "
                f"trend {fmt_ns(fam.slope_ns_per_step)}/step (R^2 {r2})"
            )
        )
    return out


def hardware_table(rows: list[dict]) -> Table:
    tab = Table(title="Nsight Compute kernels", title_justify="left")
    cols = (
        ("name", "kernel"),
        ("duration_ns", "duration"),
        ("sm_throughput_pct", "SM %"),
        ("dram_throughput_pct", "DRAM %"),
        ("achieved_occupancy_pct", "occupancy %"),
        ("bound", "bound"),
    )
    for _, label in cols:
        tab.add_column(label, overflow="ellipsis", no_wrap=True, max_width=48 if label == "kernel" else None)
    for r in rows:
        cells = []
        for key, _ in cols:
            v = r.get(key)
            if v is None:
                cells.append("n/a")
            elif key == "duration_ns":
                cells.append(fmt_ns(v))
            elif isinstance(v, float):
                cells.append(f"{v:.1f}")
            else:
                cells.append(str(v))
        tab.add_row(*cells)
    return tab


def comparison_renderables(c: Comparison) -> list[Table | Text]:
    """A comparison (``analysis.compare``) as tables: speedups, categories, top kernels, findings."""
    a, b = c.a, c.b

    def sign(ns) -> str:
        return ("+" if ns > 0 else "-" if ns < 0 else "") + fmt_ns(abs(ns))

    def na(v) -> str:
        return "n/a" if v is None else f"{v:,}"

    out: list[Table | Text] = [
        Text(f"A = {a.label}: {a.source} ({'compiled' if a.compiled else 'eager'}: {a.compile_evidence})"),
        Text(f"B = {b.label}: {b.source} ({'compiled' if b.compiled else 'eager'}: {b.compile_evidence})"),
    ]
    if c.identical is not None:
        out.append(
            Text(
                f"The two inputs are identical (same SHA-256 {c.identical[:16]}...): every number is the "
                "same on both sides"
            )
        )
    if c.window is not None:
        out.append(
            Text(
                f"Compared: {c.window.request} ({c.window.rule}); "
                + "; ".join(
                    f"{side} {tw.start_ms:.3f}..{tw.end_ms:.3f} ms, {tw.kernels_kept} of {tw.kernels_total} kernels"
                    for side, tw in zip("AB", c.window.traces, strict=True)
                )
            )
        )
    t = Table(title="B vs A (speedup = A time / B time; > 1: B is faster)", title_justify="left")
    for col in ("metric", "A", "B", "speedup"):
        t.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for s in c.speedups:
        verdict = "identical" if c.identical else "n/a" if s.speedup is None else f"{s.speedup:.2f}x"
        t.add_row(s.metric, fmt_ns(s.a_ns), fmt_ns(s.b_ns), verdict)
    t.add_row("kernels", f"{a.kernel_count:,}", f"{b.kernel_count:,}", "")
    t.add_row("launches", na(a.launch_count), na(b.launch_count), "")
    t.add_row("GPU idle share", fmt_pct(a.idle_fraction), fmt_pct(b.idle_fraction), "")
    out.append(t)
    t = Table(title="GPU op time by category", title_justify="left")
    for col in ("category", "A", "A %", "B", "B %", "B - A"):
        t.add_column(col, justify="left" if col == "category" else "right", no_wrap=True)
    for d in c.categories:
        t.add_row(
            d.name, fmt_ns(d.a_time_ns), fmt_pct(d.a_share), fmt_ns(d.b_time_ns), fmt_pct(d.b_share), sign(d.delta_ns)
        )
    out.append(t)
    t = Table(title="Top kernels", title_justify="left")
    for col in ("kernel", "in", "A", "A runs", "B", "B runs"):
        t.add_column(col, justify="left" if col in ("kernel", "in") else "right", no_wrap=True)
    where = {"a": "only A", "b": "only B", None: "both"}
    for k in c.kernels:
        t.add_row(
            short_name(k.name, 50),
            where[k.only_in],
            fmt_ns(k.a_time_ns),
            f"{k.a_count:,}",
            fmt_ns(k.b_time_ns),
            f"{k.b_count:,}",
        )
    out.append(t)
    for f in c.findings:
        out.append(
            Text.assemble(
                (f"[{f.severity.upper()}] ", "bold"), f.title, "\n  ", f.implication, "\n  ", f.recommendation
            )
        )
    return out
