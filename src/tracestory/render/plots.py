"""Results -> PNG figures (matplotlib, imported lazily: the ``plots`` extra).

One figure per question the report answers: where the GPU time goes (category breakdown),
when the GPU works (timeline lanes per stream, coloured by category, phases shaded), how the
steps compare (per-phase GPU span vs busy time), how device memory moves (allocated and
reserved over time per device, peak annotated with what ran then: ``report.memory``), what warps
wait on (stall reasons per Nsight Compute kernel), where kernels sit on the roofline (ncu
counters, or the estimate from op shapes) and how clocks and power moved (GPU telemetry, the
traced window shaded: :func:`plot_telemetry`). Each figure has axis labels with units, a legend
and a title naming the trace. Files are named ``<stem>_<figure>[_<n>].png``;
:func:`write_plots` (per trace) and :func:`write_hardware_plots` (ncu rows, or the estimated
roofline) return their paths in report order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..units import fmt_ns
from .jsonable import jsonable
from .md import short_name
from .memory import plot_memory as _plot
from .mpl import pyplot as _pyplot
from .mpl import save as _save
from .plots_timeline import plot_timeline


def _colors(categories) -> dict[str, tuple]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab20")
    return {c: cmap(i % 20) for i, c in enumerate(categories)}


def plot_breakdown(a, path: Path) -> Path:
    plt = _pyplot()
    cats = a.breakdown.categories
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(cats), 3) + 1.2))
    names = [c.name for c in cats][::-1]
    ms = [c.time_ns / 1e6 for c in cats][::-1]
    colors = _colors(a.classification.taxonomy.categories)
    bars = ax.barh(names, ms, color=[colors[n] for n in names])
    for bar, c in zip(bars, cats[::-1], strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {c.percent:.1f}%", va="center", fontsize=8)
    ax.set_xlabel("GPU time (ms, sum of kernel + memop durations)")
    ax.set_title(f"GPU time by category — {a.trace.label}")
    ax.margins(x=0.15)
    return _save(fig, path)


MAX_PHASE_LABELS = 34


def plot_phases(a, path: Path) -> Path | None:
    plt = _pyplot()
    ph = [p for p in a.phases.phases if p.gpu_span_ns is not None]
    if len(ph) < 2:
        return None
    # At most 14 inches wide: past ~34 phases the bars get thinner and only every n-th name is
    # written (288 steps drew an 8,871-pixel-wide figure before).
    fig, ax = plt.subplots(figsize=(min(14, max(6, 0.35 * len(ph) + 2)), 3.5))
    x = np.arange(len(ph))
    ax.bar(x, [p.gpu_span_ns / 1e6 for p in ph], color="0.75", label="GPU span (first op start to last op end)")
    ax.bar(x, [p.gpu_busy_ns / 1e6 for p in ph], color="tab:blue", label="GPU busy (union of ops)")
    every = max(1, -(-len(ph) // MAX_PHASE_LABELS))
    ax.set_xticks(x[::every], [p.name for p in ph][::every], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("time (ms)")
    ax.set_yscale("log")
    # outside the axes, right of them: the bars fill the plot, no place inside is free
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(f"Per-phase GPU span vs busy time — {a.trace.label}")
    return _save(fig, path)


def plot_memory(run, path: Path) -> Path | None:
    """Allocated and reserved GPU memory over time, per device, of one run's memory timeline
    (``render.memory.plot_memory``: the same series and peak annotation as the ASCII chart)."""

    return _plot(run.memory, path, title=run.trace.label)


def plot_warp_stalls(rows, path: Path, *, top: int = 4, title: str = "") -> Path | None:
    """Horizontal bars of each stall reason's share of stall cycles, one panel per kernel (the
    ``top`` longest Nsight Compute kernels that carry stall metrics). ``rows``: the ``kernels[]``
    JSON rows of ``render.jsonout.kernel_rows``. ``None`` without stall metrics."""
    rows = [r for r in rows or () if r.get("warp_stall_pct")]
    rows = sorted(rows, key=lambda r: (-(r.get("duration_ns") or 0), str(r.get("name"))))[:top]
    if not rows:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(9, 0.3 * sum(min(len(r["warp_stall_pct"]), 10) + 3 for r in rows)), squeeze=False
    )
    for ax, r in zip(axes[:, 0], rows, strict=False):
        items = sorted(r["warp_stall_pct"].items(), key=lambda kv: (-kv[1], kv[0]))
        shown = [(k, v) for k, v in items if v >= 1.0][:9]
        rest = sum(v for k, v in items if (k, v) not in shown)
        if rest > 0:
            shown.append(("others", rest))
        labels = [k for k, _ in shown][::-1]
        vals = [v for _, v in shown][::-1]
        bars = ax.barh(labels, vals, color="tab:red")
        for b, v in zip(bars, vals, strict=False):
            ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v:.1f}%", va="center", fontsize=7)
        ax.set_xlim(0, max(vals) * 1.15)
        dur = r.get("duration_ns")
        ax.set_title(short_name(str(r.get("name")), 70) + (f" ({fmt_ns(dur)})" if dur else ""), fontsize=9)
        ax.tick_params(labelsize=8)
    axes[-1, 0].set_xlabel("% of stall cycles ('selected', the issuing cycle, is not a stall)")
    fig.suptitle(f"Warp stall reasons (Nsight Compute){' — ' + title if title else ''}", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _placeable(p) -> bool:
    ai, f = p.get("arithmetic_intensity"), p.get("achieved_flops_per_s")
    return ai is not None and f is not None and np.isfinite(ai) and ai > 0 and f > 0


def _label_groups(xy, decades: float = 0.15) -> list[list[int]]:
    """Indices of points grouped when they lie within ``decades`` (log10) of a group's first point
    on both axes, in point order."""
    groups: list[list[int]] = []
    anchors: list[tuple[float, float]] = []
    for i, (x, y) in enumerate(xy):
        lx, ly = np.log10(max(x, 1e-30)), np.log10(max(y, 1e-30))
        for g, (ax_, ay) in zip(groups, anchors, strict=False):
            if abs(lx - ax_) <= decades and abs(ly - ay) <= decades:
                g.append(i)
                break
        else:
            groups.append([i])
            anchors.append((lx, ly))
    return groups


ROOF_MARGIN = 0.25  # decades of room around the points, on each side of both log axes


def roofline_limits(pts, roofs) -> tuple[float, float, float, float]:
    """Axis limits ``(x_lo, x_hi, y_lo, y_hi)`` of a roofline from its points: the points' range
    of arithmetic intensity and of FLOP/s, widened by :data:`ROOF_MARGIN` decades each side, the
    top raised to the highest roof over that intensity range (the room between a point and its
    roof is what the chart shows). ``roofs``: ``(peak FLOP/s, bandwidth B/s)`` pairs."""
    m = 10**ROOF_MARGIN
    ai = np.array([p["arithmetic_intensity"] for p in pts], dtype=np.float64)
    fl = np.array([p["achieved_flops_per_s"] for p in pts], dtype=np.float64)
    x_lo, x_hi = float(ai.min()) / m, float(ai.max()) * m
    top = max([float(fl.max())] + [min(peak, x_hi * bw) for peak, bw in roofs])
    return x_lo, x_hi, float(fl.min()) / m, top * m


def plot_roofline(points, path: Path, *, title: str = "", estimate: bool = False) -> Path | None:
    """Log-log roofline: the DRAM roof and one compute roof per precision used, each kernel a
    point (arithmetic intensity, achieved FLOP/s) coloured by its bound. ``points``: roofline
    point dicts (``kernels[].roofline`` rows, or ``roofline_estimate.points`` of the JSON), or
    rows holding one under ``"roofline"``. ``None`` when no point can be placed."""
    pts = [p.get("roofline") if "roofline" in p else p for p in points or ()]
    pts = [p for p in pts if p and _placeable(p)]
    if not pts:
        return None
    pts = sorted(pts, key=lambda p: (-(p.get("duration_ns") or 0), str(p.get("label"))))[:12]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    roofs: dict[str, tuple[float, float]] = {}
    for p in pts:
        peak, ridge = p.get("peak_flops_per_s"), p.get("ridge_flop_per_byte")
        if peak and ridge and p.get("roof_dtype"):
            roofs.setdefault(p["roof_dtype"], (peak, peak / ridge))
    lo, hi, y_lo, y_hi = roofline_limits(pts, list(roofs.values()))
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    for i, (dt, (peak, bw)) in enumerate(sorted(roofs.items())):
        ax.plot(
            x,
            np.minimum(peak, x * bw),
            color="0.3",
            lw=1.2,
            ls=("-", "--", ":", "-.")[i % 4],
            label=f"{dt} roof {peak / 1e12:.0f} TFLOP/s, DRAM {bw / 1e12:.2f} TB/s, ridge {peak / bw:.0f} FLOP/B",
        )
    colors = {"memory": "tab:blue", "compute": "tab:red", None: "tab:gray"}
    for p in pts:
        ax.scatter(
            p["arithmetic_intensity"],
            p["achieved_flops_per_s"],
            color=colors.get(p.get("bound"), "tab:gray"),
            zorder=3,
            s=30,
        )
    # Points closer than ~0.15 decades share one label ("1,2,4"), so numbers never sit on each other.
    for group in _label_groups([(p["arithmetic_intensity"], p["achieved_flops_per_s"]) for p in pts]):
        first = pts[group[0]]
        ax.annotate(
            ",".join(str(i + 1) for i in group),
            (first["arithmetic_intensity"], first["achieved_flops_per_s"]),
            xytext=(5, 4),
            textcoords="offset points",
            fontsize=8,
        )
    names = [
        f"{i}: {short_name(str(p.get('label')), 44)} ({p.get('bound') or 'n/a'}"
        + (f", {p['pct_of_roof']:.0f}% of roof)" if p.get("pct_of_roof") is not None else ")")
        for i, p in enumerate(pts, 1)
    ]
    ax.text(1.02, 1.0, "\n".join(names), transform=ax.transAxes, va="top", fontsize=7, family="monospace")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_xlim(lo, hi)
    ax.set_ylim(y_lo, y_hi)
    if roofs:  # under the kernel list, outside the axes: never over a point
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(1.02, 0.0), borderaxespad=0)
    kind = "estimated from op shapes, not counters" if estimate else "Nsight Compute counters"
    ax.set_title(f"Roofline ({kind}){' — ' + title if title else ''}", fontsize=10)
    return _save(fig, path)


def write_hardware_plots(hardware_rows, runs, out_dir: Path, *, stem: str = "report") -> list[Path]:
    """The hardware figures: with Nsight Compute rows, the warp-stall distribution and the
    roofline of the profiled kernels; without them, each trace's roofline estimated from op
    shapes (when its GPU's peaks are known). Returns the paths written."""
    out: list[Path] = []
    if hardware_rows:
        for fn, name in ((plot_warp_stalls, "warp_stalls"), (plot_roofline, "roofline")):
            p = fn(hardware_rows, out_dir / f"{stem}_{name}.png")
            if p is not None:
                out.append(p)
        return out

    runs = list(runs)
    for i, run in enumerate(runs):
        if run.roofline_estimate is None:
            continue
        suffix = f"_{i}" if len(runs) > 1 else ""
        p = plot_roofline(
            [jsonable(q) for q in run.roofline_estimate.points],
            out_dir / f"{stem}_roofline{suffix}.png",
            title=run.trace.label,
            estimate=True,
        )
        if p is not None:
            out.append(p)
    return out


def write_plots(runs, out_dir: Path, *, stem: str = "report") -> list[Path]:
    """Write every applicable figure for every run (``Results.runs``); returns the paths written."""
    out: list[Path] = []
    runs = list(runs)
    for i, run in enumerate(runs):
        a = run.analysis
        suffix = f"_{i}" if len(runs) > 1 else ""
        out.append(plot_breakdown(a, out_dir / f"{stem}_breakdown{suffix}.png"))
        if a.timeline is not None and len(run.facts.gpu_ops):
            out.append(plot_timeline(run.facts, out_dir / f"{stem}_timeline{suffix}.png"))
        for p in (
            plot_phases(a, out_dir / f"{stem}_phases{suffix}.png"),
            plot_memory(run, out_dir / f"{stem}_memory{suffix}.png"),
        ):
            if p is not None:
                out.append(p)
    return out


def plot_telemetry(t, path: Path) -> Path | None:
    """SM clock (MHz) and power (W) per GPU over the whole telemetry (``Results.telemetry``),
    the traced window shaded; None without two samples."""
    log = t.log
    if log.n_samples < 2:
        return None
    plt = _pyplot()
    origin = int(log.t_unix_ns[0])
    x = (log.t_unix_ns - origin) / 1e9
    fig, (ax_clk, ax_pow) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    for g, dev in enumerate(log.devices):
        lab = f"GPU {dev.get('index', g)}"
        ax_clk.step(x, log.readings["sm_mhz"][g], where="post", label=f"{lab} SM")
        ax_clk.step(x, log.readings["mem_mhz"][g], where="post", linestyle=":", label=f"{lab} memory")
        ax_pow.step(x, log.readings["power_w"][g], where="post", label=lab)
    if t.window_unix_ns is not None:
        w0, w1 = ((w - origin) / 1e9 for w in t.window_unix_ns)
        for ax in (ax_clk, ax_pow):
            ax.axvspan(w0, w1, color="tab:orange", alpha=0.15, label="traced window" if ax is ax_clk else None)
    ax_clk.set_ylabel("clock (MHz)")
    ax_pow.set_ylabel("power (W)")
    ax_pow.set_xlabel("time since the first sample (s)")
    ax_clk.set_title("GPU clocks and power (sample and hold)")
    for ax in (ax_clk, ax_pow):  # right of the axes: the lines span the whole width
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)
