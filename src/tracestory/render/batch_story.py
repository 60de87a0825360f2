"""The report's "Continuous Batching" execution story, from a scheduler event log.

:func:`render_batch_story` writes Markdown sections: the scenario and arrivals, the iteration log
folded (``analysis.serving_story``: one table row per run of similar iterations, the exceptions
on rows of their own and then with their decisions), engine stalls and the profiler's holds,
chunked prefill, KV cache events and preemptions, the memory timeline (ASCII, at most 100
columns; a flat line is one sentence), kernel behavior under batching (tokens per iteration and
the fit of iteration time on them; with a joined trace, GPU busy time and the top kernels of
prefill-heavy vs decode-only iterations) and request latency from the log, next to the client's
view when the load generator's summary of the same run is given. A part with nothing to tell is
left out and named in one line. With ``--plots`` the serving PNGs (``render.plots_serving``) sit
where their part is told; the KV chart's fence names its PNG twin (the HTML shows the PNG only).
:func:`batch_json` is the same content as JSON; :func:`serving_environment` is the Environment of
a report without a trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from ..analysis.batching import STALL_MIN_NS, STALL_RATIO, BatchingResult, Iteration
from ..analysis.serving_story import LogRow
from ..units import plural
from .ascii import clip_text, fmt_bytes, fmt_ns, fmt_pct, time_axis
from .md import md_table

MAX_DETAILED = 8  # exceptions written out with their decisions below the folded table
MAX_TRACED_ROWS = 24
MAX_ARRIVALS = 12
WIDTH = 100


# ------------------------------------------------------------------ decisions


def _ids(ids: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f", … +{len(ids) - limit}" if len(ids) > limit else "")


def _running(it: Iteration) -> str:
    pre = [
        f"{m.request_id}-prefill {m.tokens}{' (chunk)' if m.chunked else ''}"
        for m in it.members
        if m.phase == "prefill"
    ]
    dec = [m.request_id for m in it.members if m.phase == "decode"]
    parts = pre[:6] + ([f"… +{len(pre) - 6} prefill"] if len(pre) > 6 else [])
    if dec:
        parts.append(f"{len(dec)} decode ({_ids(dec, 6)})")
    return "[" + ", ".join(parts) + "]"


def _kv_text(it: Iteration) -> str | None:
    if it.kv_in_use is None and it.kv_allocated is None and it.kv_freed is None:
        return None
    bits = []
    if it.kv_allocated:
        bits.append(f"+{it.kv_allocated} blocks")
    if it.kv_freed:
        bits.append(f"-{it.kv_freed} freed")
    if it.kv_in_use is not None:
        tot = f"/{it.kv_total}" if it.kv_total else ""
        pct = f" ({fmt_pct(it.kv_in_use / it.kv_total)})" if it.kv_total else ""
        bits.append(f"{it.kv_in_use}{tot} in use{pct}")
    return ", ".join(bits)


def _entry(it: Iteration) -> list[str]:
    ids = [m.request_id for m in it.members]
    head = f"Iteration {it.iter}: Batch = {{{_ids(ids)}}}  ({fmt_ns(it.duration_ns)})"
    rows = [f"Running: {_running(it)}"] if it.members else ["Running: nothing"]
    p, d = it.prefill_tokens, it.decode_seqs
    if p and d:
        rows.append(f"Observation: mixed prefill-decode batch: {p} prefill tokens + {d} decode tokens")
    waits = [x for x in it.decisions if x.action == "wait"]
    for x in it.decisions:
        if x.action != "wait":
            rows.append(f"{x.action.capitalize()}: {x.request_id}: {x.reason}")
    if waits:
        rows.append(
            f"Wait: {plural(len(waits), 'request')} ({_ids([w.request_id for w in waits], 4)}): {waits[0].reason}"
        )
    kv = _kv_text(it)
    if kv:
        rows.append(f"KV cache: {kv}")
    if it.memory_allocated_bytes is not None:
        res = f" / {fmt_bytes(it.memory_reserved_bytes)} reserved" if it.memory_reserved_bytes is not None else ""
        rows.append(f"Device memory: {fmt_bytes(it.memory_allocated_bytes)} allocated{res}")
    out = [head] + [("└── " if k == len(rows) - 1 else "├── ") + r for k, r in enumerate(rows)]
    return [clip_text(line, WIDTH) for line in out]


def _kinds_text(kinds: dict[str, int]) -> str:
    short = {"decode-only": "decode", "prefill-only": "prefill", "mixed": "mixed", "empty": "empty"}
    return ", ".join(f"{n} {short.get(k, k)}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


def _row_note(row: LogRow, r: BatchingResult) -> str:
    if row.exception is None:
        return ""
    held = {h.charged_iter: h for h in (r.story.profiler if r.story else ())}
    stall = {st.iter: st for st in r.stalls}
    h = held.get(row.first_iter)
    if h is not None:
        whose = f"iteration {h.iter}'s launch" if h.iter != h.charged_iter else "its launch"
        return f"**profiler {h.what}**: {fmt_ns(h.held_ns)} of {whose} ({h.source})"
    st = stall.get(row.first_iter)
    if st is not None:
        return f"**stall**: {st.times_median:.0f}x the median"
    if row.exception == "preemption":
        it = next(i for i in r.log.iterations if i.iter == row.first_iter)
        who = [f"{d.request_id} ({d.reason})" for d in it.decisions if d.action == "preempt"]
        return "**preemption**: " + _ids(who, 2)
    return f"**{row.exception}**"


def folded_log(r: BatchingResult) -> list[str]:
    """The iteration log folded (``analysis.serving_story``): one table row per run of similar
    iterations, exceptions on rows of their own, then the exceptions' decisions in detail."""
    st = r.story
    if st is None or not st.rows:
        return ["No iteration was recorded.", ""]
    t0 = r.log.iterations[0].t_start_ns
    band = "" if st.fold_ratio is None else f" (batch sizes within {st.fold_ratio:g}x + 1 of each other)"
    lines = [
        f"{len(r.log.iterations)} iterations in {len(st.rows)} rows: runs of consecutive iterations of similar batch"
        f"{band} are one row; the first iteration, engine stalls, preemptions and the iterations the profiler's "
        "start or stop held are rows of their own. Every iteration is in the JSON (`per_iteration`).",
        "",
    ]
    rows = []
    for row in st.rows:
        its = f"{row.first_iter}" if row.count == 1 else f"{row.first_iter}-{row.last_iter}"
        seqs = f"{row.seqs_min}" if row.seqs_min == row.seqs_max else f"{row.seqs_min}-{row.seqs_max}"
        t = fmt_ns(row.time_p50_ns) if row.count == 1 else f"{fmt_ns(row.time_p50_ns)} ({fmt_ns(row.time_max_ns)})"
        rows.append(
            [
                its,
                f"{(row.t_start_ns - t0) / 1e9:.2f}",
                _kinds_text(row.kinds),
                seqs,
                row.prefill_tokens,
                f"{row.admitted} / {row.finished}",
                row.waits + row.chunked,
                t,
                row.kv_in_use_end if row.kv_in_use_end is not None else "n/a",
                _row_note(row, r),
            ]
        )
    lines += md_table(
        [
            "iterations",
            "T (s)",
            "kinds",
            "batch (seqs)",
            "prefill tokens",
            "admitted / finished",
            "waits + splits",
            "time p50 (max)",
            "KV blocks at end",
            "exception",
        ],
        rows,
        "lrlrrrrrrl",
    )
    detail = [row for row in st.rows if row.exception is not None][:MAX_DETAILED]
    if detail:
        by_iter = {it.iter: it for it in r.log.iterations}
        lines += ["", "The exceptions' decisions:", "", "```text"]
        for row in detail:
            lines += _entry(by_iter[row.first_iter])
        lines += ["```"]
    return lines + [""]


