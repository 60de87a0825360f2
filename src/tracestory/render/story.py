"""The Execution Story: the capture walked phase by phase, as in the report format's
single-request template, as plain text lines (the caller puts them in a code fence). Width <= 100 columns.

Per phase (prefill, each decode step, each ProfilerStep, or the whole trace):

* a time cursor relative to the first phase's CPU start (``Time 12.345 ms: ...``) for the CPU
  range start and for the first GPU op, with the phase's GPU span and busy time;
* its GPU ops (kernels and memops launched inside the phase's CPU range, in start order),
  split at idle gaps >= ``max(100 us, 5% of the phase's GPU span)`` (shown as ``idle`` lines,
  with the CPU op the host was inside when known, ``RunFacts.gaps``);
* each segment folded: the longest exactly repeated run of op names (period >= 3, >= 2
  repetitions) becomes ``LOOP (xN, <span> each)`` with its body listed once; what is before and
  after is folded the same way (depth <= 3); inside, consecutive ops of one category are one
  line with count, time and the top kernel's short name;
* the line with the most GPU time in the phase is marked ``<- MOST TIME HERE``.

Families of >= 3 steps (decode_0..15, ProfilerStep#N): the median-time step is shown in full
as the representative, every step gets one line (time, busy, ops, a bar), then the family's
trend (slope, r2). A SUMMARY block closes the story: first-phase (prefill) time, step time range
and mean, outliers, and - when there is a prefill and a decode family - how decode differs
(ops only one side runs, GEMM row counts from ``aten::mm``/``linear`` input shapes: M = 1 is
matrix-vector work, memory-bound by nature).
"""

from __future__ import annotations

import json

import numpy as np

from ..analysis.facts import RunFacts
from ..analysis.gaps import GapCause
from .ascii import clip_text, fmt_ms, fmt_ns
from .md import short_name  # noqa: F401  (re-exported)

WIDTH = 100
MAX_LINES_PER_PHASE = 40
MIN_PERIOD = 3
HOT = "  <- MOST TIME HERE"


