"""Results -> PNG figures (matplotlib, imported lazily: the ``plots`` extra).

One figure per question the report answers: where the GPU time goes (category breakdown),
when the GPU works (timeline lanes per stream, coloured by category, phases shaded), how the
steps compare (per-phase GPU span vs busy time), and how device memory moves (allocated and
reserved over time, peak annotated with the phase running then). Each figure has axis labels
with units, a legend and a title naming the trace. Files are named
``<stem>_<figure>[_<n>].png``; the function returns their paths in report order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analyze.links import gpu_ops_column
from ..errors import ToolNotFound


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ToolNotFound("matplotlib", "pip install 'tracestory[plots]' to write PNG plots") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Deterministic output: no timestamps or software version in the PNG metadata.
    plt.rcParams["svg.hashsalt"] = "tracestory"
    return plt


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


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


def plot_timeline(a, path: Path) -> Path:
    """Lanes per (device, stream); each op a bar coloured by category; phases shaded."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    tr, cls = a.trace, a.classification
    t0 = a.timeline.start_ns
    cats = cls.taxonomy.categories
    colors = _colors(cats)
    ops = [(tr.kernels, cls.kernel_category), (tr.memops, cls.memop_category)]
    pairs = np.stack([gpu_ops_column(tr, "device"), gpu_ops_column(tr, "stream")], axis=1)
    lanes = [tuple(map(int, p)) for p in np.unique(pairs, axis=0)]
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.5 * len(lanes)))
    for y, (dev, stream) in enumerate(lanes):
        for table, cat in ops:
            on = (table["device"] == dev) & (table["stream"] == stream)
            if not on.any():
                continue
            starts = (table["start_ns"][on] - t0) / 1e6
            widths = np.maximum((table["end_ns"][on] - table["start_ns"][on]) / 1e6, 1e-4)
            ax.broken_barh(list(zip(starts, widths, strict=True)), (y - 0.4, 0.8),
                           facecolors=[colors[cats[c]] for c in cat[on]])
    for p in a.phases.phases if a.phases.source != "none" else ():
        if p.gpu_start_ns is not None:
            ax.axvspan((p.gpu_start_ns - t0) / 1e6, (p.gpu_end_ns - t0) / 1e6, color="0.9", zorder=0)
    ax.set_yticks(range(len(lanes)), [f"GPU {d} stream {s}" for d, s in lanes])
    ax.set_xlabel("time since first GPU op (ms)")
    used = [c for c in cats if any((cat == cats.index(c)).any() for _, cat in ops)]
    ax.legend(handles=[Patch(color=colors[c], label=c) for c in used], loc="center left",
              bbox_to_anchor=(1.01, 0.5), fontsize=8, title="category")
    ax.set_title(f"GPU timeline (grey: phases) — {tr.label}")
    return _save(fig, path)


def plot_phases(a, path: Path) -> Path | None:
    plt = _pyplot()
    ph = [p for p in a.phases.phases if p.gpu_span_ns is not None]
    if len(ph) < 2:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(ph) + 2), 3.5))
    x = np.arange(len(ph))
    ax.bar(x, [p.gpu_span_ns / 1e6 for p in ph], color="0.75", label="GPU span (first op start to last op end)")
    ax.bar(x, [p.gpu_busy_ns / 1e6 for p in ph], color="tab:blue", label="GPU busy (union of ops)")
    ax.set_xticks(x, [p.name for p in ph], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("time (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"Per-phase GPU span vs busy time — {a.trace.label}")
    return _save(fig, path)


def plot_memory(a, path: Path) -> Path | None:
    plt = _pyplot()
    m = a.trace.memory
    on_gpu = m["device"] >= 0
    if not on_gpu.any():
        return None
    ts, alloc, res = m["ts_ns"][on_gpu], m["allocated_bytes"][on_gpu], m["reserved_bytes"][on_gpu]
    t0 = int(ts[0])
    fig, ax = plt.subplots(figsize=(10, 3.5))
    gib = float(1 << 30)
    ax.step((ts - t0) / 1e6, alloc / gib, where="post", label="allocated")
    ax.step((ts - t0) / 1e6, res / gib, where="post", label="reserved (caching allocator)")
    i = int(np.argmax(alloc))
    when = _phase_at(a, int(ts[i]))
    ax.annotate(f"peak {alloc[i] / gib:.2f} GiB" + (f" in {when}" if when else ""),
                xy=((ts[i] - t0) / 1e6, alloc[i] / gib), xytext=(10, -25), textcoords="offset points",
                arrowprops={"arrowstyle": "->"}, fontsize=8)
    ax.set_xlabel("time since first memory sample (ms)")
    ax.set_ylabel("device memory (GiB)")
    ax.legend(fontsize=8)
    ax.set_title(f"Device memory over time — {a.trace.label}")
    return _save(fig, path)


def _phase_at(a, ts: int) -> str | None:
    for p in a.phases.phases:
        if p.start_ns <= ts < p.end_ns and a.phases.source != "none":
            return p.name
    return None


def write_plots(analyses, out_dir: Path, *, stem: str = "report") -> list[Path]:
    """Write every applicable figure for every analysis; returns the paths written."""
    out: list[Path] = []
    for i, a in enumerate(analyses):
        suffix = f"_{i}" if len(analyses) > 1 else ""
        out.append(plot_breakdown(a, out_dir / f"{stem}_breakdown{suffix}.png"))
        if a.timeline is not None:
            out.append(plot_timeline(a, out_dir / f"{stem}_timeline{suffix}.png"))
        for fn, name in ((plot_phases, "phases"), (plot_memory, "memory")):
            p = fn(a, out_dir / f"{stem}_{name}{suffix}.png")
            if p is not None:
                out.append(p)
    return out
