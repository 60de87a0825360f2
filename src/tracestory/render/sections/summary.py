"""Executive Summary: the serving run, the GPUs, and per trace what ran, how busy the GPU was,
the key findings and the first recommendation."""

from __future__ import annotations

from ...units import fmt_ns, fmt_pct, plural
from ..md import label
from ..window import window_lines
from . import Context

_WORKLOAD_WORDS = {
    "llm_decode": "LLM decode",
    "llm_prefill": "LLM prefill",
    "llm_generate": "LLM generation (prefill and decode)",
    "llm_serving": "LLM serving (batched prefill and decode)",
    "llm_training": "LLM training",
    "transformer": "transformer (non-generative)",
    "vision": "vision",
    "diffusion": "diffusion",
    "recommender": "recommender (embedding tables)",
    "speech": "speech",
    "ml_other": "ML (kind not named by the trace)",
    "non_ml": "non-ML GPU compute",
}


def _producer(run) -> str:
    """What made the trace and what work it is, in words (analysis.producer, analysis.workload)."""
    p, w = run.producer, run.workload
    if p is None or p.framework == "unknown":
        what = ""
    else:
        what = ("a PyTorch program" if p.is_pytorch else "a program without PyTorch") + (
            f" ({p.engine})" if p.engine else ""
        )
    parts = [
        p.mode if p.mode != "unknown" else "",
        "torch.compile" if p.compiled else "",
        f"{fmt_pct(p.graphs.graph_time_fraction)} of kernel time replayed from "
        f"{p.graphs.graph_launches} graph launch{'es' if p.graphs.graph_launches != 1 else ''}"
        if p.graphs.graph_kernels
        else "",
        p.platform if p.platform != "unknown" else "",
    ]
    detail = ", ".join(x for x in parts if x)
    if what:
        text = f"Made by {what}" + (f": {detail}." if detail else ".")
    elif detail:
        text = f"Made by a program whose framework the trace cannot show: {detail}."
    else:
        text = ""
    if w.kind in _WORKLOAD_WORDS:
        text += f" Workload: {_WORKLOAD_WORDS[w.kind]} ({w.evidence[0]})." if w.evidence else ""
    elif w.kind == "unknown":
        text += " Workload: not told by the trace's names."
    return text.strip()


def _executive(runs, many: bool = False) -> list[str]:
    out = []
    for run in runs:
        a, fs = run.analysis, run.findings
        b, tl = a.breakdown, a.timeline
        head = f"**{label(a)}**: " if many else ""
        s1 = (
            f"{head}The capture holds {b.kernel_count} kernel{'s' if b.kernel_count != 1 else ''} and "
            f"{b.memop_count} memory op{'s' if b.memop_count != 1 else ''} "
            f"({fmt_ns(b.total_time_ns)} of GPU op time)"
        )
        if tl is not None:
            s1 += (
                f" in a {fmt_ns(tl.window_ns)} GPU window, busy {fmt_pct(tl.busy_ns / tl.window_ns)}"
                if tl.window_ns
                else ""
            )
        s1 += (
            ", told as one phase (no step markers)."
            if a.phases.source == "none"
            else f" across {plural(len(a.phases.phases), 'phase')} from {a.phases.source!r}."
        )
        made = _producer(run)
        s1 += (" " + made) if made else ""
        key = [f for f in fs if f.severity in ("high", "medium")][:2] or list(fs[:1])
        s2 = "Key insight: " + "; ".join(f.title for f in key) + "." if key else ""
        s3 = f"Recommendation: {key[0].recommendation}" if key else ""
        out.append(" ".join(x for x in (s1, s2, s3) if x))
        out.append("")
    return out


FIT_R2_FLOOR = 0.5


