"""Markdown body of ``## Hardware Behavior Analysis`` and its ASCII charts (<= 100 columns).

Everything shown comes from the report's :class:`~tracestory.analysis.results.Results`: each
Nsight Compute input's records, roofline points and per-kernel interpretations
(``Results.hardware``), or without ncu input each trace's roofline estimated from op shapes
(``RunResults.roofline_estimate``); a missing number prints ``n/a``. Output is deterministic
(no clocks, no dict-order surprises: rows are sorted).
"""

from __future__ import annotations

import math

from ..specs import peaks_warning
from ..units import clip_text, fmt_ns, fmt_si

_MARKS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _na(v, fmt="{:.1f}", unit="") -> str:
    return "n/a" if v is None else fmt.format(v) + unit


# ------------------------------------------------------------------------- warp stalls
def render_warp_stalls_ascii(kernel_metrics_row, width: int = 100) -> str:
    """Horizontal bars: each stall reason's share of stall cycles for one kernel."""
    k = kernel_metrics_row
    title = f"Warp stall reasons, % of stall cycles: {clip_text(k.name, width - 41)}"
    if not k.warp_stall_pct:
        return title + "\n  n/a: this input has no warp-stall metrics (the details page lacks them)"
    rows = sorted(((v, r) for r, v in k.warp_stall_pct.items() if v >= 0.5), key=lambda x: (-x[0], x[1]))
    rest = sum(v for v in k.warp_stall_pct.values() if v < 0.5)
    label_w = max([len(r) for _, r in rows] + [len("others (<0.5% each)")]) + 2
    bar_w = max(10, width - label_w - 8)
    top = rows[0][0] if rows else 1.0
    lines = [title]
    for v, r in rows + ([(rest, "others (<0.5% each)")] if rest > 0 else []):
        n = round(bar_w * v / top) if top > 0 else 0
        lines.append(f"  {r:<{label_w - 2}}{'#' * n} {v:5.1f}%")
    lines.append(
        f"  legend: # = {top / bar_w:.2f}% of stall cycles (longest bar = {top:.1f}%); "
        "'selected' (issuing) is not a stall"
    )
    return "\n".join(line[:width] for line in lines)


# -------------------------------------------------------------------------- roofline
def _placeable(p) -> bool:
    return (
        p.arithmetic_intensity is not None
        and math.isfinite(p.arithmetic_intensity)
        and p.arithmetic_intensity > 0
        and p.achieved_flops_per_s
    )


