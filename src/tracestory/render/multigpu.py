"""Multi-GPU results -> the report's section, findings, JSON and a PNG.

The section follows seed 003's "multi-GPU communication timeline": one lane per GPU over one
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

from ..analysis.findings import Evidence, Finding
from ..analysis.multigpu import MultiGpu
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

COMPUTE, WAIT, COMM = "▓", "▒", "░"
BARRIER = "↑"
MIN_FILL = 0.05
MAX_LANES = 16
_KIND_TITLE = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
               "alltoall": "all-to-all", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send/recv",
               "send": "send", "recv": "recv"}


def _kind(kind: str | None) -> str:
    return _KIND_TITLE.get(kind or "", kind or "unknown")


def _gbps(bps: float | None) -> str:
    return "n/a" if bps is None else f"{bps / 1e9:.1f} GB/s"


def _gpu(rank: int) -> str:
    return f"GPU {rank}"


# ------------------------------------------------------------------ timeline


@dataclass(frozen=True, eq=False)
class Lane:
    """One rank's activity on the reference clock, for the timeline picture."""

    rank: int
    compute: tuple[np.ndarray, np.ndarray]
    comm: tuple[np.ndarray, np.ndarray]
    wait: tuple[np.ndarray, np.ndarray]   # inside collectives, before the last rank arrived


def lanes(result: MultiGpu) -> tuple[Lane, ...]:
    """Every rank's compute, communication and waiting intervals on the reference clock."""
    out = []
    for j, (r, s) in enumerate(zip(result.ranks, result.summaries)):
        off = result.alignment.offsets_ns[j]
        ws, we = [], []
        for c in result.collectives:
            if r not in c.ranks:
                continue
            i = c.ranks.index(r)
            if c.wait_ns[i] > 0:
                ws.append(c.start_ns[i])
                we.append(c.start_ns[i] + c.wait_ns[i])
        out.append(Lane(rank=r, compute=(s.compute_display[0] + off, s.compute_display[1] + off),
                        comm=(s.comm_display[0] + off, s.comm_display[1] + off),
                        wait=(np.asarray(ws, dtype=np.int64), np.asarray(we, dtype=np.int64))))
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
    title = (f"MULTI-GPU COMMUNICATION TIMELINE: {what}, {len(result.ranks)} GPUs, clocks aligned by "
             f"{al.method.replace('_', ' ')}")
    lines = [clip_text(title, width), ""]
    lines += time_axis(t0, t1, n, label_w + 2)[::-1]
    shown = lanes(result)
    if len(shown) > MAX_LANES:  # the first ranks, and the slowest one wherever it is
        keep = [ln for ln in shown if ln.rank == slow]
        keep = [ln for ln in shown if ln.rank != slow][:MAX_LANES - len(keep)] + keep
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
    legend = (f"legend: {COMPUTE} compute  {WAIT} waiting in a collective for the last GPU  {COMM} communication  "
              f"{IDLE} idle  {BARRIER} last GPU arrives (barrier)" + ("  * slowest GPU" if slow is not None else ""))
    lines += wrap_legend(legend, width)
    return [clip_text(x, width) for x in lines]


# ------------------------------------------------------------------ findings


def _late_text(s) -> str:
    return fmt_ns(s.late_mean_ns) if s.late_mean_ns is not None else "n/a"


def _main_kind(result: MultiGpu, rank: int) -> str:
    """The collective type the others spent most time waiting in for ``rank``."""
    waits: dict[str, int] = {}
    for c in result.collectives:
        if c.last_rank == rank:
            waits[c.kind] = waits.get(c.kind, 0) + c.total_wait_ns
    return _kind(max(waits, key=lambda k: (waits[k], k))) if waits else "collectives"


