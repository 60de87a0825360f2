"""Codebase Analysis Summary: kernel families, execution mode, precisions and the attention
implementation, as the kernel names and op input types show them."""

from __future__ import annotations

from ...units import fmt_ns, fmt_pct
from ..md import label, md_table, short_name
from . import Context


def _codebase(runs) -> list[str]:
    out = []
    for run in runs:
        a = run.analysis
        if len(runs) > 1:
            out += [f"### {label(a)}", ""]
        fams = run.families
        total = sum(f[2] for f in fams) or 1
        out += md_table(
            ("kernel family", "ops", "time", "share", "top kernel"),
            [(f, n, fmt_ns(t), fmt_pct(t / total), f"`{short_name(k, 60)}`") for f, n, t, k in fams],
            "lrrrl",
        )
        out.append("")
        facts = run.kernel_facts
        kind = run.facts.kind
        mode = (
            f"stream capture ({'; '.join(kind.evidence)}): the launches were recorded into a graph, not run"
            if kind.kind == "stream_capture"
            else facts.execution_mode
        )
        out.append(f"- Execution mode: {mode}")
        op = facts.op_input_precisions
        named = ", ".join(f"{p} ({fmt_pct(sh)} of kernel time)" for p, sh in facts.precisions)
        out.append(
            f"- Precisions in GEMM/attention op inputs: {', '.join(op) if op else 'n/a (no op input types recorded)'}; "
            f"named in kernel names: {named or 'none'}"
        )
        if facts.attention:
            out.append(
                "- Attention implementation: "
                + "; ".join(f"{impl} x{n} ({fmt_ns(t)})" for impl, n, t in facts.attention)
            )
        if facts.unfused_attention:
            out.append("- Attention: unfused (bmm + softmax ops): " + "; ".join(facts.unfused_attention[:2]))
        elif not facts.attention:
            out.append("- Attention implementation: none found (no attention-category kernels)")
        out.append("")
    return out


def render(c: Context) -> list[str]:
    return [c.no_trace, ""] if c.no_trace else _codebase(c.shown)
