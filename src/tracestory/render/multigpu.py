"""Multi-GPU results -> the report's section, findings, JSON and a PNG.

The section is the report format's "multi-GPU communication timeline": one lane per GPU over one
step (the last step common to every rank, else the whole run) on the aligned clock, each column
showing what dominated that slice of time: compute, waiting inside a collective for the last
GPU, or communication proper; the arrival of the last GPU at each collective (the point where
the collective can proceed: the barrier) is marked under the lanes and the slowest GPU is
called out. Then a per-GPU table, the per-collective table (grouped by type, size, dtype,
group and algorithm) and per-step balance. Every number comes from the
:class:`~tracestory.analysis.multigpu.MultiGpu` result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.multigpu import MultiGpu
from ..units import collective_title as _kind
from ..units import fmt_gbps as _gbps
from ..units import gpu_label as _gpu
from .ascii import (
    IDLE,
    WIDTH,
    clip_text,
    coverage,
    fmt_bytes,
    fmt_ns,
    fmt_pct,
    time_axis,
    wrap_legend,
)
from .jsonable import jsonable
from .md import md_table
from .mpl import pyplot, save

COMPUTE, WAIT, COMM = "▓", "▒", "░"
BARRIER = "↑"
MIN_FILL = 0.05
MAX_LANES = 16
# ------------------------------------------------------------------ timeline


@dataclass(frozen=True, eq=False)
class Lane:
    """One rank's activity on the reference clock, for the timeline picture."""

    rank: int
    compute: tuple[np.ndarray, np.ndarray]
    comm: tuple[np.ndarray, np.ndarray]
    wait: tuple[np.ndarray, np.ndarray]  # inside collectives, before the last rank arrived


def lanes(result: MultiGpu) -> tuple[Lane, ...]:
    """Every rank's compute, communication and waiting intervals on the reference clock."""
    out = []
    for j, (r, s) in enumerate(zip(result.ranks, result.summaries, strict=False)):
        off = result.alignment.offsets_ns[j]
        ws, we = [], []
        for c in result.collectives:
            if r not in c.ranks:
                continue
            i = c.ranks.index(r)
            if c.wait_ns[i] > 0:
                ws.append(c.start_ns[i])
                we.append(c.start_ns[i] + c.wait_ns[i])
        out.append(
            Lane(
                rank=r,
                compute=(s.compute_display[0] + off, s.compute_display[1] + off),
                comm=(s.comm_display[0] + off, s.comm_display[1] + off),
                wait=(np.asarray(ws, dtype=np.int64), np.asarray(we, dtype=np.int64)),
            )
        )
    return tuple(out)


def display_window(result: MultiGpu) -> tuple[int, int, str] | None:
    """The span the timeline shows, on the reference clock: the last step common to every
    rank, or the whole run when there are no steps. ``(start, end, what)``; None when empty."""
    off = result.alignment.offsets_ns
    if result.steps:
        st = result.steps[-1]
        return min(st.start_ns), max(st.end_ns), f"step {st.name}"
    lo = [s.window_start_ns + off[j] for j, s in enumerate(result.summaries) if s.window_start_ns is not None]
    hi = [s.window_end_ns + off[j] for j, s in enumerate(result.summaries) if s.window_end_ns is not None]
    return (min(lo), max(hi), "whole trace") if lo else None


def render_timeline(result: MultiGpu, width: int = WIDTH) -> list[str]:
    """The lanes chart (lines of at most ``width`` columns)."""
    win = display_window(result)
    if win is None:
        return ["(no GPU activity)"]
    t0, t1, what = win
    t1 = max(t1, t0 + 1)
    slow = result.straggler.rank if result.straggler else None
    label_w = max(len(_gpu(r)) + 2 for r in result.ranks)
    label_w = max(label_w, len("barrier"))
    n = max(10, width - label_w - 2)
    edges = t0 + (t1 - t0) * np.arange(n + 1, dtype=np.float64) / n
    bin_w = (t1 - t0) / n
    al = result.alignment
    title = (
        f"MULTI-GPU COMMUNICATION TIMELINE: {what}, {len(result.ranks)} GPUs, clocks aligned by "
        f"{al.method.replace('_', ' ')}"
    )
    lines = [clip_text(title, width), ""]
    lines += time_axis(t0, t1, n, label_w + 2)[::-1]
    shown = lanes(result)
    if len(shown) > MAX_LANES:  # the first ranks, and the slowest one wherever it is
        keep = [ln for ln in shown if ln.rank == slow]
        keep = [ln for ln in shown if ln.rank != slow][: MAX_LANES - len(keep)] + keep
        hidden = len(shown) - len(keep)
        shown = tuple(sorted(keep, key=lambda ln: ln.rank))
    else:
        hidden = 0
    for lane in shown:
        comp = coverage(*lane.compute, edges)
        comm = coverage(*lane.comm, edges)
        wait = np.minimum(coverage(*lane.wait, edges), comm)
        xfer = comm - wait
        stack = np.stack([comp, wait, xfer])
        row = np.array([COMPUTE, WAIT, COMM], dtype=object)[stack.argmax(axis=0)]
        row[stack.sum(axis=0) < MIN_FILL * bin_w] = IDLE
        mark = " *" if lane.rank == slow else ""
        lines.append(f"{_gpu(lane.rank) + mark:<{label_w}} │{''.join(row)}")
    bar = [" "] * n
    for c in result.collectives:
        if c.last_rank is None:
            continue
        t = max(c.start_ns)
        if t0 <= t < t1:
            bar[min(int((t - t0) / bin_w), n - 1)] = BARRIER
    if BARRIER in bar:
        lines.append(f"{'barrier':<{label_w}}  {''.join(bar).rstrip()}")
    if hidden:
        lines.append(f"({hidden} more GPUs not drawn: see the per-GPU table)")
    legend = (
        f"legend: {COMPUTE} compute  {WAIT} waiting in a collective for the last GPU  {COMM} communication  "
        f"{IDLE} idle  {BARRIER} last GPU arrives (barrier)" + ("  * slowest GPU" if slow is not None else "")
    )
    lines += wrap_legend(legend, width)
    return [clip_text(x, width) for x in lines]