def _straggler_cause(result: MultiGpu, s) -> tuple[str, str]:
    """Why the straggler is late, from its per-step compute and idle time against the others'."""
    late = s.late_mean_ns or 0.0
    per_step = late * s.last_count / max(s.steps, 1)
    ce, ie, sl = s.compute_excess_mean_ns, s.idle_excess_mean_ns, s.start_late_mean_ns
    if ce is not None and ce > 0 and ce >= 0.5 * per_step:
        return (f"It has more GPU work: {fmt_ns(ce)} more compute per step than the others' mean.",
                f"Investigate {_gpu(s.rank)}'s workload imbalance: compare its kernels per step with another "
                f"GPU's (extra or larger kernels, uneven sharding, sequence lengths or expert load) and "
                f"balance the work.")
    host = max(ie or 0.0, 0.0) + max(sl or 0.0, 0.0)
    if ce is not None and host > 0:
        return (f"Its GPU does no more compute than the others ({fmt_ns(ce)} more per step) but starts its steps "
                f"{fmt_ns(sl)} later and idles {fmt_ns(ie)} more inside them: its host submits the work late.",
                f"Look at {_gpu(s.rank)}'s host side before its collectives: launch overhead, Python work, "
                f"data loading, CPU contention or core affinity (its trace's CPU ops and the largest GPU gaps); "
                f"CUDA Graphs remove the launch cost.")
    return ("Neither its compute nor its idle time stands out per step.",
            f"Compare {_gpu(s.rank)}'s timeline with another GPU's around its late collectives; check its "
            f"clocks and throttling (nvidia-smi -q -d CLOCK,PERFORMANCE).")


def headline(result: MultiGpu) -> str | None:
    """One sentence: the straggler, where the others wait, communication share and exposure."""
    parts = []
    s = result.straggler
    if s is not None:
        every = (f", in {s.steps_last} of {s.steps} steps" if s.steps_last < s.steps else ", every step") \
            if s.steps else ""
        parts.append(f"{_gpu(s.rank)} arrives last at {s.last_count} of {s.compared} collectives, "
                     f"{_late_text(s)} late on average{every}; the others wait in "
                     f"{_main_kind(result, s.rank)} ({fmt_ns(s.wait_caused_ns)} in total)")
    if result.comm_share is not None:
        basis = "step time" if result.steps else "GPU time"
        parts.append(f"communication is {fmt_pct(result.comm_share, 0)} of {basis}"
                     + (f", {fmt_pct(result.exposed_share, 0)} of it exposed" if result.exposed_share is not None else ""))
    return ("; ".join(parts) + ".") if parts else None