# ------------------------------------------------------------------ memory timeline


def step_chart(
    t_ns: np.ndarray, values: np.ndarray, t0: int, t1: int, *, height: int = 8, width: int = WIDTH, fmt=str
) -> list[str]:
    """A step function (``values[k]`` from ``t_ns[k]`` on) as filled columns: each column shows
    the largest value reached in its time bin (the value carried in when none changes there)."""
    label_w = max(len(fmt(float(values.max()))), len(fmt(0))) + 1
    n = width - label_w - 2
    top = float(values.max()) if values.size and values.max() > 0 else 1.0
    edges = t0 + (t1 - t0) * np.arange(n + 1) / n
    col = np.clip(np.searchsorted(edges, t_ns, side="right") - 1, 0, n - 1)
    peak = np.full(n, -1.0)
    np.maximum.at(peak, col, values.astype(np.float64))
    carried = np.searchsorted(t_ns, edges[:-1], side="right") - 1  # value in force at bin start
    base = np.where(carried >= 0, values[np.maximum(carried, 0)], 0).astype(np.float64)
    level = np.maximum(peak, base) / top * height
    lines = []
    for row in range(height, 0, -1):
        cells = "".join("█" if v >= row else "▄" if v >= row - 0.5 else " " for v in level)
        lab = fmt(top * row / height) if row in (height, height // 2) else ""
        lines.append(f"{lab:>{label_w}} ┤{cells}" if lab else f"{'':>{label_w}} │{cells}")
    lines.append(f"{fmt(0):>{label_w}} ┼" + "─" * n)
    lines += time_axis(t0, t1, n, label_w + 2)[1:]
    return [line[:width] for line in lines]


def _png(plots, kind: str):
    return next((p for p in plots if p.name.endswith(f"_serving_{kind}.png")), None)


def _image(png) -> list[str]:
    return [f"![{png.stem}]({png.name})", ""] if png is not None else []


def _memory_section(r: BatchingResult, plots=()) -> list[str] | None:
    its = r.log.iterations
    mem = [(i.t_end_ns, i.memory_allocated_bytes) for i in its if i.memory_allocated_bytes is not None]
    kv = [(i.t_end_ns, i.kv_in_use) for i in its if i.kv_in_use is not None]
    if not its or (not mem and not kv):
        return None
    t0 = min([a.t_ns for a in r.log.arrivals] + [its[0].t_start_ns])
    t1 = max(its[-1].t_end_ns, t0 + 1)
    out = []
    if mem:
        t, v = (np.array(x) for x in zip(*mem, strict=False))
    if mem and int(v.max()) - int(v.min()) < 0.01 * int(v.max()):  # a flat line is one sentence, not a chart
        out += [f"Device memory allocated stayed at {fmt_bytes(int(v.max()))} (within 1%) over the run.", ""]
    elif mem:
        out += [
            (
                f"Device memory allocated over time (peak {fmt_bytes(int(v.max()))} at "
                f"{fmt_ns(int(t[np.argmax(v)] - t0))}):"
            ),
            "",
        ]
        out += ["```text", *step_chart(t, v, t0, t1, fmt=lambda x: fmt_bytes(x)), "```", ""]
    if kv:
        t, v = (np.array(x) for x in zip(*kv, strict=False))
        total = r.kv_total
        cap = f" of {total}" if total else ""
        out += [
            f"KV cache blocks in use over time (peak {int(v.max())}{cap} at {fmt_ns(int(t[np.argmax(v)] - t0))}):",
            "",
        ]
        png = _png(plots, "kv")  # the fence names its PNG twin: the HTML page shows the PNG only
        twin = f" png={png.name}" if png is not None else ""
        out += [f"```text{twin}", *step_chart(t, v, t0, t1, fmt=lambda x: f"{x:.0f}"), "```", ""] + _image(png)
    out += _memory_events(r, t0)
    return out


def _memory_events(r: BatchingResult, t0: int) -> list[str]:
    """The iterations that changed KV usage the most (admissions and completions)."""
    its = [i for i in r.log.iterations if i.kv_allocated is not None or i.kv_freed is not None]
    if not its:
        return []
    change = np.array([(i.kv_allocated or 0) - (i.kv_freed or 0) for i in its])
    picks = sorted(set(np.argsort(-change, kind="stable")[:3]) | set(np.argsort(change, kind="stable")[:3]))
    lines = ["Memory events (largest KV changes in one iteration):", ""]
    for k in picks:
        it = its[k]
        if change[k] == 0:
            continue
        who = [f"{d.action} {d.request_id}" for d in it.decisions if d.action in ("admit", "finish", "preempt")]
        lines.append(
            f"- T={fmt_ns(it.t_end_ns - t0)} (iteration {it.iter}): {int(change[k]):+d} blocks"
            f" → {it.kv_in_use} in use" + (f" ({_ids(who, 4)})" if who else "")
        )
    return lines + [""]


# ------------------------------------------------------------------ the story


def _scenario(r: BatchingResult) -> list[str]:
    m, log = r.log.meta, r.log
    arr = log.arrivals
    span = arr[-1].t_ns - arr[0].t_ns if len(arr) > 1 else 0
    rate = f" ({(len(arr) - 1) / (span / 1e9):.1f} req/s)" if span > 0 else ""
    what = " ".join(
        x for x in (m.engine, f"({m.model}" + (f" on {m.device})" if m.device else ")") if m.model else "") if x
    )
    cfg = [
        f"KV cache {m.num_blocks} blocks x {m.block_size} tokens" if m.num_blocks and m.block_size else "",
        f"token budget {m.max_batch_tokens} per iteration" if m.max_batch_tokens else "",
        f"at most {m.max_num_seqs} sequences" if m.max_num_seqs else "",
    ]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(r.kinds.items()))
    its = log.iterations
    wall = fmt_ns(its[-1].t_end_ns - its[0].t_start_ns) if its else "n/a"
    return [
        f"**Scenario**: {len(arr)} requests arriving over {fmt_ns(span)}{rate} to {what or 'the server'}; "
        + "; ".join(c for c in cfg if c)
        + ".",
        "",
        f"{len(its)} iterations over {wall}: {kinds or 'none'}.",
        "",
    ]


