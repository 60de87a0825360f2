"""ASCII chart primitives for the Markdown report: unit formatting, a horizontal bar chart,
a lanes timeline and a log-scale axis.

Every chart is a list of lines no wider than ``width`` columns (default 100), made of
characters that are one column wide in a monospace font (ASCII plus the box-drawing and block
characters ``│ ─ █ ░ ·``), so a chart inside a Markdown code fence keeps its shape.

Timeline model: the window ``[t0, t1)`` is cut into ``n`` equal bins, one per column. For each lane
and category the covered time inside every bin is computed exactly from the intervals (coverage
function ``C(t) = Σ clip(t - s_i, 0, e_i - s_i)`` evaluated at the bin edges with two
``searchsorted`` + cumulative sums, so no Python loop over intervals). A column shows the glyph of
the category with the most covered time in that bin; a bin that is less than ``min_fill`` covered
shows ``░`` (some activity) or the idle glyph ``·`` (none). Intervals shorter than a bin therefore
still show up when they dominate their bin, and a bin mostly idle reads as idle: the chart is a
picture of where time goes, not of every kernel.

Limits: one glyph per column, so a bin shows only its dominant category.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from ..units import clip_text, fmt_bytes, fmt_ms, fmt_ns, fmt_pct
from ..units import fmt_count as _num
from ..units import sig as _sig

__all__ = ["clip_text", "fmt_bytes", "fmt_ms", "fmt_ns", "fmt_pct"]

WIDTH = 100
IDLE = "·"
TRACE = "░"
FULL = "█"
PARTIAL = "▌"
# Fallback glyphs when a category's own letters are taken.
SPARE_GLYPHS = "#%@+&*=$~0123456789"


def category_glyphs(categories: Sequence[str]) -> tuple[str, ...]:
    """One distinct one-column glyph per category, deterministic: the name's first letter in
    upper case if free, else its other letters (upper, then lower), else a spare symbol.
    ``other`` gets ``o`` so the eye skips it."""
    taken: set[str] = {IDLE, TRACE}
    out = []
    for name in categories:
        letters = [c for c in name if c.isalnum()]
        cands = [c.upper() for c in letters] + [c.lower() for c in letters] + list(SPARE_GLYPHS)
        if name == "other":
            cands = ["o"] + cands
        g = next((c for c in cands if c not in taken), "?")
        taken.add(g)
        out.append(g)
    return tuple(out)


# ---------------------------------------------------------------- bar chart


class Bar(msgspec.Struct, frozen=True):
    label: str
    value: float  # the quantity the bar length is proportional to (e.g. ns)
    text: str  # what is printed after the bar (e.g. "12.3 ms  45.6%")


def bar_chart(
    bars: Sequence[Bar],
    *,
    width: int = WIDTH,
    title: str | None = None,
    max_value: float | None = None,
    footer: Sequence[str] = (),
) -> list[str]:
    """Horizontal bars: ``label │█████▌     text``. Bar length is linear in ``value`` with the
    largest value (or ``max_value``) filling the bar area; half cells are drawn with ``▌``."""
    lines: list[str] = [title] if title else []
    if not bars:
        return lines + ["(no data)"] + list(footer)
    label_w = min(max(len(b.label) for b in bars), 24)
    text_w = max(len(b.text) for b in bars)
    bar_w = max(10, width - label_w - text_w - 4)
    top = max_value if max_value is not None else max(b.value for b in bars)
    for b in bars:
        halves = 0 if top <= 0 else int(round(2 * bar_w * max(b.value, 0.0) / top))
        bar = FULL * (halves // 2) + (PARTIAL if halves % 2 else "")
        lines.append(f"{clip_text(b.label, label_w):<{label_w}} │{bar:<{bar_w}} {b.text}")
    lines.extend(footer)
    return [clip_text(line, width) for line in lines]


# ---------------------------------------------------------------- timeline


class Lane(msgspec.Struct, frozen=True):
    label: str
    starts: np.ndarray  # int64 ns
    ends: np.ndarray  # int64 ns
    category: np.ndarray  # int index into the chart's category list, one per interval


def coverage(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Covered time of the intervals inside each bin ``[edges[j], edges[j+1])``.

    Overlapping intervals count twice (callers pass one lane's intervals, or accept that);
    vectorized through the coverage function at the edges.
    """
    s = np.sort(np.asarray(starts, dtype=np.float64))
    e = np.sort(np.asarray(ends, dtype=np.float64))
    t = np.asarray(edges, dtype=np.float64)
    cs = np.concatenate([[0.0], np.cumsum(s)])
    ce = np.concatenate([[0.0], np.cumsum(e)])
    ks = np.searchsorted(s, t, side="left")
    ke = np.searchsorted(e, t, side="left")
    # C(t) = Σ_{s_i < t} (t - s_i) - Σ_{e_i < t} (t - e_i)
    c = (ks * t - cs[ks]) - (ke * t - ce[ke])
    return np.diff(c)


