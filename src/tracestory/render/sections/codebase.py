"""Codebase Analysis Summary: kernel families, execution mode, precisions and the attention
implementation, as the kernel names and op input types show them."""

from __future__ import annotations

import re

import numpy as np

from ...units import fmt_ns, fmt_pct
from ..md import label, md_table, short_name
from ..story import parse_json_cell
from . import Context

_PRECISIONS: tuple[tuple[str, str], ...] = (
    ("fp8", r"fp8|e4m3|e5m2|Float8"),
    ("bf16", r"bf16|BFloat16|bfloat16"),
    ("fp16", r"(?<![b])f16|fp16|half|Half"),
    ("tf32", r"tf32"),
    ("fp32", r"(?<![a-z])float(?![0-9])|f32|fp32|s1688gemm"),
)


def _precisions(a) -> tuple[list[str], list[str]]:
    """Precisions named by kernel names, and by recorded op input dtypes (GEMM/attention ops)."""
    tr = a.trace
    kn = [tr.name(int(c)) for c in np.unique(tr.kernels["name"])]
    ot: list[str] = []
    if len(tr.ops):
        codes = [
            i
            for i, s in enumerate(tr.strings)
            if s in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::_scaled_mm")
            or "scaled_dot_product" in s
        ]
        sel = np.flatnonzero(np.isin(tr.ops["name"], codes))
        for v in dict.fromkeys(tr.ops["input_types"][sel].tolist()):
            t = parse_json_cell(v)
            if isinstance(t, list):
                ot += [str(x) for x in t if x]

    def pick(texts) -> list[str]:
        return [p for p, pat in _PRECISIONS if any(re.search(pat, t) for t in texts)]

    return pick(kn), pick(sorted(set(ot)))


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
        _, op = _precisions(a)
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


def render(c: Context) -> list[str] | None:
    if c.serving_only:
        return None
    return [c.no_trace, ""] if c.no_trace else _codebase(c.shown)