def _arrivals(r: BatchingResult) -> list[str]:
    arr = r.log.arrivals
    if not arr:
        return ["No arrival was recorded."]
    t0 = arr[0].t_ns
    lines = []
    for a in arr[:MAX_ARRIVALS]:
        size = f"input: {a.prompt_tokens} tokens" if a.prompt_tokens is not None else "input: n/a"
        new = f", max {a.max_new_tokens} new" if a.max_new_tokens is not None else ""
        lines.append(f"Time {(a.t_ns - t0) / 1e6:9.1f} ms: Request {a.request_id} arrives ({size}{new})")
    if len(arr) > MAX_ARRIVALS:
        lines.append(f"… {len(arr) - MAX_ARRIVALS} more arrivals until {(arr[-1].t_ns - t0) / 1e6:.1f} ms")
    return ["```text", *lines, "```", ""]


def _chunked(r: BatchingResult) -> list[str] | None:
    if not r.chunks:
        return None
    reasons = list(dict.fromkeys(d.reason for it in r.log.iterations for d in it.decisions if d.action == "chunk"))
    sizes = [m.tokens for it in r.log.iterations for m in it.members if m.phase == "prefill" and m.chunked]
    budget = r.log.meta.max_batch_tokens
    req = "request's prompt was" if r.chunked_requests == 1 else "requests' prompts were"
    steps = "step" if r.chunks == 1 else "steps"
    lines = [
        f"{r.chunked_requests} {req} longer than the token budget left and processed over several "
        f"iterations: {r.chunks} partial prefill {steps} of {np.mean(sizes):.0f} tokens on average"
        + (f" (token budget {budget} per iteration)" if budget else "")
        + ", so the running decodes kept "
        "producing tokens meanwhile.",
        "",
    ]
    if reasons:
        lines += ["Reasons, as the scheduler gave them (first 3 distinct):", ""]
        lines += [f"- {x}" for x in reasons[:3]] + [""]
    return lines