def parse_json_cell(value):
    """An ``ops`` input_dims / input_types cell (JSON text or bytes, or a list) as Python."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


# ------------------------------------------------------------------ folding


def best_repeat(keys: np.ndarray, min_period: int = MIN_PERIOD) -> tuple[int, int, int] | None:
    """``(start, period, count)`` of the longest run of a block repeated back to back
    (coverage ``period * count`` maximal, the shortest period on ties), or None."""
    n = len(keys)
    best, best_cover = None, 0
    for p in range(min_period, n // 2 + 1):
        eq = keys[p:] == keys[:-p]
        if not eq.any():
            continue
        padded = np.concatenate([[0], eq.view(np.int8), [0]])
        d = np.diff(padded)
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        lengths = ends - starts
        j = int(np.argmax(lengths))
        count = lengths[j] // p + 1
        if count >= 2 and count * p > best_cover:
            best, best_cover = (int(starts[j]), p, int(count)), count * p
    return best


def fold(keys: np.ndarray, lo: int, hi: int, depth: int = 0) -> list[tuple]:
    """Segments of ``keys[lo:hi]``: ``("run", a, b)`` or ``("loop", a, period, count)``."""
    if hi - lo < 2 * MIN_PERIOD or depth >= 3:
        return [("run", lo, hi)] if hi > lo else []
    rep = best_repeat(keys[lo:hi])
    if rep is None:
        return [("run", lo, hi)]
    s, p, c = rep
    a = lo + s
    return fold(keys, lo, a, depth + 1) + [("loop", a, p, c)] + fold(keys, a + p * c, hi, depth + 1)


# ------------------------------------------------------------------ per-phase ops


class _Ops:
    """The GPU ops (kernels + memops) of the trace (``RunFacts.gpu_ops``) in start order, with
    names, categories and launch starts."""

    def __init__(self, facts: RunFacts):
        g = facts.gpu_ops
        order = g.order
        self.cats = g.categories
        self.start = g.start_ns[order]
        self.end = g.end_ns[order]
        self.name = g.name[order]
        self.cat = g.category[order]
        self.launch = g.launch_start_ns[order]
        self.trace = facts.trace

    def of_phase(self, ph, whole: bool) -> np.ndarray:
        if whole:
            return np.arange(len(self.start))
        return np.flatnonzero((self.launch >= ph.start_ns) & (self.launch < ph.end_ns))


def _group_lines(ops: _Ops, idx: np.ndarray, reps: int = 1) -> list[tuple[str, int, float]]:
    """Consecutive same-category ops as (text, time_ns per repetition, sort weight)."""
    out: list[tuple[str, int, float]] = []
    if idx.size == 0:
        return out
    cat = ops.cat[idx]
    cuts = np.flatnonzero(np.diff(cat)) + 1
    for seg in np.split(idx, cuts):
        dur = ops.end[seg] - ops.start[seg]
        codes, inv = np.unique(ops.name[seg], return_inverse=True)
        per = np.bincount(inv, weights=dur)
        top = ops.trace.name(int(codes[int(np.argmax(per))]))
        more = f" +{len(codes) - 1} kinds" if len(codes) > 1 else ""
        total = int(dur.sum())
        text = f"{ops.cats[ops.cat[seg[0]]]} x{len(seg)}"
        out.append((f"{text:<16} {fmt_ms(total / reps):>8} ms  {short_name(top, 44)}{more}", total // reps, total))
    return out


def _phase_lines(ops: _Ops, idx: np.ndarray, t0: int, causes: dict[int, GapCause], gap_min: int) -> list[str]:
    """Tree lines for one phase's ops (already in start order)."""
    if idx.size == 0:
        return ["└── (no GPU ops launched in this phase)"]
    s, e = ops.start[idx], ops.end[idx]
    run_end = np.maximum.accumulate(e)
    gap = np.concatenate([[0], s[1:] - run_end[:-1]])
    big = gap >= gap_min

    def gap_text(i: int) -> str:
        c = causes.get(int(run_end[i - 1]))
        why = f"; CPU inside {c.op_name}" if c is not None and c.op_name else ""
        return f"~~ GPU idle {fmt_ns(int(gap[i]))}{why}"

    items: list[tuple[str, float, bool]] = []  # (text, weight, is_hot_candidate)
    # Fold on categories: layer bodies repeat by category even where an op's exact kernel
    # differs between layers (a residual add's functor, a split-K variant).
    for seg in fold(ops.cat[idx], 0, len(idx)):
        if seg[0] == "run":
            lo, hi = seg[1], seg[2]
            cuts = [lo] + [i for i in range(lo + 1, hi) if big[i]] + [hi]
            for a, b in zip(cuts[:-1], cuts[1:], strict=False):
                if a > lo or (a == lo and a > 0 and big[a]):
                    items.append((gap_text(a), 0, False))
                sub = idx[a:b]
                head = f"+{fmt_ms(ops.start[sub[0]] - t0)} ms "
                for j, (text, _, w) in enumerate(_group_lines(ops, sub)):
                    items.append(((head if j == 0 else " " * len(head)) + text, w, True))
        else:
            _, a, p, c = seg
            if a > 0 and big[a]:
                items.append((gap_text(a), 0, False))
            allr = idx[a : a + p * c]
            span = (ops.end[allr].max() - ops.start[allr[0]]) / c
            tot = int((ops.end[allr] - ops.start[allr]).sum())
            items.append(
                (
                    f"+{fmt_ms(ops.start[allr[0]] - t0)} ms LOOP (x{c} of {p} ops, "
                    f"{fmt_ns(span)} span each, GPU time {fmt_ns(tot / c)} each = "
                    f"{fmt_ns(tot)})",
                    0,
                    False,
                )
            )
            for text, _, w in _group_lines(ops, allr[:p]):
                items.append(("│   " + text, w * c, True))
            inner = [i for i in range(a + 1, a + p * c) if big[i]]
            for i in inner:
                items.append(
                    ("│   " + gap_text(i) + f" (iteration {(i - a) // p + 1}, before op {(i - a) % p + 1})", 0, False)
                )
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


# ------------------------------------------------------------------ story


def _rule(title: str) -> list[str]:
    return ["═" * WIDTH, clip_text(title, WIDTH), "═" * WIDTH]


