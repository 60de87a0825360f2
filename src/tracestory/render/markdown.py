"""The story report as Markdown: seed 003's structure with its exact headings, in order.

``render_report`` turns analysed traces into one deterministic document (same input, same
bytes: no clock, no absolute paths, sorted everything). Sections other modules own (the
hardware analysis from Nsight Compute, the capture's environment, actions log and reproduction
guide) come in through ``extra_sections``; without them each section still says what the trace
itself tells, and ``n/a`` with the reason where it tells nothing.

Every chart is in a code fence and <= 100 columns; every number in prose is formatted from a
result (breakdown, timeline, phases, findings evidence).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..analysis.families import is_generated
from ..analysis.findings import Evidence
from ..analysis.rules_multigpu import headline
from ..analysis.links import gpu_ops_column
from .ascii import (Bar, Lane, bar_chart, fmt_bytes, fmt_ms, fmt_ns, fmt_pct,
                    lanes_timeline, log_histogram)
from .batch_story import render_batch_story
from .hardware import estimated_roofline_section, hardware_section
from .manifest_sections import render_actions_log, render_environment, render_reproduction
from .memory import memory_section
from .multigpu import render_multigpu_section
from .story import execution_story, parse_json_cell, short_name


_PRECISIONS: tuple[tuple[str, str], ...] = (
    ("fp8", r"fp8|e4m3|e5m2|Float8"),
    ("bf16", r"bf16|BFloat16|bfloat16"),
    ("fp16", r"(?<![b])f16|fp16|half|Half"),
    ("tf32", r"tf32"),
    ("fp32", r"(?<![a-z])float(?![0-9])|f32|fp32|s1688gemm"),
)


# ------------------------------------------------------------------ helpers


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
             align: str | None = None) -> list[str]:
    """A pipe table; ``align`` is one char per column (``l`` or ``r``). Pipes in cells escaped."""
    align = align or "l" * len(headers)
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(cell(h) for h in headers) + " |",
           "|" + "|".join(" ---: " if a == "r" else " --- " for a in align) + "|"]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return out


def fence(lines: Sequence[str], lang: str = "text") -> list[str]:
    return [f"```{lang}", *lines, "```"]


def fmt_evidence(e: Evidence) -> str:
    v = e.value
    if v is None:
        return "n/a"
    if e.unit == "ns":
        return fmt_ns(v)
    if e.unit == "ns_per_step":
        return f"{fmt_ns(v)} per step"
    if e.unit == "fraction":
        return fmt_pct(v)
    if e.unit == "x":
        return f"{v:.2f}x"
    if e.unit == "per_ms":
        return f"{v:.2f} per ms"
    if e.unit == "bytes":
        return fmt_bytes(v)
    if e.unit == "ratio":
        return f"{v:.2f}"
    if e.unit == "count":
        return f"{int(v)}"
    return f"`{short_name(str(v), 70)}`" if e.unit == "text" else str(v)


def _label(a) -> str:
    """The trace's label, of an Analysis or a RunResults."""
    return a.trace.label




def _precisions(a) -> tuple[list[str], list[str]]:
    """Precisions named by kernel names, and by recorded op input dtypes (GEMM/attention ops)."""
    tr = a.trace
    kn = [tr.name(int(c)) for c in np.unique(tr.kernels["name"])]
    ot: list[str] = []
    if len(tr.ops):
        codes = [i for i, s in enumerate(tr.strings)
                 if s in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::_scaled_mm")
                 or "scaled_dot_product" in s]
        sel = np.flatnonzero(np.isin(tr.ops["name"], codes))
        for v in dict.fromkeys(tr.ops["input_types"][sel].tolist()):
            t = parse_json_cell(v)
            if isinstance(t, list):
                ot += [str(x) for x in t if x]
    pick = lambda texts: [p for p, pat in _PRECISIONS if any(re.search(pat, t) for t in texts)]
    return pick(kn), pick(sorted(set(ot)))


def _dominant(a) -> object | None:
    b = a.breakdown
    return max(b.categories, key=lambda c: c.time_ns) if b.categories else None


# ------------------------------------------------------------------ sections