# ------------------------------------------------------------------ section


def _table(headers, rows, align):
    return md_table(headers, rows, align)


def render_multigpu_section(result: MultiGpu, findings=()) -> str:
    """Markdown body of the multi-GPU section (no heading of its own level 2), with ``findings``
    (:func:`~tracestory.analysis.findings.multigpu.multigpu_findings`) at its end. The full report
    lists them in Observations and Insights instead (and passes none here)."""
    out = ["```text", *render_timeline(result), "```", ""]
    h = result.headline
    if h:
        out += [f"**{h[:1].upper() + h[1:]}**", ""]
    al = result.alignment
    res = (
        f"; collective ends agree within {fmt_ns(al.residual_median_ns)} (median), "
        f"{fmt_ns(al.residual_max_ns)} (max) over {al.matched_collectives} collectives"
        if al.residual_median_ns is not None
        else ""
    )
    out += [
        f"Clocks: {al.method.replace('_', ' ')}, reference GPU {al.reference_rank}{res}."
        + (
            f" Not aligned (no shared collective): {', '.join(map(_gpu, al.unaligned_ranks))}."
            if al.unaligned_ranks
            else ""
        ),
        "",
    ]
    rows = [
        (
            _gpu(b.rank),
            b.device or "n/a",
            fmt_ns(b.window_ns),
            fmt_ns(b.compute_ns),
            fmt_ns(b.comm_ns),
            fmt_ns(b.overlap_ns),
            fmt_ns(b.exposed_comm_ns),
            fmt_ns(b.idle_ns),
            fmt_ns(b.wait_ns),
            str(b.last_count),
            fmt_ns(b.wait_caused_ns),
        )
        for b in result.per_rank
    ]
    out += ["#### Per GPU", ""]
    out += _table(
        (
            "GPU",
            "device",
            "GPU window",
            "compute",
            "communication",
            "overlap",
            "exposed comm",
            "idle",
            "waited in collectives",
            "last arrivals",
            "wait caused",
        ),
        rows,
        "llrrrrrrrrr",
    )
    out += [""]
    if result.groups:
        out += ["#### Collectives", ""]
        rows = []
        for g in result.groups[:20]:
            last = f"GPU {g.last_rank} ({g.last_rank_count}/{g.count})" if g.last_rank is not None else "n/a"
            skew = f"{fmt_ns(g.skew_median_ns)} / {fmt_ns(g.skew_max_ns)}" if g.skew_median_ns is not None else "n/a"
            algo = "/".join(x for x in (g.algorithm, g.protocol) if x) or "n/a"
            rows.append(
                (
                    _kind(g.kind),
                    fmt_bytes(g.bytes),
                    g.dtype or "n/a",
                    f"{g.pg or 'n/a'} ({g.group_size or 'n/a'})",
                    algo,
                    str(g.count),
                    f"{fmt_ns(g.duration_min_ns)} / {fmt_ns(g.duration_median_ns)} / {fmt_ns(g.duration_max_ns)}",
                    _gbps(g.busbw_median_bytes_per_s),
                    skew,
                    last,
                    fmt_ns(g.total_wait_ns),
                )
            )
        out += _table(
            (
                "type",
                "size",
                "dtype",
                "group (size)",
                "algorithm",
                "count",
                "duration min / median / max",
                "busbw (median)",
                "skew median / max",
                "last GPU",
                "wait",
            ),
            rows,
            "lllllrrrrlr",
        )
        if len(result.groups) > 20:
            out += ["", f"({len(result.groups) - 20} more groups in the JSON output.)"]
        out += [
            "",
            "Duration is per GPU and instance; busbw uses the last-arriving GPU's duration (no waiting "
            "in it) and NCCL's bus-bandwidth factor; skew is the spread of arrivals (kernel starts).",
        ]
        out += [""]
    if result.steps:
        out += ["#### Steps", ""]
        step_rows = []
        for st in result.steps:
            step_rows.append(
                (
                    st.name,
                    fmt_ns(max(st.span_ns)),
                    f"{fmt_ns(min(st.compute_ns))} / {fmt_ns(max(st.compute_ns))}",
                    f"{st.imbalance:.2f}" if st.imbalance is not None else "n/a",
                    _gpu(st.slowest_rank),
                    fmt_pct(sum(st.comm_ns) / max(sum(st.span_ns), 1)),
                    fmt_pct(sum(st.exposed_comm_ns) / sum(st.comm_ns)) if sum(st.comm_ns) else "n/a",
                    _gpu(st.last_rank) if st.last_rank is not None else "n/a",
                    fmt_ns(st.wait_ns),
                )
            )
        out += _table(
            (
                "step",
                "span (max)",
                "compute min / max",
                "max/mean compute",
                "most compute",
                "comm share",
                "exposed",
                "last GPU",
                "wait",
            ),
            step_rows,
            "lrrrlrrlr",
        )
        out += [""]
    fs = list(findings)
    if fs:
        out += ["#### Findings", ""]
        out += [f"- [{f.severity.upper()}] {f.title}. {f.implication} {f.recommendation}" for f in fs]
        out += [""]
    return "\n".join(out)