def _kv(r: BatchingResult) -> list[str]:
    if r.kv_peak_in_use is None and r.kv_allocated_total is None:
        return ["No KV cache counts were recorded.", ""]
    total = f" of {r.kv_total}" if r.kv_total else ""
    pct = f" ({fmt_pct(r.kv_peak_in_use / r.kv_total)})" if r.kv_total and r.kv_peak_in_use is not None else ""
    end = r.log.iterations[-1].kv_in_use if r.log.iterations else None
    lines = [
        (
            f"- Blocks allocated: {r.kv_allocated_total if r.kv_allocated_total is not None else 'n/a'}; "
            f"freed: {r.kv_freed_total if r.kv_freed_total is not None else 'n/a'}; in use at the end: "
            f"{end if end is not None else 'n/a'}"
        ),
        f"- Peak in use: {r.kv_peak_in_use}{total}{pct}",
        f"- Preemptions: {len(r.preemptions)}",
    ]
    for p in r.preemptions[:10]:
        lines.append(f"  - iteration {p.iter}: {p.request_id} preempted: {p.reason}")
    if len(r.preemptions) > 10:
        lines.append(f"  - … {len(r.preemptions) - 10} more")
    again = Counter(p.request_id for p in r.preemptions).most_common(3)
    if again and again[0][1] > 1:  # the same request evicted again and again: recompute thrash
        lines.append("- Preempted more than once: " + ", ".join(f"{rid} ({n} times)" for rid, n in again if n > 1))
    if r.finish_reasons:
        lines.append("- Finished: " + ", ".join(f"{n} {k}" for k, n in sorted(r.finish_reasons.items())))
    return lines + [""]