def _batch_summary(b) -> str:
    """The serving run in one paragraph: load, latency, how iteration time follows the batch."""
    n = len(b.requests)
    parts = [
        f"**Serving run**: {n} requests, {sum(b.kinds.values())} scheduler iterations "
        f"({', '.join(f'{v} {k}' for k, v in sorted(b.kinds.items()))})"
    ]
    if b.ttft.count:
        parts.append(
            f"TTFT p50 {fmt_ns(b.ttft.p50_ns)} / p99 {fmt_ns(b.ttft.p99_ns)}, end-to-end p50 {fmt_ns(b.e2e.p50_ns)}"
        )
    if b.iteration_ns.count:
        parts.append(f"iteration time p50 {fmt_ns(b.iteration_ns.p50_ns)}")
    text = "; ".join(parts) + "."
    c = b.client
    if c is not None and c.achieved_qps is not None:
        good = f", goodput {fmt_pct(c.goodput_fraction)}" if c.goodput_fraction is not None else ""
        text += (
            f" The load generator achieved {c.achieved_qps:.2f} req/s with {c.failed} failed{good}; "
            f"its TTFT p50 {fmt_ns(c.ttft.p50_ns)}, ITL p50 {fmt_ns(c.itl.p50_ns)}."
        )
    if b.stalls:
        worst = max(b.stalls, key=lambda x: x.duration_ns)
        text += (
            f" {plural(len(b.stalls), 'engine stall')}; the longest, iteration {worst.iter}, took "
            f"{fmt_ns(worst.duration_ns)} ({worst.times_median:.0f}x the median) while "
            f"{plural(worst.arrivals_during, 'request')} arrived (Execution Story: Engine stalls)."
        )
    f = b.fit
    # A fit that explains little of the iteration time is no summary of it (it stays in the story).
    if f is not None and f.r_squared is not None and f.r_squared >= FIT_R2_FLOOR:
        terms = []
        if f.b_prefill_ns_per_token is not None:
            terms.append(f"{fmt_ns(f.b_prefill_ns_per_token)} per prefill token")
        if f.b_decode_ns_per_seq is not None:
            terms.append(f"{fmt_ns(f.b_decode_ns_per_seq)} per decode sequence")
        text += (
            f" Iteration time = {fmt_ns(f.a_ns)} + " + " + ".join(terms) + f" (R^2 {f.r_squared:.2f})." if terms else ""
        )
    text += _advice(b)
    return text


def _advice(b) -> str:
    """The serving run's recommendation (``analysis.serving_story.Advice``) as one sentence."""
    story = getattr(b, "story", None)  # None: a result without the story model (older JSON, a stand-in)
    a = story.advice if story is not None else None
    if a is None:
        return ""
    if a.kind == "more-kv":
        return (
            f" {plural(a.preemptions, 'preemption')}: the KV cache ran out; recommendation: more KV "
            "blocks (memory) or a lower --max-num-seqs."
        )
    w = a.waits
    if a.kind == "token-budget" and w is not None:
        budget = b.log.meta.max_batch_tokens
        said = [f"{plural(w.token_budget, 'wait')} on the token budget"] if w.token_budget else []
        said += [f"{plural(w.chunks, 'prompt')} split by it"] if w.chunks else []
        return (
            f" Requests were held by the token budget{f' ({budget} per iteration)' if budget else ''}, not by the "
            f"batch size: {', '.join(said)}; a larger batch would not have admitted them sooner. Recommendation: "
            "raise --max-num-batched-tokens, at the cost of longer mixed iterations."
        )
    if w is None:
        return ""
    if a.kind == "kv-wait":
        return (
            f" Requests waited for KV-cache blocks ({plural(w.kv_blocks, 'wait')}), not for a sequence slot: a "
            "higher --max-num-seqs would not have admitted them sooner. Recommendation: more KV blocks (more GPU "
            "memory for the cache)."
        )
    f = b.fit
    # the fit's costs are quoted only where the summary quotes the fit itself
    told = f.r_squared is not None and f.r_squared >= FIT_R2_FLOOR and f.b_decode_ns_per_seq > 0
    costs = (
        f"; an added sequence costs {fmt_ns(f.b_decode_ns_per_seq)} against {fmt_ns(f.a_ns)} fixed per iteration"
        if told
        else ""
    )
    if a.kind == "raise-batch":
        return (
            f" {plural(w.max_num_seqs, 'wait')} on the sequence limit (--max-num-seqs) held requests back{costs}. "
            "Recommendation: raise --max-num-seqs while an added sequence costs less than the fixed part of an "
            "iteration."
        )
    limit = b.log.meta.max_num_seqs
    return (
        f" No request waited for a sequence slot or KV blocks: the batch (at most {a.peak_batch} sequences"
        + (f" of --max-num-seqs {limit}" if limit else "")
        + f") was set by the offered load, not by the engine{costs}. No flag change is advised; to find the "
        "engine's capacity, raise the offered load until requests wait."
    )