def _executive(analyses, findings) -> list[str]:
    out = []
    for a, fs in zip(analyses, findings):
        b, tl = a.breakdown, a.timeline
        head = f"**{_label(a)}**: " if len(analyses) > 1 else ""
        s1 = (f"{head}The capture holds {b.kernel_count} kernels and {b.memop_count} memory ops "
              f"({fmt_ns(b.total_time_ns)} of GPU op time)")
        if tl is not None:
            s1 += (f" in a {fmt_ns(tl.window_ns)} GPU window, busy {fmt_pct(tl.busy_ns / tl.window_ns)}"
                   if tl.window_ns else "")
        s1 += f" across {len(a.phases.phases)} phase(s) from {a.phases.source!r}."
        key = [f for f in fs if f.severity in ("high", "medium")][:2] or list(fs[:1])
        s2 = "Key insight: " + "; ".join(f.title for f in key) + "." if key else ""
        s3 = f"Recommendation: {key[0].recommendation}" if key else ""
        out.append(" ".join(x for x in (s1, s2, s3) if x))
        out.append("")
    return out


def _environment(analyses) -> list[str]:
    out = []
    for a in analyses:
        m = a.trace.meta
        if len(analyses) > 1:
            out += [f"### {_label(a)}", ""]
        rows = [(d.id, d.name, d.sm_count if d.sm_count is not None else "n/a",
                 d.compute_capability or "n/a", fmt_bytes(d.total_memory_bytes))
                for d in m.devices]
        if rows:
            out += md_table(("device", "name", "SMs", "compute capability", "memory"), rows,
                            "rlrrr")
        else:
            out.append("Devices: n/a (the trace carries no device properties)")
        out.append("")
        ex = dict(m.extra)
        items = [f"- Source: {m.source_format} trace `{os.path.basename(m.source_path)}`"
                 + (f", schema {m.format_version}" if m.format_version else "")]
        for key, label in (("cuda_runtime_version", "CUDA runtime"), ("cuda_driver_version", "CUDA driver"),
                           ("cupti_version", "CUPTI")):
            if key in ex:
                items.append(f"- {label}: {_cuda_version(ex[key]) if key != 'cupti_version' else ex[key]}")
        flags = [k for k in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
                 if ex.get(k)]
        if flags:
            items.append("- Profiler options: " + ", ".join(flags))
        if m.process_name:
            items.append(f"- Process: {m.process_name}")
        if m.rank is not None or m.world_size is not None:
            items.append(f"- Rank {m.rank if m.rank is not None else 'n/a'} of world size "
                         f"{m.world_size if m.world_size is not None else 'n/a'}")
        if m.distributed:
            d = m.distributed
            items.append(f"- Distributed: backend {d.get('backend', 'n/a')}"
                         + (f", NCCL {d['nccl_version']}" if d.get("nccl_version") else ""))
        if "event_count" in ex:
            items.append(f"- Events in the file: {ex['event_count']}")
        out += items + [""]
    return out