def render_roofline_ascii(roofline, peaks, width: int = 100) -> str:
    """Log-log roofline: the DRAM roof, one flat roof per precision used, kernels as letters."""
    pts = list(roofline.points)
    head = "Roofline (log-log)" + (" - ESTIMATE from op shapes, not counters" if roofline.estimate else "")
    if peaks is None:
        return head + "\n  n/a: no peak FLOP/s or bandwidth for this GPU (pass --peaks FILE)"
    placed = [p for p in pts if _placeable(p)]
    dtypes = sorted({p.roof_dtype for p in placed if p.roof_dtype})
    if not placed or not dtypes:
        dtypes = dtypes or [d for d in ("bf16", "fp32") if peaks.flops(d)][:1]
    roofs = [(d, peaks.flops(d)) for d in dtypes if peaks.flops(d)]
    bw = peaks.dram_bytes_per_s
    xs = [p.arithmetic_intensity for p in placed] + [r / bw for _, r in roofs]
    ys = [p.achieved_flops_per_s for p in placed] + [r for _, r in roofs]
    x0 = math.floor(math.log10(min(xs)))
    x1 = max(math.ceil(math.log10(max(xs))), x0 + 2)
    if x1 - math.log10(max(xs)) < 0.3:
        x1 += 1  # keep the rightmost point and the ridge off the border
    y0 = math.floor(math.log10(min(ys)))
    y1 = max(math.log10(max(ys)) + 0.2, y0 + 2)
    lab_w, H = 9, 18
    W = width - lab_w - 2
    grid = [[" "] * W for _ in range(H)]

    def col(ai):
        return round((math.log10(ai) - x0) / (x1 - x0) * (W - 1))

    def row(f):
        return H - 1 - round((math.log10(f) - y0) / (y1 - y0) * (H - 1))

    for c in range(W):  # roofs: min(peak, AI * bw) per precision
        ai = 10 ** (x0 + c / (W - 1) * (x1 - x0))
        for i, (_, peak) in enumerate(roofs):
            r = row(min(peak, ai * bw))
            if 0 <= r < H and grid[r][c] == " ":
                grid[r][c] = "/" if ai * bw < peak else ("=" if i == 0 else "-")
    for i, p in enumerate(placed[: len(_MARKS)]):
        r, c = row(p.achieved_flops_per_s), col(p.arithmetic_intensity)
        if 0 <= r < H and 0 <= c < W:
            grid[r][c] = "*" if grid[r][c] in _MARKS else _MARKS[i]
    labels = {row(10.0**e): fmt_si(10.0**e, "", digits=1) for e in range(y0, math.floor(y1) + 1)}
    lines = [head, "FLOP/s"]
    for r in range(H):
        lines.append(f"{labels.get(r, ''):>{lab_w}}|" + "".join(grid[r]).rstrip())
    axis = [" "] * W
    ticks = [" "] * W
    for e in range(x0, x1 + 1):
        c = col(10**e)
        axis[min(c, W - 1)] = "+"
        text = f"{10.0**e:g}"
        start = max(0, min(c - len(text) // 2, W - len(text)))
        if all(ch == " " for ch in ticks[max(0, start - 1) : start + len(text) + 1]):
            ticks[start : start + len(text)] = text
    lines.append(" " * lab_w + "+" + "".join(axis))
    lines.append(" " * (lab_w + 1) + "".join(ticks).rstrip())
    lines.append(" " * (lab_w + 1) + "arithmetic intensity (FLOP per DRAM byte)")
    lines.append(f"legend: / = DRAM roof {bw / 1e12:.2f} TB/s; * = several kernels in one cell")
    for i, (d, r) in enumerate(roofs):
        lines.append(
            f"        {'=' if i == 0 else '-'} = {d} roof {fmt_si(r, 'FLOP/s')}, "
            f"ridge point at AI {r / bw:.0f} FLOP/byte"
        )
    for i, p in enumerate(placed[: len(_MARKS)]):
        lines.append(
            f"  {_MARKS[i]} {clip_text(p.label, 44):44} AI {p.arithmetic_intensity:8.3g} "
            f"{fmt_si(p.achieved_flops_per_s, 'FLOP/s'):>13} {p.bound or 'n/a'}"
            f" {_na(p.pct_of_roof, '{:.0f}', '% of roof')}"
        )
    for p in pts:
        if not _placeable(p):
            why = (
                "no FLOP counters"
                if p.flops is None
                else ("no FLOPs counted" if not p.flops else "no DRAM bytes or time")
            )
            lines.append(f"  - {clip_text(p.label, 60)}: not placed ({why})")
    lines.append(f"peaks: {clip_text(peaks.source, width - 7)}")
    return "\n".join(line[:width] for line in lines)


# --------------------------------------------------------------------------- section
def _block(title: str, rows: list[str], notes) -> list[str]:
    out = [f"**{title}**", ""] + [f"- {r}" for r in rows]
    out += [f"- _{n}_" for n in notes] if notes else ["- _no rule fired on these numbers_"]
    return out + [""]


def hardware_section(hardware) -> str:
    """The section body for every Nsight Compute input (``Results.hardware``), each after the
    warning of unknown peaks when its GPU has none."""
    return "\n".join(
        (f"_{h.peaks_warning}_\n\n" if h.peaks_warning else "") + render_hardware_section(h) for h in hardware
    )


def render_hardware_section(h) -> str:
    """Markdown body for one Nsight Compute input (a ``KernelMetricsResults``; no heading line)."""
    km, join, roofline, peaks, analysis = h.metrics, h.join, h.roofline, h.peaks, h.kernels
    by_id = {k.id: k for k in km.kernels}
    points = {p.kernel_id: p for p in roofline.points} if roofline is not None else {}
    dev = km.device_name or "unknown GPU"
    out = [
        f"Source: `{km.source_path}` ({km.source_format}, {len(km)} kernels, {dev}). "
        f"Top {len(analysis)} kernels by "
        + ("share of the trace's GPU time." if join is not None and join.matched else "ncu duration.")
        + (
            " This export has no gpu__time_duration: durations are the SMs' elapsed cycles over their clock "
            "rate (sm__cycles_elapsed.avg / .per_second)."
            if any(k.duration_derived for k in km.kernels)
            else ""
        ),
        "",
    ]
    if join is not None:
        amb = f", {join.candidates} equally good alignments" if join.ambiguous else ""
        out += [
            (
                f"Join to the trace: {join.matched}/{len(km)} kernels matched by name and launch order"
                f"{' (in order' + amb + ')' if join.aligned else ' (by name only)'}."
            ),
            "",
        ]
    if peaks is None:
        out += ["Peaks: n/a for this GPU; roofline percentages are n/a.", ""]
    for h in analysis:
        k = by_id[h.kernel_id]
        p = points.get(k.id)
        out += [
            f"### `{clip_text(k.name, 90)}`",
            "",
            f"Verdict: {h.verdict}.",
            "",
            (
                f"Launch: grid={k.grid or 'n/a'}, block={k.block or 'n/a'}, registers/thread "
                f"{_na(k.registers_per_thread, '{}')}, shared memory static "
                f"{_na(k.static_shared_mem_bytes, '{}', ' B')}"
                f" + dynamic {_na(k.dynamic_shared_mem_bytes, '{}', ' B')}, waves/SM {_na(k.waves_per_sm, '{:.2f}')}, "
                f"duration {fmt_ns(k.duration_ns)}."
            ),
            "",
        ]
        limits = ", ".join(
            f"{lab} {_na(getattr(k, f), '{:.0f}')}"
            for lab, f in (
                ("registers", "occupancy_limit_registers"),
                ("shared memory", "occupancy_limit_shared_mem"),
                ("warps", "occupancy_limit_warps"),
                ("blocks", "occupancy_limit_blocks"),
            )
        )
        out += _block(
            "Occupancy",
            [
                (
                    f"theoretical {_na(k.theoretical_occupancy_pct, '{:.1f}', '%')}, achieved "
                    f"{_na(k.achieved_occupancy_pct, '{:.1f}', '%')}"
                ),
                f"blocks per SM allowed by each limit: {limits}",
            ],
            h.occupancy,
        )
        flops = ", ".join(f"{p_}: {fmt_si(v, 'FLOP')}" for p_, v in sorted((k.flops_by_precision or {}).items()) if v)
        out += _block(
            "Compute utilization",
            [
                (
                    f"SM throughput {_na(k.sm_throughput_pct, '{:.1f}', '%')} of peak; tensor pipe "
                    f"{_na(k.tensor_pipe_pct, '{:.1f}', '%')}, FP32 pipe {_na(k.fp32_pipe_pct, '{:.1f}', '%')}, "
                    f"FP64 pipe {_na(k.fp64_pipe_pct, '{:.1f}', '%')} of active cycles"
                ),
                (
                    f"FLOPs: {flops or 'n/a'}; achieved "
                    f"{'n/a' if k.achieved_flops_per_s is None else fmt_si(k.achieved_flops_per_s, 'FLOP/s')}"
                ),
            ],
            h.compute,
        )
        bps = None if p is None else p.achieved_bytes_per_s
        out += _block(
            "Memory behavior",
            [
                (
                    f"DRAM throughput {_na(k.dram_throughput_pct, '{:.1f}', '%')} of peak "
                    f"({'n/a' if bps is None else fmt_si(bps, 'B/s')}); memory throughput "
                    f"{_na(k.memory_throughput_pct, '{:.1f}', '%')}"
                ),
                (
                    f"DRAM read {_na(k.dram_bytes_read, '{:.4g}', ' B')}, "
                    f"written {_na(k.dram_bytes_written, '{:.4g}', ' B')};"
                    f" arithmetic intensity {_na(k.arithmetic_intensity, '{:.3g}', ' FLOP/B')}"
                ),
                (
                    f"L1 hit {_na(k.l1_hit_rate_pct, '{:.1f}', '%')}, L2 hit {_na(k.l2_hit_rate_pct, '{:.1f}', '%')}, "
                    f"shared bank conflicts {_na(k.shared_bank_conflicts, '{:.0f}')}"
                ),
            ],
            h.memory,
        )
        out += ["**Warp stall reasons**", "", "```", render_warp_stalls_ascii(k), "```", ""]
        out += [f"- _{s}_" for s in h.stalls] or ["- n/a"]
        out.append("")
    if roofline is not None:
        out += ["### Roofline", "", "```", render_roofline_ascii(roofline, peaks), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def estimated_roofline_section(runs) -> str | None:
    """Roofline from the trace's ops (FLOPs recorded by the profiler, or from shapes), for traces
    without Nsight Compute data. ``None`` when no op carries enough to estimate."""
    out = []
    for run in runs:
        rf, peaks = run.roofline_estimate, run.peaks
        if rf is None or not rf.points:
            continue
        out += ["**Roofline (estimate from op shapes; no hardware counters)**", ""]
        if rf.note:
            out += [rf.note, ""]
        if peaks is None:
            out += [f"_{peaks_warning(run.device)}_", ""]
        out += ["```text", render_roofline_ascii(rf, peaks), "```", ""]
        out += [
            "| kernel | count | FLOPs | bytes (est.) | FLOP/B | achieved | bound | % of roof |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for p in sorted(rf.points, key=lambda p: -(p.duration_ns or 0))[:10]:
            out.append(
                f"| `{p.label[:60]}` | {p.count} | {fmt_si(p.flops, 'FLOP')} | {fmt_si(p.dram_bytes, 'B')} | "
                f"{'n/a' if p.arithmetic_intensity is None else f'{p.arithmetic_intensity:.3g}'} | "
                f"{_achieved(p)} | {p.bound or 'n/a'} | "
                f"{'n/a' if p.pct_of_roof is None else f'{p.pct_of_roof:.1f}%'} |"
            )
        out.append("")
    return "\n".join(out) if out else None


def _achieved(p) -> str:
    if p.bound == "memory" and p.achieved_bytes_per_s is not None:
        return fmt_si(p.achieved_bytes_per_s, "B/s")
    return "n/a" if p.achieved_flops_per_s is None else fmt_si(p.achieved_flops_per_s, "FLOP/s")