def _phase_block(
    analysis, ops: _Ops, ph, number: int, origin: int, causes, whole: bool, label: str = "PHASE"
) -> list[str]:
    idx = ops.of_phase(ph, whole)
    span = ph.gpu_span_ns
    out = _rule(
        f"{label} {number}: {ph.name}  ({len(idx)} GPU ops: {ph.kernel_count} kernels, {ph.memop_count} memops)"
    )
    if not whole:
        out.append(
            f"Time {fmt_ms(ph.start_ns - origin)} ms: CPU range '{ph.name}' begins (CPU wall {fmt_ns(ph.wall_ns)})"
        )
    if ph.gpu_start_ns is None:
        return out + ["└── (no GPU ops launched in this phase)", ""]
    busy = f"{ph.gpu_busy_ns / span:.1%}" if span else "n/a"
    first = idx[np.argmin(ops.start[idx])] if idx.size else None
    if first is not None and ops.launch[first] >= 0:
        # Tie the host to the GPU: the launch call of the phase's first GPU op and its latency.
        out.append(
            f"Time {fmt_ms(int(ops.launch[first]) - origin)} ms: host launches the first GPU op "
            f"({short_name(ops.trace.name(int(ops.name[first])), 40)}); the GPU starts it "
            f"{fmt_ns(int(ops.start[first] - ops.launch[first]))} later"
        )
    out.append(
        f"Time {fmt_ms(ph.gpu_start_ns - origin)} ms: GPU execution begins (GPU span "
        f"{fmt_ns(span)}, busy {fmt_ns(ph.gpu_busy_ns)} = {busy} of the span)"
    )
    gap_min = max(100_000, int(0.05 * (span or 0)))
    body = _phase_lines(ops, idx, ph.gpu_start_ns, causes, gap_min)
    if len(body) >= MAX_LINES_PER_PHASE and not whole:
        out.extend(_sub_ranges(analysis, ops, ph, origin))
    out.extend(body)
    out.append(f"Time {fmt_ms(ph.gpu_end_ns - origin)} ms: last GPU op of {ph.name} ends")
    out.append("")
    return out


def _sub_ranges(analysis, ops: _Ops, ph, origin: int) -> list[str]:
    """The outermost CPU ranges nested inside a long phase (e.g. ``## forward ##``,
    ``## backward ##``, ``## optimizer ##``) with their GPU ops, as a coarse map."""
    r = analysis.trace.ranges
    if len(r) == 0:
        return []
    m = (
        (r["side"] == 0)
        & (r["start_ns"] >= ph.start_ns)
        & (r["end_ns"] <= ph.end_ns)
        & ~((r["start_ns"] == ph.start_ns) & (r["end_ns"] == ph.end_ns))
    )
    rows = np.flatnonzero(m)
    if rows.size == 0:
        return []
    rows = rows[np.argsort(r["start_ns"][rows], kind="stable")]
    run_end = np.maximum.accumulate(r["end_ns"][rows])
    outer = np.concatenate([[True], r["start_ns"][rows][1:] >= run_end[:-1]])
    rows = rows[outer][:12]
    out = ["Inside it (outermost nested CPU ranges; GPU ops launched inside each):"]
    for i in rows:
        sel = np.flatnonzero((ops.launch >= r["start_ns"][i]) & (ops.launch < r["end_ns"][i]))
        dur = ops.end[sel] - ops.start[sel]
        w = np.bincount(ops.cat[sel], weights=dur, minlength=len(ops.cats))
        top = (
            ", ".join(f"{ops.cats[c]} {w[c] / w.sum():.0%}" for c in np.argsort(-w, kind="stable")[:3] if w[c] > 0)
            if w.sum() > 0
            else "-"
        )
        name = analysis.trace.name(int(r["name"][i]))
        out.append(
            f"  {fmt_ms(r['start_ns'][i] - origin):>10} ms  {clip_text(name, 30):<30} "
            f"{sel.size:>5} ops {fmt_ms(int(dur.sum())):>9} ms GPU  ({top})"
        )
    return out + [""]


def _step_time(ph) -> int:
    return ph.gpu_span_ns if ph.gpu_span_ns is not None else ph.wall_ns


