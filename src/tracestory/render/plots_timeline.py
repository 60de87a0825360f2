"""The GPU timeline PNG, drawn at the resolution of the image (matplotlib, imported lazily).

Model
-----
One lane per (device, stream). The x axis runs from the first GPU op's start to the last op's
end (ms since the first op) plus a margin of :data:`MARGIN` of the span on each side. The axes are
:data:`AXES_PX` pixels wide at the save DPI, and each lane is cut into that many columns, one
pixel each. A column in which an op of the lane runs (any part of it) is painted in the colour of
the category with the most GPU time in that column; consecutive columns of one category are one
rectangle, drawn without anti-aliasing so it covers whole pixels.

So every op, and therefore every burst of GPU work, is at least one pixel wide: nothing shorter
than a pixel disappears. What is lost is said on the plot: ops closer than a pixel share it, and
a column shows one category (the one with the most time there). Phases are shaded grey behind the
lanes; the category legend sits outside the axes, right of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.facts import RunFacts
from ..units import fmt_ns
from .mpl import DPI
from .mpl import pyplot as _pyplot
from .mpl import save as _save

AXES_PX = 940  # width of the data area in output pixels
MARGIN = 0.01  # of the span, each side
LEFT_PX = 150  # room for the lane labels
RIGHT_PX = 160  # room for the legend


@dataclass(frozen=True)
class PixelLanes:
    """The drawing model: ``columns[k][j]`` is the category index painted in pixel column ``j`` of
    lane ``k`` (-1: idle); column ``j`` covers ``[x0_ns + j * px_ns, x0_ns + (j + 1) * px_ns)``."""

    x0_ns: float
    px_ns: float
    labels: tuple[str, ...]
    columns: tuple[np.ndarray, ...]


def pixel_columns(start_ns, end_ns, category, x0_ns: float, px_ns: float, n: int, n_cat: int) -> np.ndarray:
    """Per pixel column, the category with the most time of the given ops in it (-1 where none
    runs). An op of zero duration still paints the column it sits in."""
    s = (np.asarray(start_ns, dtype=np.float64) - x0_ns) / px_ns
    e = np.maximum((np.asarray(end_ns, dtype=np.float64) - x0_ns) / px_ns, s + 1e-9)  # zero-length ops count
    cat = np.asarray(category, dtype=np.int64)
    c0 = np.clip(np.floor(s).astype(np.int64), 0, n - 1)
    c1 = np.clip(np.ceil(e).astype(np.int64) - 1, 0, n - 1)  # end exclusive
    c1 = np.maximum(c1, c0)
    time = np.zeros((n + 1, n_cat))
    one = c0 == c1
    np.add.at(time, (c0[one], cat[one]), e[one] - s[one])
    many = ~one  # first and last column partly, the columns between in full (a difference array)
    np.add.at(time, (c0[many], cat[many]), (c0[many] + 1) - s[many])
    np.add.at(time, (c1[many], cat[many]), e[many] - c1[many])
    full = np.zeros((n + 1, n_cat))
    np.add.at(full, (c0[many] + 1, cat[many]), 1.0)
    np.add.at(full, (c1[many], cat[many]), -1.0)
    time += np.cumsum(full, axis=0)
    touched = np.zeros(n + 1, dtype=np.int64)
    np.add.at(touched, c0, 1)
    np.add.at(touched, c1 + 1, -1)
    on = np.cumsum(touched)[:n] > 0
    best = np.argmax(time[:n], axis=1)
    return np.where(on, best, -1)


def pixel_lanes(f: RunFacts, *, width_px: int = AXES_PX) -> PixelLanes:
    """The lanes of one run at ``width_px`` columns (see the module docstring)."""
    g = f.gpu_ops
    t0, t1 = int(g.start_ns.min()), int(g.end_ns.max())
    span = max(t1 - t0, 1)
    x0 = t0 - MARGIN * span
    px = span * (1 + 2 * MARGIN) / width_px
    pairs = [tuple(map(int, p)) for p in np.unique(np.stack([g.device, g.stream], axis=1), axis=0)]
    cols = []
    for dev, stream in pairs:
        on = (g.device == dev) & (g.stream == stream)
        cols.append(pixel_columns(g.start_ns[on], g.end_ns[on], g.category[on], x0, px, width_px, len(g.categories)))
    return PixelLanes(x0, px, tuple(f"GPU {d} stream {s}" for d, s in pairs), tuple(cols))


def _runs(cols: np.ndarray) -> list[tuple[int, int, int]]:
    """(first column, width, category) of each run of equal painted columns."""
    edges = np.flatnonzero(np.diff(np.concatenate([[-2], cols, [-2]])) != 0)
    return [(int(a), int(b - a), int(cols[a])) for a, b in zip(edges[:-1], edges[1:], strict=True) if cols[a] >= 0]


def draw_timeline(f: RunFacts):
    """The figure (not saved): lanes of pixel columns, phases shaded, legend right of the axes."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    a = f.analysis
    t0 = int(f.gpu_ops.start_ns.min())
    model = pixel_lanes(f)
    cats = f.gpu_ops.categories
    cmap = plt.get_cmap("tab20")
    colors = {i: cmap(i % 20) for i in range(len(cats))}
    n = len(model.labels)
    height_px = int(DPI * (0.55 + 0.5 * n)) + 90
    fig = plt.figure(figsize=((LEFT_PX + AXES_PX + RIGHT_PX) / DPI, height_px / DPI), dpi=DPI)
    ax = fig.add_axes((LEFT_PX / fig.bbox.width, 70 / height_px, AXES_PX / fig.bbox.width, 1 - 110 / height_px))
    to_ms = 1e-6
    x0_ms = (model.x0_ns - t0) * to_ms
    px_ms = model.px_ns * to_ms
    used: set[int] = set()
    for y, cols in enumerate(model.columns):
        by_cat: dict[int, list[tuple[float, float]]] = {}
        for c, w, cat in _runs(cols):
            by_cat.setdefault(cat, []).append((x0_ms + c * px_ms, w * px_ms))
        for cat, bars in sorted(by_cat.items()):
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colors[cat], edgecolors="none", antialiased=False)
            used.add(cat)
    for p in a.phases.phases if a.phases.source != "none" else ():
        if p.gpu_start_ns is not None and p.gpu_end_ns is not None:
            ax.axvspan((p.gpu_start_ns - t0) * to_ms, (p.gpu_end_ns - t0) * to_ms, color="0.9", zorder=0, lw=0)
    ax.set_xlim(x0_ms, x0_ms + AXES_PX * px_ms)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), model.labels)
    ax.set_xlabel(
        f"time since first GPU op (ms); 1 pixel = {fmt_ns(model.px_ns)}: an op shorter than a pixel is drawn "
        "1 pixel wide, a pixel shows the category with the most time in it",
        fontsize=8,
    )
    ax.legend(
        handles=[Patch(color=colors[c], label=cats[c]) for c in sorted(used)],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0,
        fontsize=8,
        title="category",
    )
    ax.set_title(f"GPU timeline (grey: phases) — {a.trace.label}", fontsize=10)
    return fig


def plot_timeline(f: RunFacts, path: Path) -> Path:
    """Lanes per (device, stream), one pixel column at a time (see the module docstring)."""
    assert f.analysis.timeline is not None and len(f.gpu_ops), "plot_timeline needs a trace with GPU ops"
    return _save(draw_timeline(f), path)