def _kernels(r: BatchingResult) -> list[str]:
    its = r.log.iterations
    rows = []
    for kind in ("prefill-only", "mixed", "decode-only"):
        sel = [i for i in its if i.kind == kind]
        if sel:
            rows.append(
                [
                    kind,
                    len(sel),
                    f"{np.mean([i.prefill_tokens for i in sel]):.1f}",
                    f"{np.mean([i.decode_seqs for i in sel]):.1f}",
                    fmt_ns(float(np.mean([i.duration_ns for i in sel]))),
                ]
            )
    lines = ["Tokens per iteration and iteration time, by kind of iteration:", ""]
    lines += md_table(["iterations", "count", "mean prefill tokens", "mean decode seqs", "mean time"], rows, "lrrrr")
    lines.append("")
    f = r.fit
    if f is None:
        lines += ["Too few iterations (< 3) to fit iteration time on tokens.", ""]
    else:
        expr = fmt_ns(round(f.a_ns))  # rounded to whole ns: 999999.9999 reads as 1.00 ms
        for b, what in ((f.b_prefill_ns_per_token, "prefill tokens"), (f.b_decode_ns_per_seq, "decode seqs")):
            if b is not None:
                expr += f" {'-' if b < 0 else '+'} {fmt_ns(round(abs(b), 3))} x {what}"
        r2 = f"R² = {f.r_squared:.3f}" if f.r_squared is not None else "R² n/a (constant times)"
        lines += [f"Fit (least squares, {f.n} iterations): **iteration time = {expr}** ({r2}).", ""]
        b = f.b_decode_ns_per_seq
        if b is not None and f.a_ns > 0:
            how = "adds no measurable time" if b <= 0 else f"adds {fmt_ns(round(b, 3))}"
            lines += [
                f"One more decode sequence {how} to an iteration whose fixed cost is {fmt_ns(round(f.a_ns))}: "
                + (
                    "batching decodes amortizes the fixed cost (weights are read once per iteration)."
                    if b < 0.25 * f.a_ns
                    else "decode time grows nearly linearly with the batch."
                ),
                "",
            ]
    if r.trace is not None:
        lines += _trace_lines(r)
    return lines


def _trace_lines(r: BatchingResult) -> list[str]:
    j = r.trace
    assert j is not None, "told only for a run joined with its trace"
    busy, rng = np.array(j.gpu_busy_ns, dtype=np.float64), np.array(j.range_ns, dtype=np.float64)
    frac = busy.sum() / rng.sum() if rng.sum() > 0 else None
    its = f"iterations {min(j.iterations)}-{max(j.iterations)}" if j.iterations else "no iterations"
    lines = [
        (
            f"Joined with the trace ({len(j.iterations)} `iteration N` ranges, {its}, {j.side} side): GPU busy "
            f"{fmt_ns(float(busy.mean()) if busy.size else None)} per iteration on average, "
            f"{fmt_pct(frac)} of the iteration ranges."
        ),
        "",
    ]
    by_iter = {it.iter: it for it in r.log.iterations}
    rows = []
    for n, b, rg in list(zip(j.iterations, j.gpu_busy_ns, j.range_ns, strict=False))[:MAX_TRACED_ROWS]:
        it = by_iter.get(n)
        rows.append(
            [
                n,
                it.kind if it else "n/a",
                it.prefill_tokens if it else "n/a",
                it.decode_seqs if it else "n/a",
                fmt_ns(it.duration_ns) if it else "n/a",
                fmt_ns(rg),
                fmt_ns(b),
                fmt_pct(b / rg if rg else None),
            ]
        )
    for w in r.window:
        if w.others_median_ns:
            lines.append(
                f"- {w.kind}: the {w.traced} traced iterations took {fmt_ns(w.traced_median_ns)} (median) against "
                f"{fmt_ns(w.others_median_ns)} for {w.others} untraced ones of the same batch "
                f"({w.traced_median_ns / w.others_median_ns:.2f}x)"
            )
    if any(w.others_median_ns for w in r.window):
        lines += [
            "",
            "The difference is the profiler's own cost (every op recorded on the engine thread): read the "
            "trace's iteration times with it in mind; the untraced iterations are the reference.",
            "",
        ]
    lines += [
        "Traced iterations (wall: the scheduler log's iteration; range: the trace's `iteration N`; GPU busy: "
        "union of its GPU ops):",
        "",
    ]
    lines += md_table(
        ["iteration", "kind", "prefill tokens", "decode seqs", "wall", "range", "GPU busy", "busy"], rows, "llrrrrrr"
    )
    if len(j.iterations) > MAX_TRACED_ROWS:
        lines.append(f"… {len(j.iterations) - MAX_TRACED_ROWS} more traced iterations in the JSON (`trace`).")
    lines.append("")
    for cls, top in j.top_kernels.items():
        if not top:
            continue
        lines += [f"Top kernels of {cls} iterations ({j.class_iterations[cls]} iterations):", ""]
        lines += md_table(
            ["kernel", "total", "calls", "per iteration", "share"],
            [
                [clip_text(k.name, 60), fmt_ns(k.total_ns), k.count, fmt_ns(k.per_iteration_ns), fmt_pct(k.fraction)]
                for k in top
            ],
            "lrrrr",
        )
        lines.append("")
    return lines