def _cuda_version(v) -> str:
    try:
        v = int(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{v // 1000}.{(v % 1000) // 10}"


def _codebase(runs) -> list[str]:
    out = []
    for run in runs:
        a = run.analysis
        if len(runs) > 1:
            out += [f"### {_label(a)}", ""]
        fams = run.families
        total = sum(f[2] for f in fams) or 1
        out += md_table(("kernel family", "ops", "time", "share", "top kernel"),
                        [(f, n, fmt_ns(t), fmt_pct(t / total), f"`{short_name(k, 60)}`")
                         for f, n, t, k in fams], "lrrrl")
        out.append("")
        names = {f[0] for f in fams}
        triton = any(is_generated(n) for n in names)
        out.append(f"- Execution mode: {'compiled (Triton/Inductor kernels present)' if triton else 'eager (no Triton/Inductor kernels)'}")
        kp, op = _precisions(a)
        out.append(f"- Precisions in GEMM/attention op inputs: {', '.join(op) if op else 'n/a (shapes/types not recorded)'}; "
                   f"named in kernel names: {', '.join(kp) if kp else 'none'}")
        att = [f for f in fams if f[0] in ("FlashAttention", "cuDNN")]
        att_k = [n for n in _attention_kernels(a)]
        if att_k:
            out.append("- Attention implementation: " + "; ".join(att_k))
        else:
            out.append("- Attention implementation: none found (no attention-category kernels)")
        del att
        out.append("")
    return out


def _attention_kernels(a) -> list[str]:
    cats = a.classification.taxonomy.categories
    codes = [i for i, c in enumerate(cats) if "attention" in c]
    if not codes:
        return []
    k = a.trace.kernels
    m = np.isin(a.classification.kernel_category, codes)
    out = []
    for c in np.unique(k["name"][m]):
        n = a.trace.name(int(c))
        kind = ("cuDNN SDPA" if "sdpa" in n.lower() or "cudnn" in n.lower() else
                "FlashAttention" if "flash" in n.lower() else
                "memory-efficient (CUTLASS fmha)" if "fmha" in n.lower() else "other")
        out.append(f"{kind} `{short_name(n, 60)}` x{int((k['name'][m] == c).sum())}")
    return out


def _goal(goal, questions, analyses) -> list[str]:
    out = [f"**Original Goal**: {goal if goal else 'none given (pass --goal TEXT)'}", "",
           "**Interpreted As**:", ""]
    qs = list(questions) + ["Where does the GPU time go, and what is the ceiling if the top "
                            "category got faster? (Observations, Appendix)",
                            "Is the GPU kept busy, or is the run launch-/host-bound? "
                            "(Observations, Visualizations)",
                            "What happens phase by phase, and how do the steps differ? "
                            "(Execution Story)"]
    out += [f"{i}. {q}" for i, q in enumerate(qs, 1)]
    return out + [""]


def _visualizations(analyses) -> list[str]:
    out = []
    for a in analyses:
        if len(analyses) > 1:
            out += [f"### {_label(a)}", ""]
        b = a.breakdown
        bars = [Bar(c.name, c.time_ns, f"{fmt_ms(c.time_ns):>10} ms {c.percent:5.1f}%")
                for c in b.categories]
        out += ["GPU time breakdown by category (share of GPU op time, kernels + memops):", ""]
        out += fence(bar_chart(bars, title=f"category   (total {fmt_ns(b.total_time_ns)} of GPU op time)"))
        out.append("")
        tl = a.timeline
        if tl is None:
            out += ["Timeline: n/a (the input has no per-op start times)", ""]
            continue
        out += ["GPU timeline, one lane per stream (each column: the category with the most "
                "time in it; `·` idle), phases above:", ""]
        out += fence(_timeline_chart(a, tl.start_ns, tl.end_ns))
        out.append("")
        zoom = next((p for p in a.phases.phases if p.gpu_span_ns), None)
        if tl.busy_ns < 0.2 * tl.window_ns and zoom is not None and a.phases.source != "none":
            out += [f"Zoom on the first phase, `{zoom.name}` (GPU span {fmt_ns(zoom.gpu_span_ns)}):", ""]
            out += fence(_timeline_chart(a, zoom.gpu_start_ns, zoom.gpu_end_ns))
            out.append("")
        dur = np.concatenate([a.trace.kernels.dur_ns, a.trace.memops.dur_ns])
        hist = log_histogram(dur, title="GPU op durations (count of ops per log bin):")
        if hist:
            out += fence(hist) + [""]
    return out


def _visual_extras(results, inputs, has_roofline: bool) -> list[str]:
    """Memory over time, multi-GPU timeline (or why either is n/a), roofline availability,
    interactive viewers."""
    analyses, findings, multigpu = results.analyses, results.findings, results.multigpu
    out = []
    for run in results.runs:
        head = [f"Memory over time, {_label(run)}:", ""] if len(analyses) > 1 else ["Memory over time:", ""]
        out += head + memory_section(run.memory) + [""]
    if multigpu is not None:
        out += ["### Multi-GPU communication timeline", "",
                render_multigpu_section(multigpu), ""]
    else:
        ws = [a.trace.meta.world_size for a in analyses if (a.trace.meta.world_size or 1) > 1]
        if ws:
            out += [f"Multi-GPU timeline: n/a: the input holds {len(analyses)} of {max(ws)} ranks; pass every "
                    "rank's trace (a folder, a glob or a `--torchrun` capture folder) for the per-GPU lanes, "
                    "collective skew and stragglers.", ""]
    if not has_roofline:
        if any(f.rule == "bound" for fs in findings for f in fs):
            out += ["Roofline chart: n/a here (no Nsight Compute metrics); the roofline estimated from op "
                    "shapes is summarized in Observations (memory- vs compute-bound kernels).", ""]
        else:
            out += ["Roofline: n/a: no Nsight Compute metrics and no recorded op shapes (capture with "
                    "`record_shapes=True`, or add an ncu report) to place kernels against the roofline.", ""]
    ins = " ".join(inputs) if inputs else "TRACE"
    out += ["Interactive exploration: `tracestory export perfetto " + ins + " -o timeline.json.gz` writes this "
            "analyzed timeline (categories, phases, idle gaps as annotations) for https://ui.perfetto.dev or "
            "chrome://tracing; the raw inputs also open there (Kineto JSON) or in the Nsight Systems / "
            "Nsight Compute UIs (.nsys-rep, .ncu-rep).", ""]
    return out


def _demote(markdown: str, levels: int) -> str:
    """Headings one or more levels deeper (outside code fences), to embed a document."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,5} ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def _batch_summary(b) -> str:
    """The serving run in one paragraph: load, latency, how iteration time follows the batch."""
    n = len(b.requests)
    parts = [f"**Serving run**: {n} requests, {sum(b.kinds.values())} scheduler iterations "
             f"({', '.join(f'{v} {k}' for k, v in sorted(b.kinds.items()))})"]
    if b.ttft.count:
        parts.append(f"TTFT p50 {fmt_ns(b.ttft.p50_ns)} / p99 {fmt_ns(b.ttft.p99_ns)}, "
                     f"end-to-end p50 {fmt_ns(b.e2e.p50_ns)}")
    if b.iteration_ns.count:
        parts.append(f"iteration time p50 {fmt_ns(b.iteration_ns.p50_ns)}")
    text = "; ".join(parts) + "."
    c = b.client
    if c is not None and c.achieved_qps is not None:
        good = f", goodput {fmt_pct(c.goodput_fraction)}" if c.goodput_fraction is not None else ""
        text += (f" The load generator achieved {c.achieved_qps:.2f} req/s with {c.failed} failed{good}; "
                 f"its TTFT p50 {fmt_ns(c.ttft.p50_ns)}, ITL p50 {fmt_ns(c.itl.p50_ns)}.")
    if b.stalls:
        worst = max(b.stalls, key=lambda x: x.duration_ns)
        text += (f" {len(b.stalls)} engine stall(s); the longest, iteration {worst.iter}, took "
                 f"{fmt_ns(worst.duration_ns)} ({worst.times_median:.0f}x the median) while "
                 f"{worst.arrivals_during} request(s) arrived (Execution Story: Engine stalls).")
    f = b.fit
    if f is not None and f.r_squared is not None:
        terms = []
        if f.b_prefill_ns_per_token is not None:
            terms.append(f"{fmt_ns(f.b_prefill_ns_per_token)} per prefill token")
        if f.b_decode_ns_per_seq is not None:
            terms.append(f"{fmt_ns(f.b_decode_ns_per_seq)} per decode sequence")
        text += (f" Iteration time = {fmt_ns(f.a_ns)} + " + " + ".join(terms) + f" (R^2 {f.r_squared:.2f})."
                 if terms else "")
    if b.preemptions:
        text += (f" {len(b.preemptions)} preemption(s): the KV cache ran out; recommendation: more KV "
                 "blocks (memory) or a lower --max-num-seqs.")
    elif f is not None and f.b_decode_ns_per_seq is not None and f.a_ns > 0:
        text += (" Recommendation: raise the batch (more concurrent requests or --max-num-seqs) while "
                 "the per-sequence cost stays below the fixed per-iteration cost.")
    return text


def _multigpu_summary(multigpu, fs) -> list[str]:
    if multigpu is None:
        return []
    h = headline(multigpu)
    rec = next((f.recommendation for f in fs if f.severity in ("high", "medium")), None)
    line = f"**{len(multigpu.ranks)} GPUs**: " + (h[:1].upper() + h[1:] if h else "no collective was matched across ranks.")
    return [line + (f" Recommendation: {rec}" if rec else ""), ""]


# Findings that are surprises by nature: behaviour the run's own steady state does not predict.
SURPRISE_RULES = ("first_step", "step_outlier", "cpu_stall", "multigpu_straggler", "multigpu_clocks")
SURPRISE_CHECKS = "first-step/JIT outliers, step-time outliers, idle gaps caused by one host op"


def _surprises(findings, multigpu, multigpu_fs=()) -> list[str]:
    """One line ahead of the findings: what was unexpected, or which checks found nothing."""
    fs = [f for group in findings for f in group] + list(multigpu_fs)
    hits = [f.title for f in fs if f.rule in SURPRISE_RULES]
    if hits:
        return ["**Surprises**: " + "; ".join(hits) + " (details below).", ""]
    checks = SURPRISE_CHECKS + (", a straggler GPU" if multigpu is not None else "")
    return [f"**Surprises**: none found by the checks for {checks}.", ""]


def _multigpu_observations(multigpu, fs) -> list[str]:
    if multigpu is None:
        return []
    out = ["### Multi-GPU", ""]
    for i, f in enumerate(fs, 1):
        out += [f"#### {i}. [{f.severity.upper()}] {f.title}", ""]
        out += [f"- {e.label}: {fmt_evidence(e)}" for e in f.evidence]
        out += ["", f"**Implication**: {f.implication}", "", f"**Recommendation**: {f.recommendation}", ""]
    return out


def _timeline_chart(a, t0: int, t1: int) -> list[str]:
    tr, cl = a.trace, a.classification
    cats = tuple(cl.taxonomy.categories)
    dev = gpu_ops_column(tr, "device")
    stream = gpu_ops_column(tr, "stream")
    s = gpu_ops_column(tr, "start_ns")
    e = gpu_ops_column(tr, "end_ns")
    c = np.concatenate([cl.kernel_category, cl.memop_category])
    lanes = []
    pairs = [tuple(map(int, p)) for p in np.unique(np.stack([dev, stream], axis=1), axis=0)] if len(dev) else []
    for d, x in pairs[:8]:
        sel = (dev == d) & (stream == x)
        lanes.append(Lane(f"gpu{d} s{x}", s[sel], e[sel], c[sel]))
    phs = [p for p in a.phases.phases if p.gpu_start_ns is not None]
    markers = []
    if a.phases.source != "none" and phs:
        segs = np.array([[p.gpu_start_ns, p.gpu_end_ns] for p in phs])
        markers.append(("phases(GPU)", segs, [p.name for p in phs]))
    inside = np.flatnonzero((s < t1) & (e > t0))
    hot = int(inside[np.argmax((e - s)[inside])]) if inside.size else int(np.argmax(e - s))
    hotspot = (int(s[hot]), f"longest op: {short_name(tr.name(int(gpu_ops_column(tr, 'name')[hot])), 40)}"
                            f" {fmt_ns(int(e[hot] - s[hot]))}")
    lines = lanes_timeline(lanes, cats, t0, t1, hotspot=hotspot, markers=markers)
    if len(pairs) > 8:
        lines.append(f"({len(pairs) - 8} more streams not drawn)")
    return lines


def _hardware(analyses) -> list[str]:
    out = ["n/a: no Nsight Compute input; pass an .ncu-rep or ncu CSV. What the trace itself "
           "says about the top kernels' launch configurations:", ""]
    for a in analyses:
        if len(analyses) > 1:
            out += [f"### {_label(a)}", ""]
        k = a.trace.kernels
        sms = next((d.sm_count for d in a.trace.meta.devices if d.sm_count), None)
        rows = []
        for ks in a.breakdown.kernels[:10]:
            code = a.trace.code_of(ks.name)
            i = np.flatnonzero(k["name"] == code)
            if i.size == 0:
                continue  # a memop
            i = i[0]
            blocks = int(k["grid_x"][i]) * int(k["grid_y"][i]) * int(k["grid_z"][i]) if k["grid_x"][i] >= 0 else None
            grid = f"{k['grid_x'][i]}x{k['grid_y'][i]}x{k['grid_z'][i]}" if blocks else "n/a"
            block = f"{k['block_x'][i]}x{k['block_y'][i]}x{k['block_z'][i]}" if k["block_x"][i] >= 0 else "n/a"
            regs = int(k["registers_per_thread"][i]) if k["registers_per_thread"][i] >= 0 else "n/a"
            smem = fmt_bytes(int(k["shared_mem_bytes"][i])) if k["shared_mem_bytes"][i] >= 0 else "n/a"
            per_sm = f"{blocks / sms:.2f}" if blocks and sms else "n/a"
            rows.append((f"`{short_name(ks.name, 50)}`", fmt_ns(ks.mean_ns), grid, block, regs, smem, per_sm))
        if rows:
            out += md_table(("kernel (top by time)", "mean", "grid", "block", "regs/thread",
                             "shared mem", "blocks per SM"), rows, "lrrrrrr")
            out += ["", "Blocks per SM below 1 leaves SMs idle for the kernel's whole duration "
                    "(a small-grid, latency-bound launch, typical of decode GEMV-like kernels)."]
        out.append("")
    return out


def _observations(findings, analyses) -> list[str]:
    out = []
    for a, fs in zip(analyses, findings):
        if len(analyses) > 1:
            out += [f"### {_label(a)}", ""]
        if not fs:
            out += ["No rule fired.", ""]
        for i, f in enumerate(fs, 1):
            out += [f"#### {i}. [{f.severity.upper()}] {f.title}", ""]
            out += [f"- {e.label}: {fmt_evidence(e)}" for e in f.evidence]
            out += ["", f"**Implication**: {f.implication}", "",
                    f"**Recommendation**: {f.recommendation}", ""]
    return out


def _appendix(analyses, inputs, command) -> list[str]:
    out = []
    for a in analyses:
        if len(analyses) > 1:
            out += [f"### {_label(a)}", ""]
        b, tl, phs = a.breakdown, a.timeline, a.phases
        out += ["**Categories** (share of GPU op time; ceiling = 1/(1-p); "
                f"what-if = category {b.speedup_factor:g}x faster)", ""]
        out += md_table(("category", "time (ms)", "ops", "share", "mean", "Amdahl ceiling", "what-if"),
                        [(c.name, fmt_ms(c.time_ns), c.count, f"{c.percent:.1f}%", fmt_ns(c.mean_ns),
                          f"{c.amdahl_max_speedup:.2f}x" if c.amdahl_max_speedup is not None else "unbounded",
                          f"{c.whatif_speedup:.2f}x") for c in b.categories], "lrrrrrr")
        out += ["", "**Top kernels**", ""]
        out += md_table(("kernel", "category", "time (ms)", "count", "mean", "share"),
                        [(f"`{short_name(x.name, 60)}`", x.category, fmt_ms(x.time_ns), x.count,
                          fmt_ns(x.mean_ns), f"{x.percent:.1f}%") for x in b.kernels], "llrrrr")
        out += ["", f"**Phases** (source: {phs.source})", ""]
        out += md_table(("#", "phase", "CPU wall (ms)", "GPU span (ms)", "GPU busy (ms)", "kernels", "memops"),
                        [(p.index, p.name, fmt_ms(p.wall_ns), fmt_ms(p.gpu_span_ns), fmt_ms(p.gpu_busy_ns),
                          p.kernel_count, p.memop_count) for p in phs.phases[:64]], "rlrrrrr")
        if len(phs.phases) > 64:
            out.append(f"({len(phs.phases) - 64} more phases not listed)")
        if tl is not None:
            out += ["", "**Timeline**", ""]
            ll = tl.launch_latency
            out += md_table(("quantity", "value"), [
                ("GPU window", fmt_ns(tl.window_ns)), ("busy (union)", fmt_ns(tl.busy_ns)),
                ("plain sum of op durations", fmt_ns(tl.sum_ns)), ("idle", fmt_ns(tl.idle_ns)),
                ("idle waiting for launch", fmt_ns(tl.idle_launch_wait_ns)),
                ("idle other", fmt_ns(tl.idle_other_ns)), ("gaps", tl.gap_count),
                ("kernels per ms", f"{tl.kernels_per_ms:.2f}"),
                (f"kernels < {fmt_ns(tl.short_kernel_ns)}", fmt_pct(tl.short_kernel_share)),
                ("launch latency p50 / p90 / p99",
                 f"{fmt_ns(ll.p50_ns)} / {fmt_ns(ll.p90_ns)} / {fmt_ns(ll.p99_ns)} ({ll.count} ops)"),
                ("launch-bound verdict", "yes" if tl.launch_bound else "no")], "lr")
            out += ["", "**Idle gap histogram**", ""]
            out += md_table(("gap length", "count", "total"),
                            [(lab, n, fmt_ns(t)) for lab, n, t in tl.gap_histogram], "lrr")
            out += ["", "**Largest gaps**", ""]
            out += md_table(("at (ms from window start)", "length", "launch wait", "after", "before"),
                            [(fmt_ms(g.start_ns - tl.start_ns), fmt_ns(g.dur_ns), fmt_ns(g.launch_wait_ns),
                              f"`{short_name(g.before, 40)}`", f"`{short_name(g.after, 40)}`")
                             for g in tl.largest_gaps], "rrrll")
            out += ["", "**Streams**", ""]
            out += md_table(("device", "stream", "busy", "ops"),
                            [(s.device, s.stream, fmt_ns(s.busy_ns), s.op_count) for s in tl.streams], "rrrr")
        out.append("")
    out += ["**Inputs**", ""] + ([f"- `{p}`" for p in inputs] or ["- n/a (not given)"]) + [""]
    out += ["**Command**", ""] + fence([command or "n/a (not given)"], "bash") + [""]
    return out


def _reproduction(inputs, command) -> list[str]:
    ins = " ".join(inputs) if inputs else "TRACE.json.gz"
    return ["To regenerate this report from the same trace(s):", "",
            *fence([command or f"tracestory report {ins} -o report.md"], "bash"), "",
            "To get the numbers behind it as JSON:", "",
            *fence([f"tracestory analyze {ins} --json results.json"], "bash"), "",
            "To re-capture: run the workload under `torch.profiler.profile(activities=[CPU, CUDA], "
            "record_shapes=True, profile_memory=True)` with `record_function` ranges around each "
            "phase (or a `schedule` so each iteration is a `ProfilerStep`), then "
            "`prof.export_chrome_trace(...)`.", ""]


# ------------------------------------------------------------------ the report


@dataclass(frozen=True)
class Context:
    """What every section reads: the results, the inputs as the report lists them, and the
    PNG plots written beside the report (empty without ``--plots``)."""

    results: object                      # analysis.results.Results
    inputs: tuple[str, ...]
    plots: tuple[Path, ...] = ()

    @property
    def command(self) -> str | None:
        return self.results.options.command


def _executive_section(c: Context) -> list[str]:
    r = c.results
    head = [_batch_summary(r.batching), ""] if r.batching is not None else []
    return head + _multigpu_summary(r.multigpu, r.multigpu_findings) + _executive(r.analyses, r.findings)


def _environment_section(c: Context) -> list[str]:
    m = c.results.manifest
    return [render_environment(m).strip(), ""] if m else _environment(c.results.analyses)


def _actions_section(c: Context) -> list[str]:
    m = c.results.manifest
    if m:
        return [render_actions_log(m).strip(), ""]
    return ["tracestory read the input trace(s) and ran no capture of its own; the "
            "capture's own actions log is n/a (no capture manifest given).", "",
            *fence([c.command or "n/a (not given)"], "bash"), ""]


def _story_section(c: Context) -> list[str]:
    r = c.results
    out = []
    if r.batching is not None:
        out += [_demote(render_batch_story(r.batching).strip(), 1) + ("\n\n### Kernel timeline" if r.runs else ""), ""]
    for run in r.runs:
        if len(r.runs) > 1:
            out += [f"### {_label(run)}", ""]
        out += fence(execution_story(run.analysis, run.gap_causes)) + [""]
    return out


def _has_roofline(r) -> bool:
    return bool(r.hardware) or any(run.roofline_estimate is not None and run.roofline_estimate.points
                                   for run in r.runs)


def _visualizations_section(c: Context) -> list[str]:
    out = _visualizations(c.results.analyses) + _visual_extras(c.results, list(c.inputs), _has_roofline(c.results))
    if c.plots:
        out += ["Plots (PNG):", "", "\n".join(f"![{p.stem}]({p.name})" for p in c.plots), ""]
    return out


def _hardware_section(c: Context) -> list[str]:
    r = c.results
    if r.hardware:
        return [hardware_section(r.hardware).strip(), ""]
    estimate = estimated_roofline_section(r.runs)
    return _hardware(r.analyses) + ([estimate.strip(), ""] if estimate else [])


def _observations_section(c: Context) -> list[str]:
    r = c.results
    return (_surprises(r.findings, r.multigpu, r.multigpu_findings) + _multigpu_observations(r.multigpu, r.multigpu_findings)
            + _observations(r.findings, r.analyses))


def _reproduction_section(c: Context) -> list[str]:
    m = c.results.manifest
    return [render_reproduction(m).strip(), ""] if m else _reproduction(list(c.inputs), c.command)


@dataclass(frozen=True)
class Section:
    """One heading of the report and the function that writes its body (a list of lines)."""

    title: str
    render: Callable[[Context], list[str]]


SECTIONS: tuple[Section, ...] = (
    Section("Executive Summary", _executive_section),
    Section("Environment", _environment_section),
    Section("Codebase Analysis Summary", lambda c: _codebase(c.results.runs)),
    Section("Goal Interpretation", lambda c: _goal(c.results.options.goal, c.results.options.questions,
                                                   c.results.analyses)),
    Section("Actions Log", _actions_section),
    Section("Execution Story", _story_section),
    Section("Visualizations", _visualizations_section),
    Section("Hardware Behavior Analysis", _hardware_section),
    Section("Observations and Insights", _observations_section),
    Section("Reproduction Guide", _reproduction_section),
    Section("Appendix", lambda c: _appendix(c.results.analyses, list(c.inputs), c.command)),
)
SECTION_TITLES = tuple(s.title for s in SECTIONS)


def report_inputs(results) -> tuple[str, ...]:
    """The inputs as the report lists them (as given on the command line)."""
    return tuple(str(p) for p in results.inputs.paths)


def render_report(results, *, plots: Sequence[Path] = ()) -> str:
    """The whole report of ``results`` (:class:`~tracestory.analysis.results.Results`) as
    Markdown text (ends with one newline). ``plots``: PNG files written beside the report,
    linked from Visualizations."""
    ctx = Context(results, report_inputs(results), tuple(plots))
    if not results.runs:
        return _render_without_traces(ctx)
    name = _label(results.runs[0]) if len(results.runs) == 1 else f"{len(results.runs)} traces"
    out = [f"# Hands-On Learning Report: {name}", ""]
    for sec in SECTIONS:
        out += [f"## {sec.title}", ""] + sec.render(ctx)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def _render_without_traces(c: Context) -> str:
    """A report for inputs that hold no timeline trace (an Nsight Compute capture alone, or a
    scheduler event log): the sections that need a trace say so; Observations hold the hardware
    findings of the kernel metrics."""
    r = c.results
    inputs = list(c.inputs)
    missing = "n/a: the inputs hold no timeline trace (Kineto or Nsight Systems), only per-kernel metrics."
    name = ", ".join(p.rstrip("/").split("/")[-1] for p in inputs) or "inputs"
    hw = hardware_section(r.hardware).strip() if r.hardware else ""
    fs = r.ncu_findings
    summary = ("Per-kernel hardware metrics only (no timeline); the key numbers are in Hardware Behavior "
               "Analysis. Add a torch.profiler or nsys capture of the same run for the execution story."
               if hw else missing)
    key = [f for f in fs if f.severity in ("high", "medium")][:2] or list(fs[:1])
    if key:
        summary += " Key insight: " + "; ".join(f.title for f in key) + f". Recommendation: {key[0].recommendation}"
    extra = {"Hardware Behavior Analysis": hw}
    if r.manifest:
        extra["Environment"] = render_environment(r.manifest)
        extra["Actions Log"] = render_actions_log(r.manifest)
        extra["Reproduction Guide"] = render_reproduction(r.manifest)
    if r.batching is not None:
        summary = _batch_summary(r.batching)
        missing = "n/a: the inputs hold a scheduler event log but no timeline trace (Kineto or Nsight Systems)."
        extra["Execution Story"] = _demote(render_batch_story(r.batching).strip(), 1)
    out = [f"# Hands-On Learning Report: {name}", ""]
    for title in SECTION_TITLES:
        out += [f"## {title}", ""]
        if title == "Executive Summary":
            out += [summary, ""]
        elif title == "Observations and Insights" and fs:
            out += _surprises([fs], None) + _observations([fs], [None])
        elif title == "Visualizations" and r.batching is not None:
            out += ["The charts of this serving run (KV cache blocks and device memory over time) are in the "
                    "Execution Story. Kernel timeline, breakdown and roofline: n/a (no trace; capture the "
                    "server with `tracestory capture ... --load` to add one).", "",
                    "Interactive exploration: add a Kineto or nsys trace of the run and open it with "
                    "`tracestory export perfetto` in https://ui.perfetto.dev.", ""]
        elif title == "Visualizations" and hw:
            out += [missing.replace("n/a:", "Timeline: n/a:"), "",
                    "Interactive exploration: open the .ncu-rep in the Nsight Compute UI (ncu-ui) for the "
                    "source-level and per-section views behind these numbers.", ""]
        elif extra.get(title, "").strip():
            out += [extra[title].strip(), ""]
        elif title == "Appendix":
            out += ["**Inputs**", "", *[f"- `{p}`" for p in inputs], "", "**Command**", "",
                    *fence([c.command or "n/a (not given)"], "bash"), ""]
        else:
            out += [missing, ""]
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
