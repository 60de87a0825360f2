"""The Execution Story as plain text lines (the caller puts them in a code fence), from the
model :class:`tracestory.analysis.story.Story` (``RunResults.story``). Width <= 100 columns.

Per phase: a time cursor relative to the first phase's CPU start (``Time 12.345 ms: ...``) for
the CPU range start, the first launch and the first GPU op; then the folded ops as a tree, one
line per op group (category x ops, GPU time, top kernel), ``LOOP (xN ...)`` with its body once,
``~~ GPU idle`` lines with the CPU op the host was inside; at most 40 lines per phase; the line
with the most GPU time is marked ``<- MOST TIME HERE``. A family of steps gets one line per step
and its median step in full; the SUMMARY closes the story when there is more than one phase.
"""

from __future__ import annotations

from ..analysis.story import Differs, FamilyStory, IdleGap, Loop, OpGroup, OpRun, PhaseStory, Story, StorySummary
from ..units import plural
from .ascii import clip_text, fmt_ms, fmt_ns
from .md import short_name

WIDTH = 100
MAX_LINES_PER_PHASE = 40
HOT = "  <- MOST TIME HERE"


def _group(g: OpGroup) -> str:
    more = f" +{g.kinds - 1} kinds" if g.kinds > 1 else ""
    text = f"{g.category} x{g.count}"
    return f"{text:<16} {fmt_ms(g.time_ns):>8} ms  {short_name(g.top_kernel, 44)}{more}"


def _gap(g: IdleGap) -> str:
    why = f"; CPU inside {g.cpu_op}" if g.cpu_op else ""
    where = f" (iteration {g.iteration}, before op {g.before_op})" if g.iteration is not None else ""
    return f"~~ GPU idle {fmt_ns(g.length_ns)}{why}{where}"


def _tree(ph: PhaseStory) -> list[str]:
    """The phase's folded ops as tree lines."""
    if not ph.segments:
        return ["└── (no GPU ops launched in this phase)"]
    items: list[tuple[str, float, bool]] = []  # (text, GPU time weight, is an op group)
    for seg in ph.segments:
        if isinstance(seg, IdleGap):
            items.append((_gap(seg), 0, False))
        elif isinstance(seg, OpRun):
            head = f"+{fmt_ms(seg.offset_ns)} ms "
            for j, g in enumerate(seg.groups):
                items.append(((head if j == 0 else " " * len(head)) + _group(g), g.time_ns, True))
        elif isinstance(seg, Loop):
            items.append(
                (
                    f"+{fmt_ms(seg.offset_ns)} ms LOOP (x{seg.count} of {seg.period} ops, {fmt_ns(seg.span_ns)} span "
                    f"each, GPU time {fmt_ns(seg.gpu_time_ns / seg.count)} each = {fmt_ns(seg.gpu_time_ns)})",
                    0,
                    False,
                )
            )
            items += [("│   " + _group(g), g.time_ns * seg.count, True) for g in seg.body]
            items += [("│   " + _gap(g), 0, False) for g in seg.inner_gaps]
    if len(items) > MAX_LINES_PER_PHASE:
        rest = items[MAX_LINES_PER_PHASE - 1 :]
        items = items[: MAX_LINES_PER_PHASE - 1] + [
            (f"... {len(rest)} more lines ({sum(1 for r in rest if r[2])} op groups) not shown", 0, False)
        ]
    hot = max(range(len(items)), key=lambda i: (items[i][1] if items[i][2] else -1, -i))
    lines = []
    for i, (text, _, _) in enumerate(items):
        branch = "└── " if i == len(items) - 1 else "├── "
        if text.startswith("│   "):
            branch, text = "│   ├── ", text[4:]
        line = branch + text
        if i == hot:
            line = clip_text(line, WIDTH - len(HOT)) + HOT
        lines.append(clip_text(line, WIDTH))
    return lines


def _rule(title: str) -> list[str]:
    return ["═" * WIDTH, clip_text(title, WIDTH), "═" * WIDTH]


def _phase(ph: PhaseStory, number: int, label: str = "PHASE") -> list[str]:
    out = _rule(f"{label} {number}: {ph.name}  ({ph.ops} GPU ops: {ph.kernels} kernels, {ph.memops} memops)")
    if not ph.whole:
        out.append(f"Time {fmt_ms(ph.cpu_at_ns)} ms: CPU range '{ph.name}' begins (CPU wall {fmt_ns(ph.wall_ns)})")
    if ph.gpu_at_ns is None:
        return out + ["└── (no GPU ops launched in this phase)", ""]
    span = ph.gpu_span_ns
    busy = f"{ph.gpu_busy_ns / span:.1%}" if span else "n/a"
    if (fl := ph.first_launch) is not None:
        out.append(
            f"Time {fmt_ms(fl.at_ns)} ms: host launches the first GPU op ({short_name(fl.kernel, 40)}); the GPU "
            f"starts it {fmt_ns(fl.latency_ns)} later"
        )
    out.append(
        f"Time {fmt_ms(ph.gpu_at_ns)} ms: GPU execution begins (GPU span {fmt_ns(span)}, busy "
        f"{fmt_ns(ph.gpu_busy_ns)} = {busy} of the span)"
    )
    if ph.sub_ranges:
        out.append("Inside it (outermost nested CPU ranges; GPU ops launched inside each):")
        for r in ph.sub_ranges:
            top = ", ".join(f"{c} {share:.0%}" for c, share in r.top_categories) or "-"
            out.append(
                f"  {fmt_ms(r.start_ns):>10} ms  {clip_text(r.name, 30):<30} {r.ops:>5} ops "
                f"{fmt_ms(r.gpu_time_ns):>9} ms GPU  ({top})"
            )
        out.append("")
    out += _tree(ph)
    out += [f"Time {fmt_ms(ph.gpu_end_at_ns)} ms: last GPU op of {ph.name} ends", ""]
    return out