def _multigpu_summary(multigpu, fs) -> list[str]:
    if multigpu is None:
        return []
    n = len(multigpu.ranks)
    if all(s.window_start_ns is None for s in multigpu.summaries):
        return [
            f"**{n} ranks, no GPU activity** in any of their traces (a CPU run): the multi-GPU "
            "analysis aligns GPU collective kernels, so it has nothing to compare; CPU collectives "
            "(gloo) are CPU ops, per rank in the Observations.",
            "",
        ]
    h = multigpu.headline
    rec = next((f.recommendation for f in fs if f.severity in ("high", "medium")), None)
    line = f"**{n} GPUs**: " + (h[:1].upper() + h[1:] if h else "no collective was matched across ranks.")
    return [line + (f" Recommendation: {rec}" if rec else ""), ""]


# Findings that are surprises by nature: behaviour the run's own steady state does not predict.


def _without_trace(c: Context) -> str:
    r = c.results
    if r.batching is not None:
        return _batch_summary(r.batching)
    text = (
        "Per-kernel hardware metrics only (no timeline); the key numbers are in Hardware Behavior "
        "Analysis. Add a torch.profiler or nsys capture of the same run for the execution story."
        if r.hardware
        else c.no_trace or ""
    )
    fs = r.ncu_findings
    key = [f for f in fs if f.severity in ("high", "medium")][:2] or list(fs[:1])
    if key:
        text += " Key insight: " + "; ".join(f.title for f in key) + f". Recommendation: {key[0].recommendation}"
    return text


def render(c: Context) -> list[str]:
    r = c.results
    if c.no_trace and r.batching is not None:  # a serving log alone: the sections a trace feeds are left out
        gone = (
            "timeline trace: no GPU timeline, kernels, hardware behaviour or observations; capture the server "
            "under load (`tracestory capture torch --load ... --range iteration -- "
            "tracestory serve ...`) to add them"
        )
        lims = _limitations(r.limitations) or ["**Limitations** (what these inputs cannot tell):", "", ""]
        return [_without_trace(c), ""] + lims[:-1] + [f"- {gone}.", ""]
    if c.no_trace:
        return [_without_trace(c), ""]
    head = window_lines(getattr(r.inputs, "window", None))
    head += [_batch_summary(r.batching), ""] if r.batching is not None else []
    return (
        head
        + _multigpu_summary(r.multigpu, r.multigpu_findings)
        + _many(r)
        + _executive(c.shown, many=len(r.runs) > 1)
        + _limitations(r.limitations)
    )


def _many(r) -> list[str]:
    """Many traces told once: how alike they are, and which differ."""
    sel = r.selection
    if sel is None:
        return []
    lo, med, hi = sel.total_ns
    text = f"**{len(r.runs)} traces**, told once: GPU op time {fmt_ns(lo)} to {fmt_ns(hi)} (median {fmt_ns(med)})"
    if sel.busy is not None:
        text += f", GPU busy {fmt_pct(sel.busy[0])} to {fmt_pct(sel.busy[2])} (median {fmt_pct(sel.busy[1])})"
    med_label = label(r.runs[sel.median])
    text += f". The sections below tell the median trace, {med_label}"
    if sel.outliers:
        text += " and the ones that differ: " + "; ".join(f"{label(r.runs[i])} ({w})" for i, w in sel.outliers)
    else:
        text += "; no trace differs from it by more than 10%"
    return [text + ". Every trace's numbers are in the Appendix table and the JSON.", ""]


def _limitations(lims) -> list[str]:
    """What these inputs could not support (analysis.limitations)."""
    if not lims:
        return []
    return (
        ["**Limitations** (what these inputs cannot tell):", ""] + [f"- {x.analysis}: {x.reason}" for x in lims] + [""]
    )