def execution_story(facts: RunFacts) -> list[str]:
    """The story's lines (no code fence), each <= 100 columns; the trace's idle-gap causes
    (``RunFacts.gaps``) are told where they fall."""
    analysis, gaps = facts.analysis, facts.gaps
    tr, phs = analysis.trace, analysis.phases
    ops = _Ops(facts)
    whole = phs.source == "none"
    phases = list(phs.phases)
    if not phases:
        return ["(no phases and no GPU ops: nothing to tell)"]
    origin = min([phases[0].start_ns] + ([int(ops.start[0])] if len(ops.start) else []))
    causes = {c.start_ns: c for c in gaps}
    lines = [
        f"EXECUTION STORY: {tr.label}",
        f"Phases from {phs.source!r}: {len(phases)} phase(s); times are from the first phase's CPU start.",
        "Per line: offset from the phase's GPU start, category x ops, GPU time, top kernel.",
        "",
    ]
    fam_of = {f.family: f for f in phs.families}
    shown_families: set[str] = set()
    number = 0
    for ph in phases:
        fam = fam_of.get(ph.family)
        if fam is None:
            number += 1
            lines.extend(_phase_block(analysis, ops, ph, number, origin, causes, whole))
            continue
        if ph.family in shown_families:
            continue
        shown_families.add(ph.family)
        number += 1
        members = [p for p in phases if p.family == ph.family]
        lines.extend(_family_block(analysis, ops, members, fam, number, origin, causes))
    lines.extend(_summary(analysis, ops, phases))
    return [clip_text(x, WIDTH) for x in lines]