def _holds(r: BatchingResult) -> list[str]:
    holds = r.story.profiler if r.story else ()
    if not holds:
        return []
    parts = [
        f"the {h.what} held iteration {h.iter}'s launch {fmt_ns(h.held_ns)}"
        + (", its plan send waiting for that rank" if h.rank else "")
        + (f" (in iteration {h.charged_iter}'s wall time: overlapped scheduling)" if h.charged_iter != h.iter else "")
        for h in holds
    ]
    src = " and ".join(dict.fromkeys(part for h in holds for part in h.source.split(" and ")))
    where = "each rank's engine thread" if any(h.rank for h in holds) else "the engine thread"
    return [
        f"The profiler's own start and stop ran on {where} ({src}): " + "; ".join(parts) + ". That "
        "time is the capture's, not the engine's, and is not counted toward a stall.",
        "",
    ]


def _stall_cause(st) -> str:
    """What the event log measured inside a stall: device time (``gpu_ns``) and Python GC time
    (``gc_ns``); "" when the log has neither (older logs, CPU runs without GC keys)."""
    parts = []
    if st.gpu_ns is not None:
        parts.append(f"GPU {fmt_ns(st.gpu_ns)} of {fmt_ns(st.duration_ns)}")
    if st.gc_ns is not None:
        n, gen = st.gc_passes or 0, st.gc_generation
        if n == 0:
            parts.append("no Python GC ran in it")
        else:
            if gen == 2:
                what = "a full collection" if n == 1 else f"{n} collections, at least one full"
            elif gen is not None:
                what = f"a generation-{gen} collection" if n == 1 else f"{n} collections, up to generation {gen}"
            else:
                what = plural(n, "collection")
            parts.append(f"Python GC held the process {fmt_ns(st.gc_ns)} ({what})")
    return "; ".join(parts)


def _stalls(r: BatchingResult) -> list[str] | None:
    """Engine stalls and the profiler's holds; None when there is neither."""
    holds = _holds(r)
    if not r.stalls:
        return holds or None
    window = set(r.trace.iterations) if r.trace is not None else set()
    held = {h.charged_iter: h.what for h in (r.story.profiler if r.story else ())}
    lines = [
        f"Iterations that took at least {STALL_RATIO:g}x the median ({fmt_ns(r.iteration_ns.p50_ns)}) and "
        f"{fmt_ns(STALL_MIN_NS)}: the engine thread did nothing else meanwhile, so requests that arrived then "
        "waited for it.",
        "",
    ]
    t0 = r.log.iterations[0].t_start_ns if r.log.iterations else 0
    for st in r.stalls:
        why = [c for c in (_stall_cause(st),) if c]
        if r.log.iterations and st.iter == r.log.iterations[0].iter:
            why.append("the first iteration (CUDA and library warm-up)")
        if st.iter - 1 in held:
            why.append(f"right after the profiler's {held[st.iter - 1]}")
        elif not held and window and st.iter == max(window):  # no hold recorded: the stop is not measured
            why.append("the last traced iteration: the profiler's stop ran on the engine thread")
        elif st.iter in window:
            why.append("inside the traced window")
        if st.next_launch_ns is not None and st.next_launch_ns >= 0.5 * st.duration_ns:
            why.append(
                f"the next iteration's launch took {fmt_ns(st.next_launch_ns)} on the host (with overlapped "
                "scheduling it runs inside this iteration)"
            )
        ttft = f"; their TTFT p50 {fmt_ns(st.ttft_p50_ns_of_those)}" if st.ttft_p50_ns_of_those is not None else ""
        lines.append(
            f"- Iteration {st.iter} at T={(st.t_start_ns - t0) / 1e9:.2f} s: {fmt_ns(st.duration_ns)} "
            f"({st.times_median:.0f}x the median){' — ' + '; '.join(why) if why else ''}; "
            f"{plural(st.arrivals_during, 'request')} arrived during it{ttft}"
        )
    return lines + [""] + holds