def time_axis(t0: int, t1: int, n: int, indent: int) -> list[str]:
    """Two lines: tick marks and labels for ``n`` columns spanning ``[t0, t1)``, in the unit
    that fits the span (named at the left), ticks at a round step (1, 2 or 5 x 10^k)."""
    span = max(t1 - t0, 1)
    unit_ns, unit = _unit_for(span)
    raw = span / 8
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    ticks = np.arange(0, span + 1, step)
    ticks_line = ["─"] * n
    label_line = [" "] * n
    for tick in ticks:
        col = int(round((n - 1) * tick / span)) if n > 1 else 0
        ticks_line[col] = "┼" if 0 < col < n - 1 else "├" if col == 0 else "┤"
        lab = _sig(tick / unit_ns, 3) if tick else "0"
        pos = max(0, min(col - len(lab) // 2, n - len(lab)))
        if all(c == " " for c in label_line[max(0, pos - 1) : pos + len(lab) + 1]):
            label_line[pos : pos + len(lab)] = list(lab)
    head = f"({unit})"
    return [" " * indent + "".join(ticks_line), f"{head:>{max(indent - 1, len(head))}} " + "".join(label_line).rstrip()]


def _unit_for(span_ns: float) -> tuple[float, str]:
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if span_ns >= 2 * scale:
            return scale, unit
    return 1.0, "ns"


def lanes_timeline(
    lanes: Sequence[Lane],
    categories: Sequence[str],
    t0: int,
    t1: int,
    *,
    width: int = WIDTH,
    hotspot: tuple[int, str] | None = None,
    markers: Sequence[tuple[str, np.ndarray, Sequence[str]]] = (),
    min_fill: float = 0.05,
    title: str | None = None,
) -> list[str]:
    """A lane per row over the time axis ``[t0, t1)``.

    ``lanes``: GPU streams (or anything with categorized intervals). ``categories``: names
    indexed by ``Lane.category``; the legend lists those that appear with their glyph.
    ``markers``: extra lanes of labelled segments, e.g. phases: ``(label, starts_ends, names)``
    where ``starts_ends`` is an ``(m, 2)`` array; each segment is drawn as ``[`` at its start,
    then its name's first letter. ``hotspot``: ``(time_ns, text)`` marked with ``^`` under
    the lanes.
    """
    glyphs = category_glyphs(categories)
    label_w = max([len(x.label) for x in lanes] + [len(m[0]) for m in markers] + [4])
    label_w = min(label_w, 14)
    n = max(10, width - label_w - 3)
    edges = t0 + (t1 - t0) * np.arange(n + 1, dtype=np.float64) / n
    bin_w = (t1 - t0) / n
    lines: list[str] = [title] if title else []
    used: set[int] = set()

    for label, segs, names in markers:
        row = [" "] * n
        segs = np.asarray(segs, dtype=np.float64).reshape(-1, 2)
        for (s, e), name in zip(segs, names, strict=False):
            c0 = int(np.clip((s - t0) / bin_w, 0, n - 1))
            c1 = int(np.clip(math.ceil((e - t0) / bin_w), c0 + 1, n))
            fill = name[:1] or "?"
            row[c0:c1] = [fill] * (c1 - c0)
            row[c0] = "["
        lines.append(f"{clip_text(label, label_w):<{label_w}} │{''.join(row)}")

    for lane in lanes:
        cats = np.asarray(lane.category)
        present = np.unique(cats) if cats.size else np.array([], dtype=int)
        cover = np.zeros((len(present), n))
        for i, c in enumerate(present):
            m = cats == c
            cover[i] = coverage(lane.starts[m], lane.ends[m], edges)
        cells = np.full(n, IDLE, dtype=object)
        if len(present):
            best = cover.argmax(axis=0)
            filled = cover.sum(axis=0) >= min_fill * bin_w
            glyph_of = np.array([glyphs[c] for c in present], dtype=object)
            cells[filled] = glyph_of[best[filled]]
            # Bins with some activity below min_fill: visible, but not mistaken for busy.
            cells[~filled & (cover.sum(axis=0) > 0)] = TRACE
            used.update(int(present[b]) for b in np.unique(best[filled]))
        lines.append(f"{clip_text(lane.label, label_w):<{label_w}} │{''.join(cells)}")

    if hotspot is not None:
        col = int(np.clip((hotspot[0] - t0) / bin_w, 0, n - 1))
        text = f"^ {hotspot[1]}"
        if col + len(text) <= n:
            mark = " " * col + text
        else:  # label to the left of the caret when it would run past the edge
            text = f"{hotspot[1]} ^"
            mark = " " * max(0, col - len(text) + 1) + text
        lines.append(" " * (label_w + 2) + mark)
    lines.extend(time_axis(t0, t1, n, label_w + 2))
    legend = [f"{glyphs[c]}={categories[c]}" for c in sorted(used)]
    legend += [f"{TRACE}=ops < {min_fill:.0%} of the bin", f"{IDLE}=idle"]
    lines.extend(wrap_legend("legend: " + "  ".join(legend), width))
    return [clip_text(line, width) for line in lines]


def wrap_legend(text: str, width: int) -> list[str]:
    """A legend whose entries are separated by two spaces, wrapped at ``width`` columns between
    entries; continuation lines are indented under the first entry."""
    out, cur = [], ""
    for word in text.split("  "):
        if cur and len(cur) + 2 + len(word) > width:
            out.append(cur)
            cur = "        " + word
        else:
            cur = f"{cur}  {word}" if cur else word
    return out + [cur] if cur else out


# ---------------------------------------------------------------- log axis


def log_position(values: np.ndarray, lo: float, hi: float, n: int) -> np.ndarray:
    """Column (0..n-1) of each value on a log10 axis from ``lo`` to ``hi``; values are
    clipped into the range (non-positive values land in column 0)."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (np.log10(np.clip(v, lo, hi)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    x = np.where(np.isfinite(x), x, 0.0)
    return np.clip(np.floor(x * n), 0, n - 1).astype(np.int64)


def log_axis(lo_ns: float, hi_ns: float, n: int, indent: int = 0) -> list[str]:
    """Tick and label lines for a log10 axis of durations: a tick at every power of ten
    inside ``[lo_ns, hi_ns]``, labelled in the unit that fits it (``1 us``, ``10 us``...)."""
    ticks = [" "] * n
    labels = [" "] * (n + 8)
    first = math.ceil(math.log10(lo_ns))
    last = math.floor(math.log10(hi_ns))
    for p in range(first, last + 1):
        col = int(log_position(np.array([10.0**p]), lo_ns, hi_ns, n)[0])
        ticks[col] = "┼"
        lab = fmt_ns(10**p, digits=1).replace(" ", "")
        pos = max(0, min(col - len(lab) // 2, n + 8 - len(lab)))
        if all(c == " " for c in labels[max(0, pos - 1) : pos + len(lab) + 1]):
            labels[pos : pos + len(lab)] = list(lab)
    return [" " * indent + "".join("─" if c == " " else c for c in ticks), " " * indent + "".join(labels).rstrip()]


def log_histogram(
    values_ns: np.ndarray,
    *,
    width: int = WIDTH,
    height: int = 6,
    title: str | None = None,
    weights: np.ndarray | None = None,
    ylabel: str = "count",
) -> list[str]:
    """A column histogram of durations on a log10 time axis (e.g. kernel durations).

    Each column is a log bin; bar height is the count (or the ``weights`` sum) in the bin,
    scaled to ``height`` rows. Returns [] for no positive values.
    """
    v = np.asarray(values_ns, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = v > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return []
    lo = 10 ** math.floor(math.log10(v.min()))
    hi = 10 ** math.ceil(math.log10(v.max() * 1.0001))
    indent = 9
    n = max(10, width - indent - 2)
    counts = np.bincount(log_position(v, lo, hi, n), weights=w, minlength=n)
    top = counts.max()
    lines: list[str] = [title] if title else []
    levels = np.ceil(counts / top * height).astype(int) if top > 0 else np.zeros(n, int)
    for r in range(height, 0, -1):
        row = "".join(FULL if lv >= r else " " for lv in levels)
        tag = _num(top) if r == height else ""
        lines.append(f"{tag:>{indent - 1}} │{row}".rstrip())
    lines.extend(log_axis(lo, hi, n, indent=indent + 1))
    lines.append(" " * indent + f"(log scale; bar height = {ylabel} per bin, max {_num(top)})")
    return [clip_text(line, width) for line in lines]


def queue_below_zero(n: int) -> str:
    """The note on launch queue times below zero: ops the GPU started before their launch call
    returned (an idle GPU, or clocks aligned imperfectly); "" when there are none."""
    return f"; {n:,} below 0: started before the call returned" if n else ""