# ------------------------------------------------------------------ JSON and plot


def multigpu_json(result: MultiGpu, findings=()) -> dict:
    """Every result of the section in base units (ns, bytes, bytes/s); no per-rank arrays."""
    return {
        "ranks": list(result.ranks),
        "sources": {str(r): s.source for r, s in zip(result.ranks, result.summaries, strict=False)},
        "alignment": jsonable(result.alignment),
        "per_rank": jsonable(result.per_rank),
        "steps": jsonable(result.steps),
        "straggler": jsonable(result.straggler),
        "imbalance_max": jsonable(result.imbalance_max),
        "comm_share": jsonable(result.comm_share),
        "exposed_share": jsonable(result.exposed_share),
        "headline": result.headline,
        "collective_groups": jsonable(result.groups),
        "collectives": jsonable(result.collectives),
        "findings": jsonable(list(findings)),
    }


def plot_multigpu(result: MultiGpu, path: str | Path) -> Path | None:
    """PNG: lanes per GPU over the displayed step (compute, waiting, communication, barriers)
    and per-GPU totals. None when there is no GPU activity."""
    win = display_window(result)
    if win is None:
        return None
    plt = pyplot()
    from matplotlib.patches import Patch

    t0, t1, what = win
    ls = lanes(result)
    fig, (ax, bx) = plt.subplots(
        2, 1, figsize=(11, 1.2 + 0.9 * len(ls) + 3), gridspec_kw={"height_ratios": [max(len(ls), 1), 3]}
    )
    colors = {"compute": "tab:blue", "wait": "tab:red", "comm": "tab:orange"}
    slow = result.straggler.rank if result.straggler else None
    for y, lane in enumerate(ls):
        for key, (s, e) in (("compute", lane.compute), ("comm", lane.comm), ("wait", lane.wait)):
            keep = (e > t0) & (s < t1)
            bars = [((a - t0) / 1e6, (b - a) / 1e6) for a, b in zip(s[keep], e[keep], strict=False)]
            h = 0.8 if key == "compute" else 0.4
            ax.broken_barh(bars, (y - h / 2, h), color=colors[key], linewidth=0)
    for c in result.collectives:
        if c.last_rank is not None and t0 <= max(c.start_ns) < t1:
            ax.axvline((max(c.start_ns) - t0) / 1e6, color="black", linestyle=":", linewidth=0.8)
    ax.set_yticks(range(len(ls)), [_gpu(x.rank) + (" (slowest)" if x.rank == slow else "") for x in ls])
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e6)
    ax.set_xlabel(f"time (ms) from the start of the {what}, aligned clock")
    ax.legend(
        handles=[
            Patch(color=colors["compute"], label="compute"),
            Patch(color=colors["comm"], label="communication kernel"),
            Patch(color=colors["wait"], label="waiting for the last GPU"),
            plt.Line2D([], [], color="black", linestyle=":", label="last GPU arrives"),
        ],
        loc="upper left",  # right of the lanes, never over them
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0,
        fontsize=7,
    )
    ax.set_title(f"Multi-GPU timeline ({len(ls)} GPUs, clocks: {result.alignment.method.replace('_', ' ')})")
    ranks = [_gpu(b.rank) for b in result.per_rank]
    comp = np.array([b.compute_ns for b in result.per_rank]) / 1e6
    exp = np.array([b.exposed_comm_ns for b in result.per_rank]) / 1e6
    wait = np.array([b.wait_ns for b in result.per_rank]) / 1e6
    idle = np.array([b.idle_ns for b in result.per_rank]) / 1e6
    bx.bar(ranks, comp, color=colors["compute"], label="compute")
    bx.bar(ranks, exp, bottom=comp, color=colors["comm"], label="exposed communication (incl. waiting)")
    bx.bar(ranks, idle, bottom=comp + exp, color="lightgray", label="idle")
    bx.scatter(ranks, wait, color=colors["wait"], marker="_", s=400, zorder=3, label="waited in collectives")
    bx.set_ylabel("ms over the whole trace")
    bx.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return save(fig, Path(path))