def _latency(r: BatchingResult) -> list[str]:
    def row(name, d):
        return [name, d.count, fmt_ns(d.p50_ns), fmt_ns(d.p90_ns), fmt_ns(d.p99_ns), fmt_ns(d.max_ns)]

    lines = [
        "Server-side latency per request (from the log; percentiles by linear interpolation):",
        "",
        *md_table(
            ["", "requests", "p50", "p90", "p99", "max"],
            [
                row("TTFT (arrival → first token)", r.ttft),
                row("E2E (arrival → finish)", r.e2e),
                row("iteration time", r.iteration_ns),
            ],
            "lrrrrr",
        ),
        "",
    ]
    c = r.client
    if c is None:
        return lines
    rate = f"{c.target_qps:g} QPS Poisson" if c.target_qps is not None else f"concurrency {c.concurrency}"
    fails = ", ".join(f"{n} {k}" for k, n in c.failures.items()) or "none"
    good = (
        f"; goodput {c.goodput_rps:.2f} req/s ({fmt_pct(c.goodput_fraction)} of requests within "
        f"TTFT <= {fmt_ns(c.slo_ttft_ns)}, mean ITL <= {fmt_ns(c.slo_itl_ns)})"
        if c.goodput_rps is not None
        else ""
    )
    lines += [
        (
            f"Client side, as the load generator measured it ({rate} for {c.duration_s:g} s): {c.ok} of "
            f"{c.planned} requests OK, failures: {fails}; achieved {_num(c.achieved_qps, '.2f')} req/s, "
            f"{_num(c.input_tokens_per_s, ',.0f')} input and {_num(c.output_tokens_per_s, ',.0f')} output "
            f"tokens/s{good}." + (" The run was interrupted." if c.interrupted else "")
        ),
        "",
        *md_table(
            ["", "samples", "p50", "p90", "p99", "max"],
            [
                row("TTFT (send → first token)", c.ttft),
                row("ITL (between tokens)", c.itl),
                row("E2E (send → last token)", c.e2e),
            ],
            "lrrrrr",
        ),
        "",
    ]
    if c.ttft.p50_ns is not None and r.ttft.p50_ns is not None:
        gap = c.ttft.p50_ns - r.ttft.p50_ns
        lines += [
            f"Client TTFT p50 minus server TTFT p50: {'-' if gap < 0 else ''}{fmt_ns(abs(gap))}, the time a "
            "first token spends outside the engine loop (HTTP, JSON, the hand-off to the engine thread and "
            "the stream back).",
            "",
        ]
    if len(r.log.arrivals) != c.sent:
        lines += [f"The client sent {c.sent} requests and the server logged {len(r.log.arrivals)} arrivals.", ""]
    return lines