def multigpu_findings(result: MultiGpu) -> list[Finding]:
    """Straggler, load imbalance, communication share, clock alignment and bandwidth findings."""
    out: list[Finding] = []
    s = result.straggler
    mean_window = float(np.mean([b.window_ns for b in result.per_rank])) if result.per_rank else 0.0
    if s is not None:
        others = max(len(result.ranks) - 1, 1)
        frac = s.wait_caused_ns / others / mean_window if mean_window > 0 else 0.0
        sev = "high" if frac >= 0.1 else "medium" if frac >= 0.02 else "low"
        ev = [Evidence("last to arrive at collectives", s.last_count, "count"),
              Evidence("collectives on two or more GPUs", s.compared, "count"),
              Evidence("mean lateness when last (vs median of the others)", s.late_mean_ns, "ns"),
              Evidence("wait it caused (sum over the other GPUs)", s.wait_caused_ns, "ns"),
              Evidence("wait at all collectives (all GPUs)", s.total_wait_ns, "ns"),
              Evidence("per other GPU, share of its GPU window", frac, "fraction")]
        if s.steps:
            ev.append(Evidence("steps where it caused the most wait", s.steps_last, "count"))
            ev.append(Evidence("its compute minus the others' mean, per step", s.compute_excess_mean_ns, "ns"))
            ev.append(Evidence("its idle time minus the others' mean, per step", s.idle_excess_mean_ns, "ns"))
            ev.append(Evidence("its step start minus the others' median, mean over steps", s.start_late_mean_ns, "ns"))
        cause, rec = _straggler_cause(result, s)
        out.append(Finding(
            "multigpu_straggler", sev,
            f"{_gpu(s.rank)} is the slowest GPU: last at {s.last_count} of {s.compared} collectives, "
            f"{_late_text(s)} late on average",
            tuple(ev),
            f"A collective completes only when every GPU has joined it: the others sit in "
            f"{_main_kind(result, s.rank)} while {_gpu(s.rank)} catches up, {fmt_ns(s.wait_caused_ns)} of GPU "
            f"time in total. {cause}",
            rec))
    if result.imbalance_max is not None and result.imbalance_max >= 1.05 and len(result.ranks) > 1:
        slow = [st.slowest_rank for st in result.steps] or [max(result.per_rank, key=lambda b: b.compute_ns).rank]
        vals, counts = np.unique(slow, return_counts=True)
        top = int(vals[np.argmax(counts)])
        ev = (Evidence("max / mean compute (worst step)", result.imbalance_max, "ratio"),
              Evidence("GPU with the most compute (most often)", _gpu(top), "text"),
              Evidence("steps where it had the most compute", int(counts.max()) if result.steps else None, "count"),
              Evidence("steps", len(result.steps), "count"))
        out.append(Finding(
            "multigpu_imbalance", "medium" if result.imbalance_max >= 1.1 else "low",
            f"Load imbalance: max/mean compute per {'step' if result.steps else 'run'} reaches "
            f"{result.imbalance_max:.2f}, most on {_gpu(top)}",
            ev, "With synchronous collectives every step runs at the pace of the GPU with the most work.",
            "Balance the work per GPU (shard sizes, tokens per rank, expert placement) or overlap the "
            "collectives with independent compute."))
    if result.comm_share is not None and result.comm_share > 0:
        exposed = result.exposed_share
        cost = result.comm_share * (exposed if exposed is not None else 1.0)
        ev = (Evidence("communication share of " + ("step time" if result.steps else "GPU window"),
                       result.comm_share, "fraction"),
              Evidence("exposed share of communication (not overlapped by compute)", exposed, "fraction"),
              Evidence("waiting inside collectives (all GPUs)", sum(b.wait_ns for b in result.per_rank), "ns"))
        out.append(Finding(
            "multigpu_communication", "medium" if cost >= 0.1 else "low" if cost >= 0.02 else "info",
            f"Communication is {fmt_pct(result.comm_share)} of {'step time' if result.steps else 'the GPU window'}"
            + (f", {fmt_pct(exposed)} of it exposed" if exposed is not None else ""),
            ev, "Exposed communication adds to the step; part of it is waiting for the slowest GPU, not transfer.",
            "Overlap collectives with compute (async collectives, bucketing, sequence or tensor-parallel "
            "overlap), and remove the straggler first: its wait is paid by every other GPU."))
    al = result.alignment
    if len(result.ranks) > 1:
        bad = al.residual_median_ns is not None and al.residual_median_ns > 50_000
        out.append(Finding(
            "multigpu_clocks", "low" if bad or al.unaligned_ranks else "info",
            f"Rank clocks aligned by {al.method.replace('_', ' ')}"
            + (f", collective ends agree within {fmt_ns(al.residual_median_ns)} (median)"
               if al.residual_median_ns is not None else ""),
            (Evidence("collectives used", al.matched_collectives, "count"),
             Evidence("residual end spread, median", al.residual_median_ns, "ns"),
             Evidence("residual end spread, max", al.residual_max_ns, "ns"),
             Evidence("ranks without a shared collective", ", ".join(map(str, al.unaligned_ranks)) or "none", "text")),
            "Arrival skew and waits are measured on this common clock; their error is about the residual.",
            "Nothing to do unless the residual is large: then capture all ranks with one profiler session "
            "(nsys) or keep the traces' baseTimeNanoseconds."))
    big = [g for g in result.groups if g.busbw_median_bytes_per_s is not None and g.bytes]
    if big:
        g = max(big, key=lambda g: (g.bytes, g.count))
        out.append(Finding(
            "multigpu_bandwidth", "info",
            f"Largest {_kind(g.kind)} ({fmt_bytes(g.bytes)} {g.dtype or ''}) reaches "
            f"{_gbps(g.busbw_median_bytes_per_s)} bus bandwidth (median)",
            (Evidence("message size", g.bytes, "bytes"), Evidence("instances", g.count, "count"),
             Evidence("algorithm / protocol", f"{g.algorithm or 'n/a'} / {g.protocol or 'n/a'}", "text"),
             Evidence("transfer time, median", g.transfer_median_ns, "ns"),
             Evidence("bus bandwidth, median", _gbps(g.busbw_median_bytes_per_s), "text")),
            "Bus bandwidth (NCCL's definition) is comparable to the link's peak whatever the GPU count.",
            "Compare with the link's peak (NVLink, PCIe, network) and with nccl-tests on the same "
            "machine; small messages are latency-bound and never reach it."))
    return out