def _family_block(analysis, ops, members, fam, number, origin, causes) -> list[str]:
    times = np.array([_step_time(p) for p in members], dtype=np.int64)
    rep = members[int(np.argsort(times, kind="stable")[len(times) // 2])]
    out = _rule(f"PHASE {number}: {fam.family} x{len(members)} steps ({members[0].name} .. {members[-1].name})")
    out.append(
        f"Time {fmt_ms(members[0].start_ns - origin)} ms: first step begins; "
        f"step time {fmt_ns(fam.min_ns)} .. {fmt_ns(fam.max_ns)}, mean {fmt_ns(fam.mean_ns)}"
    )
    out.append("")
    out.append("Per step (GPU span; busy = GPU op union):")
    top = max(int(times.max()), 1)
    for p, t in zip(members, times, strict=False):
        bar = "█" * max(1, int(round(30 * t / top)))
        out.append(
            f"  {clip_text(p.name, 16):<16} {fmt_ms(t):>10} ms  busy {fmt_ms(p.gpu_busy_ns):>8} ms  "
            f"{p.kernel_count + p.memop_count:>5} ops  {bar}"
        )
    r2 = f"{fam.r2:.2f}" if fam.r2 is not None else "n/a"
    out.append(f"  trend: {fmt_ns(fam.slope_ns_per_step)} per step (least squares vs step), r2 {r2}")
    out.append("")
    out.append(f"Representative step (median time): {rep.name}")
    out.extend(_phase_block(analysis, ops, rep, number, origin, causes, False, label="STEP OF PHASE")[3:])
    return out


def _gemm_rows(analysis, ph) -> list[int]:
    """M (rows of the left operand) of the ``aten::mm`` / ``aten::addmm`` calls inside a phase's
    CPU range, from recorded input shapes; [] when shapes were not recorded."""
    tr = analysis.trace
    o = tr.ops
    codes = [c for c in (tr.code_of("aten::mm"), tr.code_of("aten::addmm")) if c >= 0]
    if not codes or len(o) == 0:
        return []
    sel = np.flatnonzero(np.isin(o["name"], codes) & (o["start_ns"] >= ph.start_ns) & (o["start_ns"] < ph.end_ns))
    rows = []
    for i in sel:
        dims = parse_json_cell(o["input_dims"][i])
        if not dims:
            continue
        a = dims[1] if tr.name(int(o["name"][i])) == "aten::addmm" and len(dims) > 2 else dims[0]
        if isinstance(a, list) and len(a) >= 2:
            rows.append(int(np.prod(a[:-1])))
    return rows


def _summary(analysis, ops: _Ops, phases) -> list[str]:
    phs = analysis.phases
    out = _rule("SUMMARY")
    first = phases[0]
    fams = list(phs.families)
    if first.family not in {f.family for f in fams}:
        out.append(
            f"• {first.name}: GPU span {fmt_ns(first.gpu_span_ns)}, busy "
            f"{fmt_ns(first.gpu_busy_ns)}, CPU wall {fmt_ns(first.wall_ns)}"
        )
    for f in fams:
        members = [p for p in phases if p.family == f.family]
        out.append(
            f"• {f.family} ({f.count} steps): {fmt_ns(f.min_ns)} .. {fmt_ns(f.max_ns)} "
            f"per step, mean {fmt_ns(f.mean_ns)}; GPU busy per step "
            f"{fmt_ns(float(np.mean([p.gpu_busy_ns for p in members])))}"
        )
        slow = [o for o in phs.outliers if o.name in {p.name for p in members}]
        for o in slow:
            out.append(f"  outlier: {o.name} {fmt_ns(o.time_ns)} = {o.ratio:.1f}x the median")
        fast = [p for p in members if _step_time(p) * 1.5 <= float(np.median([_step_time(q) for q in members]))]
        for p in fast:
            out.append(f"  fast step: {p.name} {fmt_ns(_step_time(p))} (< 1/1.5 of the median)")
    if not fams and len(phases) == 1:
        out.append("• one phase; see its sequence above")
    decode = next((f for f in fams if f.family != first.family), None)
    if decode is not None and first.family not in {f.family for f in fams}:
        out.extend(_differs(analysis, ops, first, [p for p in phases if p.family == decode.family]))
    out.append("")
    return out


def _differs(analysis, ops: _Ops, first, steps) -> list[str]:
    out = [f"How {steps[0].family} differs from {first.name}:"]
    a = ops.of_phase(first, False)
    b = np.concatenate([ops.of_phase(p, False) for p in steps])
    na, nb = set(ops.name[a].tolist()), set(ops.name[b].tolist())
    only_a = sorted(na - nb, key=lambda c: ops.trace.name(c))
    only_b = sorted(nb - na, key=lambda c: ops.trace.name(c))
    out.append(
        f"  • {len(na & nb)} kernel names shared; {len(only_a)} only in {first.name}, "
        f"{len(only_b)} only in {steps[0].family}"
    )
    for label, only in ((first.name, only_a), (steps[0].family, only_b)):
        for c in only[:3]:
            out.append(f"      only in {label}: {short_name(ops.trace.name(c), 60)}")
    ra = _gemm_rows(analysis, first)
    rb = [r for p in steps for r in _gemm_rows(analysis, p)]
    if ra and rb:
        kind = "matrix-vector (GEMV-like, memory-bound)" if max(rb) <= 16 else "matrix-matrix"
        out.append(
            f"  • GEMM rows M: {first.name} {min(ra)}..{max(ra)} (matrix-matrix), "
            f"{steps[0].family} {min(rb)}..{max(rb)}: {kind}"
        )
    ta = int((ops.end[a] - ops.start[a]).sum())
    tb = (ops.end[b] - ops.start[b]).sum() / len(steps)
    out.append(
        f"  • GPU op time: {first.name} {fmt_ns(ta)}, {steps[0].family} {fmt_ns(tb)} per "
        f"step ({len(a)} vs {len(b) / len(steps):.0f} ops)"
    )
    ca = np.bincount(ops.cat[a], weights=ops.end[a] - ops.start[a], minlength=len(ops.cats))
    cb = np.bincount(ops.cat[b], weights=ops.end[b] - ops.start[b], minlength=len(ops.cats))
    if ca.sum() > 0 and cb.sum() > 0:
        top_a, top_b = int(np.argmax(ca)), int(np.argmax(cb))
        out.append(
            f"  • top category: {first.name} {ops.cats[top_a]} {ca[top_a] / ca.sum():.1%}, "
            f"{steps[0].family} {ops.cats[top_b]} {cb[top_b] / cb.sum():.1%}"
        )
    return out