def _family(f: FamilyStory, number: int) -> list[str]:
    first, last = f.steps[0].name, f.steps[-1].name
    out = _rule(f"PHASE {number}: {f.family} x{len(f.steps)} steps ({first} .. {last})")
    out.append(
        f"Time {fmt_ms(f.first_at_ns)} ms: first step begins; step time {fmt_ns(f.min_ns)} .. "
        f"{fmt_ns(f.max_ns)}, mean {fmt_ns(f.mean_ns)}"
    )
    out += ["", "Per step (GPU span; busy = GPU op union):"]
    top = max(max(s.time_ns for s in f.steps), 1)
    for s in f.steps:
        bar = "█" * max(1, int(round(30 * s.time_ns / top)))
        out.append(
            f"  {clip_text(s.name, 16):<16} {fmt_ms(s.time_ns):>10} ms  busy {fmt_ms(s.busy_ns):>8} ms  "
            f"{s.ops:>5} ops  {bar}"
        )
    r2 = f"{f.r2:.2f}" if f.r2 is not None else "n/a"
    out.append(f"  trend: {fmt_ns(f.slope_ns_per_step)} per step (least squares vs step), r2 {r2}")
    out += ["", f"Representative step (median time): {f.representative.name}"]
    out += _phase(f.representative, number, label="STEP OF PHASE")[3:]
    return out


def _differs(d: Differs) -> list[str]:
    out = [
        f"How {d.family} differs from {d.first}:",
        f"  • {d.shared_kernels} kernel names shared; {len(d.only_first)} only in {d.first}, "
        f"{len(d.only_family)} only in {d.family}",
    ]
    for label, only in ((d.first, d.only_first), (d.family, d.only_family)):
        out += [f"      only in {label}: {short_name(n, 60)}" for n in only[:3]]
    if d.gemm_rows_first and d.gemm_rows_family:
        (a0, a1), (b0, b1) = d.gemm_rows_first, d.gemm_rows_family
        kind = "matrix-vector (GEMV-like, memory-bound)" if d.family_is_gemv else "matrix-matrix"
        out.append(f"  • GEMM rows M: {d.first} {a0}..{a1} (matrix-matrix), {d.family} {b0}..{b1}: {kind}")
    out.append(
        f"  • GPU op time: {d.first} {fmt_ns(d.gpu_time_first_ns)}, {d.family} {fmt_ns(d.gpu_time_per_step_ns)} per "
        f"step ({d.ops_first} vs {d.ops_per_step:.0f} ops)"
    )
    if d.top_first and d.top_family:
        out.append(
            f"  • top category: {d.first} {d.top_first[0]} {d.top_first[1]:.1%}, "
            f"{d.family} {d.top_family[0]} {d.top_family[1]:.1%}"
        )
    return out


def _summary(s: StorySummary) -> list[str]:
    out = _rule("SUMMARY")
    if s.first is not None:
        name, span, busy, wall = s.first
        out.append(f"• {name}: GPU span {fmt_ns(span)}, busy {fmt_ns(busy)}, CPU wall {fmt_ns(wall)}")
    for f in s.families:
        out.append(
            f"• {f.family} ({f.count} steps): {fmt_ns(f.min_ns)} .. {fmt_ns(f.max_ns)} per step, mean "
            f"{fmt_ns(f.mean_ns)}; GPU busy per step {fmt_ns(f.busy_mean_ns)}"
        )
        out += [f"  outlier: {n} {fmt_ns(t)} = {r:.1f}x the median" for n, t, r in f.outliers]
        out += [f"  fast step: {n} {fmt_ns(t)} (< 1/1.5 of the median)" for n, t in f.fast]
    if s.differs is not None:
        out += _differs(s.differs)
    return out + [""]


def execution_story(story: Story) -> list[str]:
    """The story's lines (no code fence), each <= 100 columns."""
    if not story.blocks:
        return ["(no phases and no GPU ops: nothing to tell)"]
    lines = [
        f"EXECUTION STORY: {story.trace}",
        f"Phases from {story.source!r}: {plural(story.phase_count, 'phase')};"
        " times are from the first phase's CPU start.",
        "Per line: offset from the phase's GPU start, category x ops, GPU time, top kernel.",
        "",
    ]
    for number, block in enumerate(story.blocks, 1):
        lines += _family(block, number) if isinstance(block, FamilyStory) else _phase(block, number)
    if story.summary is not None:
        lines += _summary(story.summary)
    return [clip_text(x, WIDTH) for x in lines]