# ------------------------------------------------------------------ section


def _table(headers, rows, align):
    from .markdown import md_table

    return md_table(headers, rows, align)


def render_multigpu_section(result: MultiGpu, *, with_findings: bool = True) -> str:
    """Markdown body of the multi-GPU section (no heading of its own level 2). The full report
    lists the findings in Observations and Insights instead (``with_findings=False``)."""
    out = ["```text", *render_timeline(result), "```", ""]
    h = headline(result)
    if h:
        out += [f"**{h[:1].upper() + h[1:]}**", ""]
    al = result.alignment
    res = (f"; collective ends agree within {fmt_ns(al.residual_median_ns)} (median), "
           f"{fmt_ns(al.residual_max_ns)} (max) over {al.matched_collectives} collectives"
           if al.residual_median_ns is not None else "")
    out += [f"Clocks: {al.method.replace('_', ' ')}, reference GPU {al.reference_rank}{res}."
            + (f" Not aligned (no shared collective): {', '.join(map(_gpu, al.unaligned_ranks))}."
               if al.unaligned_ranks else ""), ""]
    rows = [(_gpu(b.rank), b.device or "n/a", fmt_ns(b.window_ns), fmt_ns(b.compute_ns), fmt_ns(b.comm_ns),
             fmt_ns(b.overlap_ns), fmt_ns(b.exposed_comm_ns), fmt_ns(b.idle_ns), fmt_ns(b.wait_ns),
             str(b.last_count), fmt_ns(b.wait_caused_ns)) for b in result.per_rank]
    out += ["#### Per GPU", ""]
    out += _table(("GPU", "device", "GPU window", "compute", "communication", "overlap", "exposed comm",
                   "idle", "waited in collectives", "last arrivals", "wait caused"), rows, "llrrrrrrrrr")
    out += [""]
    if result.groups:
        out += ["#### Collectives", ""]
        rows = []
        for g in result.groups[:20]:
            last = f"GPU {g.last_rank} ({g.last_rank_count}/{g.count})" if g.last_rank is not None else "n/a"
            skew = (f"{fmt_ns(g.skew_median_ns)} / {fmt_ns(g.skew_max_ns)}" if g.skew_median_ns is not None else "n/a")
            algo = "/".join(x for x in (g.algorithm, g.protocol) if x) or "n/a"
            rows.append((_kind(g.kind), fmt_bytes(g.bytes), g.dtype or "n/a",
                         f"{g.pg or 'n/a'} ({g.group_size or 'n/a'})", algo, str(g.count),
                         f"{fmt_ns(g.duration_min_ns)} / {fmt_ns(g.duration_median_ns)} / {fmt_ns(g.duration_max_ns)}",
                         _gbps(g.busbw_median_bytes_per_s), skew, last, fmt_ns(g.total_wait_ns)))
        out += _table(("type", "size", "dtype", "group (size)", "algorithm", "count", "duration min / median / max",
                       "busbw (median)", "skew median / max", "last GPU", "wait"), rows, "lllllrrrrlr")
        if len(result.groups) > 20:
            out += ["", f"({len(result.groups) - 20} more groups in the JSON output.)"]
        out += ["", "Duration is per GPU and instance; busbw uses the last-arriving GPU's duration (no waiting "
                "in it) and NCCL's bus-bandwidth factor; skew is the spread of arrivals (kernel starts)."]
        out += [""]
    if result.steps:
        out += ["#### Steps", ""]
        rows = []
        for st in result.steps:
            rows.append((st.name, fmt_ns(max(st.span_ns)), f"{fmt_ns(min(st.compute_ns))} / {fmt_ns(max(st.compute_ns))}",
                         f"{st.imbalance:.2f}" if st.imbalance is not None else "n/a", _gpu(st.slowest_rank),
                         fmt_pct(sum(st.comm_ns) / max(sum(st.span_ns), 1)),
                         fmt_pct(sum(st.exposed_comm_ns) / sum(st.comm_ns)) if sum(st.comm_ns) else "n/a",
                         _gpu(st.last_rank) if st.last_rank is not None else "n/a", fmt_ns(st.wait_ns)))
        out += _table(("step", "span (max)", "compute min / max", "max/mean compute", "most compute",
                       "comm share", "exposed", "last GPU", "wait"), rows, "lrrrlrrlr")
        out += [""]
    fs = multigpu_findings(result) if with_findings else []
    if fs:
        out += ["#### Findings", ""]
        out += [f"- [{f.severity.upper()}] {f.title}. {f.implication} {f.recommendation}" for f in fs]
        out += [""]
    return "\n".join(out)