def _num(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _absent(r: BatchingResult) -> str:
    """One sentence for the parts left out because nothing happened."""
    none = [
        what
        for what, empty in (
            ("engine stall", not r.stalls),
            ("preemption", not r.preemptions),
            ("chunked prefill (every prompt fit the token budget left)", not r.chunks),
        )
        if empty
    ]
    return f"No {', no '.join(none)}." if none else ""


def serving_environment(r: BatchingResult) -> list[str]:
    """The server and load as the log's ``meta`` line and the load summary record them (the
    Environment of a report without a trace)."""
    m = r.log.meta
    rows: list[list[object]] = [
        ["engine", m.engine or "n/a (not in the log)"],
        ["model", m.model or "n/a (not in the log)"],
        ["device", m.device or "n/a (not in the log)"],
        ["KV cache", f"{m.num_blocks} blocks x {m.block_size} tokens" if m.num_blocks and m.block_size else "n/a"],
        ["token budget per iteration", m.max_batch_tokens if m.max_batch_tokens else "n/a"],
        ["sequence limit (--max-num-seqs)", m.max_num_seqs if m.max_num_seqs else "n/a"],
        ["overlapped scheduling", "n/a (not in the log)" if m.overlap is None else "on" if m.overlap else "off"],
    ]
    c = r.client
    if c is not None:
        rate = f"{c.target_qps:g} QPS Poisson" if c.target_qps is not None else f"concurrency {c.concurrency}"
        rows.append(["load", f"{rate} for {c.duration_s:g} s, {c.planned} requests planned"])
    return [
        "From the scheduler log's `meta` line"
        + (" and the load generator's summary" if c is not None else "")
        + " (no trace and no capture manifest, so nothing about the host or GPU beyond these):",
        "",
        *md_table(["", "value"], rows),
        "",
    ]


def render_batch_story(result: BatchingResult, plots=()) -> str:
    """The story as Markdown (a level-2 section with level-3 parts); ``plots``: the PNGs written
    beside the report (``render.plots_serving``), placed where their part is told. A part with
    nothing to tell is left out (:func:`_absent` names it in one line)."""
    r = result
    absent = _absent(r)
    out = [
        "## Execution Story: Continuous Batching",
        "",
        f"Source: `{r.log.path}`",
        "",
        *_scenario(r),
        *([absent, ""] if absent else []),
        "### Arrivals",
        "",
        *_arrivals(r),
        "### Scheduler decisions",
        "",
        *folded_log(r),
        *_image(_png(plots, "batch")),
    ]
    for title, body in (
        ("Engine stalls", _stalls(r)),
        ("Chunked prefill", _chunked(r)),
        ("KV cache events", _kv(r)),
        ("Memory timeline", _memory_section(r, plots)),
    ):
        if body:
            out += [f"### {title}", "", *body]
    out += [
        "### Kernel behavior under batching",
        "",
        *_kernels(r),
        "### Request latency",
        "",
        *_latency(r),
        *_image(_png(plots, "latency")),
    ]
    return "\n".join(out).rstrip() + "\n"


def batch_json(result: BatchingResult) -> dict:
    """Everything in the story as plain JSON (times in ns, relative to the log's t0)."""
    r = result
    its = r.log.iterations
    per_iter = {
        "iter": [i.iter for i in its],
        "t_start_ns": [i.t_start_ns for i in its],
        "t_end_ns": [i.t_end_ns for i in its],
        "kind": [i.kind for i in its],
        "prefill_tokens": [i.prefill_tokens for i in its],
        "decode_seqs": [i.decode_seqs for i in its],
        "kv_allocated": [i.kv_allocated for i in its],
        "kv_freed": [i.kv_freed for i in its],
        "kv_in_use": [i.kv_in_use for i in its],
        "memory_allocated_bytes": [i.memory_allocated_bytes for i in its],
        "memory_reserved_bytes": [i.memory_reserved_bytes for i in its],
        "decisions": [[asdict(d) for d in i.decisions] for i in its],
    }
    for key in ("gc_ns", "gpu_ns"):  # columns only where the log has them (older logs: as before)
        col = [getattr(i, key) for i in its]
        if any(v is not None for v in col):
            per_iter[key] = col
    return {
        "schema": "tracestory.batch_story/1",
        "source": r.log.path,
        "meta": asdict(r.log.meta),
        "arrivals": len(r.log.arrivals),
        "iterations": len(its),
        "kinds": r.kinds,
        "fit": asdict(r.fit) if r.fit else None,
        "ttft": asdict(r.ttft),
        "e2e": asdict(r.e2e),
        "iteration_ns": asdict(r.iteration_ns),
        "chunked_requests": r.chunked_requests,
        "chunks": r.chunks,
        "kv": {
            "allocated_total": r.kv_allocated_total,
            "freed_total": r.kv_freed_total,
            "peak_in_use": r.kv_peak_in_use,
            "peak_t_ns": r.kv_peak_t_ns,
            "total": r.kv_total,
        },
        "preemptions": [asdict(p) for p in r.preemptions],
        "finish_reasons": r.finish_reasons,
        "requests": [asdict(q) for q in r.requests],
        "per_iteration": per_iter,
        "trace": asdict(r.trace) if r.trace is not None else None,
        "client": asdict(r.client) if r.client is not None else None,
        "stalls": [asdict(x) for x in r.stalls],
        "window": [asdict(x) for x in r.window],
        "story": asdict(r.story) if r.story is not None else None,
    }
