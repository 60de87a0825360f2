"""Memory over time as an ASCII chart (<= 100 columns) and a PNG, from
:func:`tracestory.analysis.memory.memory_timeline`.

ASCII model: the samples' span is cut into equal time bins, one per column; a column's height is
the largest allocated (``█``) and reserved (``░``, reserved by the caching allocator but in no
tensor) value inside its bin (``analyze.memory.binned``: the value carried into the bin counts,
so a short spike still shows). The value axis starts at 0 unless the smallest allocated value is
above half the peak: then it starts at a round value below it and the axis label says so (a
1.03 -> 1.10 GiB swing would be invisible from 0). The peak column is marked ``^`` with what ran
then (phase, CPU op, kernel).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from .ascii import clip_text, fmt_bytes, fmt_ns, time_axis
from .md import short_name
from .mpl import pyplot, save

WIDTH = 100
HEIGHT = 10
MIN_CHART_SAMPLES = 20  # fewer samples than this are listed, not drawn
ALLOC, RESERVED = "█", "░"
_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))


def _unit(top: float) -> tuple[str, int]:
    return next(((u, s) for u, s in _UNITS if top >= s), ("B", 1))


def _nice_floor(v: float, span: float) -> float:
    """A round value at or below ``v`` (a multiple of a 1/2/5 step near span/5)."""
    if span <= 0:
        return v
    mag = 10 ** math.floor(math.log10(span / 5))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= span / 5)
    return math.floor(v / step) * step


def peak_text(d) -> str:
    """``peak allocated X at +T: phase P, CPU op O, kernel K`` for one device."""
    p = d.at_peak
    bits = []
    if p.phase:
        bits.append(f"phase {p.phase}")
    if p.cpu_op:
        bits.append(f"CPU op {p.cpu_op}")
    elif p.cpu_range:
        bits.append(f"CPU range {p.cpu_range}")
    if p.kernel_active:
        bits.append(f"GPU running {short_name(p.kernel_active, 40)}")
    elif p.kernel_next:
        bits.append(f"GPU idle, next {short_name(p.kernel_next, 40)}")
    return f"peak allocated {fmt_bytes(d.peak_allocated_bytes)} at +{fmt_ns(d.peak_allocated_ts_ns - d.start_ns)}" + (
        ": " + ", ".join(bits) if bits else ""
    )


def render_memory_ascii(d, *, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    """Chart lines for one :class:`~tracestory.analysis.memory.DeviceMemory`."""
    alloc = np.array([b.max_allocated_bytes for b in d.bins], dtype=np.float64)
    res = np.array([b.max_reserved_bytes for b in d.bins], dtype=np.float64) if d.reserved_bytes is not None else None
    hi = float(max(alloc.max(), res.max() if res is not None else 0.0, 1.0))
    unit, scale = _unit(hi)
    low_alloc = float(alloc[alloc >= 0].min()) if (alloc >= 0).any() else 0.0
    lo = (
        0.0
        if low_alloc < 0.5 * hi
        else max(0.0, _nice_floor(low_alloc * 0.98 / scale, (hi - low_alloc) / scale) * scale)
    )
    top = hi + (hi - lo) * 0.05
    label_w = 9
    n_bins = len(d.bins)
    n = min(width - label_w - 2, max(n_bins, 10))
    # column j shows bins [starts[j], starts[j+1]) (or repeats a bin when bins are fewer)
    cols = np.minimum((np.arange(n) * n_bins) // n, n_bins - 1)
    starts = np.unique(cols) if n_bins >= n else cols
    a_col = np.maximum.reduceat(alloc, starts) if n_bins >= n else alloc[cols]
    r_col = None
    if res is not None:
        r_col = np.maximum.reduceat(res, starts) if n_bins >= n else res[cols]
    n = len(a_col)
    title = f"GPU {d.device} memory over time ({unit})" + (
        f", value axis from {lo / scale:g} {unit}, not 0" if lo > 0 else ""
    )
    lines = [title]
    label_rows = {0: top, height // 2: (top + lo) / 2, height - 1: lo}
    for r in range(height):
        level = lo + (top - lo) * (height - r - 0.5) / height
        row = np.full(n, " ", dtype=object)
        if r_col is not None:
            row[r_col >= level] = RESERVED
        row[a_col >= level] = ALLOC
        lab = f"{label_rows[r] / scale:.3g}" if r in label_rows else ""
        tick = "┤" if r in label_rows else "│"
        lines.append(f"{lab:>{label_w - 1}} {tick}" + "".join(row).rstrip())
    t0, t1 = d.start_ns, max(d.end_ns, d.start_ns + 1)
    # the peak's column: the column holding the bin that holds the peak sample
    # (same edges as analyze.memory.binned)
    edges = t0 + (t1 - t0) * np.arange(n_bins + 1, dtype=np.float64) / n_bins
    peak_bin = int(np.clip(np.searchsorted(edges, d.peak_allocated_ts_ns, side="right") - 1, 0, n_bins - 1))
    col = int(np.searchsorted(starts, peak_bin, side="right") - 1)
    mark = "^ peak allocated"
    pad = col if col + len(mark) <= n else max(0, col - len(mark) + 1)
    if pad != col:
        mark = "peak allocated ^"
    lines.append(" " * (label_w + 1) + " " * pad + mark)
    lines += time_axis(t0, t1, n, label_w + 1)
    legend = f"legend: {ALLOC} allocated"
    if r_col is not None:
        legend += f"  {RESERVED} reserved by the caching allocator, not allocated"
    lines.append(legend)
    lines.append(f"        each column: the largest value in its time bin, {unit}; time from the first sample")
    wrapped = [w for f in memory_facts(d) for w in textwrap.wrap(f, width, subsequent_indent="  ")]
    return [clip_text(x, width) for x in lines + wrapped]


def memory_facts(d) -> list[str]:
    """One device's memory numbers, a sentence each: the peak and what ran then, the samples,
    reserved vs allocated, the share of device memory."""
    facts = [peak_text(d)]
    facts.append(
        f"samples {d.sample_count}: {d.alloc_count} allocations, {d.free_count} frees; "
        f"allocated {fmt_bytes(d.first_allocated_bytes)} at the start, "
        f"{fmt_bytes(d.last_allocated_bytes)} at the end"
    )
    if d.peak_reserved_bytes is not None:
        facts.append(
            f"peak reserved {fmt_bytes(d.peak_reserved_bytes)}; largest reserved minus allocated "
            f"{fmt_bytes(d.max_unused_reserved_bytes)}"
        )
        if d.fragmentation_at_peak is not None and d.fragmentation_mean is not None:
            facts.append(
                f"reserved / allocated: {d.fragmentation_at_peak:.2f}x at the allocated peak, "
                f"{d.fragmentation_mean:.2f}x time-weighted mean"
            )
    if d.total_memory_bytes:
        facts.append(
            f"device memory {fmt_bytes(d.total_memory_bytes)}: peak allocated is "
            f"{100 * d.peak_allocated_share:.1f}% of it"
        )
    if d.allocated_from_deltas:
        facts.append("allocated rebuilt from allocation deltas (the trace has no totals)")
    return facts


def memory_section(mt, *, width: int = WIDTH) -> list[str]:
    """Markdown lines for the memory timeline: one sentence per device and its fenced chart;
    ``n/a`` with the reason when there are no GPU memory samples."""
    if mt is None or not mt.devices:
        return [
            (
                "Memory usage over time: n/a (no GPU memory samples; capture with torch.profiler "
                "profile_memory=True or nsys --cuda-memory-usage=true)"
            ),
            "",
        ]
    level = (
        "allocated and reserved"
        if mt.has_reserved
        else "bytes held through cudaMalloc; this source has no reserved figure"
    )
    out = [f"GPU memory over time from {mt.source} ({level}):", ""]
    for d in mt.devices[:8]:
        if d.sample_count < MIN_CHART_SAMPLES:
            out += [
                f"Memory usage timeline of GPU {d.device}: n/a as a chart ({d.sample_count} samples, too few to "
                "draw over time); the numbers:",
                "",
            ]
            out += [f"- {f}" for f in memory_facts(d)] + [""]
            continue
        out += ["```text", *render_memory_ascii(d, width=width), "```", ""]
    if len(mt.devices) > 8:
        out += [f"({len(mt.devices) - 8} more devices not drawn)", ""]
    return out


def plot_memory(mt, path: Path, *, title: str = "") -> Path | None:
    """PNG: per device, allocated and reserved over time (step lines), the peak annotated with
    what ran then. ``None`` when there is nothing to draw."""
    if mt is None or not mt.devices:
        return None
    plt = pyplot()
    devs = mt.devices[:8]
    fig, axes = plt.subplots(len(devs), 1, figsize=(10, 3.2 * len(devs)), squeeze=False)
    for ax, d in zip(axes[:, 0], devs, strict=False):
        unit, scale = _unit(float(max(d.peak_allocated_bytes, d.peak_reserved_bytes or 0, 1)))
        x = (d.ts_ns - d.start_ns) / 1e6
        ax.step(x, d.allocated_bytes / scale, where="post", label="allocated", color="tab:blue")
        if d.reserved_bytes is not None:
            ax.step(x, d.reserved_bytes / scale, where="post", color="tab:orange", label="reserved (caching allocator)")
            ax.fill_between(
                x,
                d.allocated_bytes / scale,
                d.reserved_bytes / scale,
                step="post",
                color="tab:orange",
                alpha=0.2,
                label="reserved, not allocated",
            )
        px = (d.peak_allocated_ts_ns - d.start_ns) / 1e6
        ax.annotate(
            clip_text(peak_text(d), 110),
            xy=(px, d.peak_allocated_bytes / scale),
            xytext=(0.2, 0.55),
            textcoords="axes fraction",
            fontsize=7,
            arrowprops={"arrowstyle": "->", "color": "0.3"},
        )
        ax.set_ylabel(f"GPU {d.device} memory ({unit})")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time since the first memory sample (ms)")
    axes[0, 0].set_title(f"Device memory over time{' — ' + title if title else ''}")
    return save(fig, path)