# ------------------------------------------------------------------ JSON and plot


def multigpu_json(result: MultiGpu) -> dict:
    """Every result of the section in base units (ns, bytes, bytes/s); no per-rank arrays."""
    from .jsonout import jsonable

    return {
        "ranks": list(result.ranks),
        "sources": {str(r): s.source for r, s in zip(result.ranks, result.summaries)},
        "alignment": jsonable(result.alignment),
        "per_rank": jsonable(result.per_rank),
        "steps": jsonable(result.steps),
        "straggler": jsonable(result.straggler),
        "imbalance_max": jsonable(result.imbalance_max),
        "comm_share": jsonable(result.comm_share),
        "exposed_share": jsonable(result.exposed_share),
        "headline": headline(result),
        "collective_groups": jsonable(result.groups),
        "collectives": jsonable(result.collectives),
        "findings": jsonable(multigpu_findings(result)),
    }


def plot_multigpu(result: MultiGpu, path: str | Path) -> Path | None:
    """PNG: lanes per GPU over the displayed step (compute, waiting, communication, barriers)
    and per-GPU totals. None when there is no GPU activity."""
    from .plots import _pyplot, _save

    win = display_window(result)
    if win is None:
        return None
    plt = _pyplot()
    from matplotlib.patches import Patch

    t0, t1, what = win
    ls = lanes(result)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 1.2 + 0.9 * len(ls) + 3),
                                 gridspec_kw={"height_ratios": [max(len(ls), 1), 3]})
    colors = {"compute": "tab:blue", "wait": "tab:red", "comm": "tab:orange"}
    slow = result.straggler.rank if result.straggler else None
    for y, lane in enumerate(ls):
        for key, (s, e) in (("compute", lane.compute), ("comm", lane.comm), ("wait", lane.wait)):
            keep = (e > t0) & (s < t1)
            bars = [((a - t0) / 1e6, (b - a) / 1e6) for a, b in zip(s[keep], e[keep])]
            h = 0.8 if key == "compute" else 0.4
            ax.broken_barh(bars, (y - h / 2, h), color=colors[key], linewidth=0)
    for c in result.collectives:
        if c.last_rank is not None and t0 <= max(c.start_ns) < t1:
            ax.axvline((max(c.start_ns) - t0) / 1e6, color="black", linestyle=":", linewidth=0.8)
    ax.set_yticks(range(len(ls)), [_gpu(l.rank) + (" (slowest)" if l.rank == slow else "") for l in ls])
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e6)
    ax.set_xlabel(f"time (ms) from the start of the {what}, aligned clock")
    ax.legend(handles=[Patch(color=colors["compute"], label="compute"),
                       Patch(color=colors["comm"], label="communication kernel"),
                       Patch(color=colors["wait"], label="waiting for the last GPU"),
                       plt.Line2D([], [], color="black", linestyle=":", label="last GPU arrives")],
              loc="upper right", fontsize=7, ncol=4)
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
    bx.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return _save(fig, Path(path))
