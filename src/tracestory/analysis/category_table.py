"""The ``categories`` command: seed 002's MoE kernel categorization and Amdahl ceiling,
generalized to every input (nsys report/SQLite/CSV, Kineto).

Model
-----
Every kernel and memop row of every given trace (all ranks together) is put in one category
of the taxonomy (default ``moe``: expert_gemm, attention_gemm, gate_gemm, routing_permute,
quant_dequant, norm, allreduce, other; rules in :mod:`tracestory.analysis.categories`, range
rules included). Per category: total duration, share of the total, row count and sample names
(the longest-running distinct names). Durations are integer ns summed exactly; the shares'
base is the plain sum of GPU op durations (kernels + memops), as in
:mod:`tracestory.analysis.breakdown`, not wall time.

Amdahl ceiling for the expert GEMMs: with ``p`` the expert_gemm share, infinitely fast expert
GEMMs speed the GPU work up by at most ``1 / (1 - p)`` (``None`` when ``p == 1``: unbounded).
The assumption is that everything else (routing, permute, quant/dequant, allreduce, ...) keeps
its time and that GPU op time bounds the run.

The JSON keeps seed 002's fields (time in ms, percent, kernel count, sample names, the Amdahl
note) and adds exact ns values.
"""

from __future__ import annotations

import numpy as np

from ..trace import Trace
from .breakdown import amdahl
from .categories import Taxonomy, classify
from .categories import taxonomy as builtin_taxonomy

EXPERT = "expert_gemm"


def _explain(category: str, p: float, ceiling: float | None) -> str:
    if ceiling is None:
        return (f"{category} is all of the GPU op time: making it infinitely fast removes all of it, "
                "so the ceiling is unbounded.")
    if p == 0:
        return f"{category} takes no GPU time in this input: optimizing it cannot speed this run up (ceiling 1.00x)."
    return (f"{category} is {100 * p:.1f}% of GPU op time. Even infinitely fast {category} kernels leave the "
            f"other {100 * (1 - p):.1f}% (routing, permute, quant/dequant, allreduce, attention, ...), so the "
            f"GPU work can get at most 1 / (1 - {p:.3f}) = {ceiling:.2f}x faster (Amdahl's law).")


def seed002_categories(trace_or_traces: Trace | list[Trace] | tuple[Trace, ...],
                       taxonomy: str | Taxonomy = "moe", *, samples: int = 5,
                       amdahl_category: str = EXPERT) -> dict:
    """Per-category GPU time of all given traces, with the Amdahl ceiling for ``amdahl_category``.

    Returns a JSON-ready dict (see the module docstring); categories in taxonomy order, empty
    ones included so that the layout is the same for every input.
    """
    traces = [trace_or_traces] if isinstance(trace_or_traces, Trace) else list(trace_or_traces)
    tax = builtin_taxonomy(taxonomy) if isinstance(taxonomy, str) else taxonomy
    n_cat = len(tax.categories)
    time_ns = np.zeros(n_cat, np.int64)
    count = np.zeros(n_cat, np.int64)
    per_name: dict[tuple[int, str], int] = {}
    kernel_count = memop_count = 0
    for trace in traces:
        cls = classify(trace, tax)
        for table, cats in ((trace.kernels, cls.kernel_category), (trace.memops, cls.memop_category)):
            if len(table) == 0:
                continue
            dur = table.dur_ns.astype(np.int64)
            np.add.at(time_ns, cats, dur)
            count += np.bincount(cats, minlength=n_cat)
            # time per (category, name code), then names looked up once per distinct pair
            key = cats.astype(np.int64) * (len(trace.strings) + 1) + table["name"].astype(np.int64)
            uniq, inv = np.unique(key, return_inverse=True)
            sums = np.bincount(inv.reshape(-1), weights=dur, minlength=len(uniq))
            for k, s in zip(uniq.tolist(), sums.tolist()):
                c, code = divmod(k, len(trace.strings) + 1)
                name = trace.name(code)
                per_name[(c, name)] = per_name.get((c, name), 0) + int(s)
        kernel_count += len(trace.kernels)
        memop_count += len(trace.memops)
    total = int(time_ns.sum())
    categories = []
    for c, name in enumerate(tax.categories):
        top = sorted(((t, n) for (cc, n), t in per_name.items() if cc == c), key=lambda x: (-x[0], x[1]))
        categories.append({
            "category": name,
            "time_ns": int(time_ns[c]),
            "time_ms": time_ns[c] / 1e6,
            "percent": 100.0 * time_ns[c] / total if total else None,
            "kernel_count": int(count[c]),
            "sample_kernels": [n for _, n in top[:samples]],
        })
    result = {
        "taxonomy": tax.name,
        "inputs": sorted({t.meta.source_path for t in traces}),
        "trace_count": len(traces),
        "has_timeline": all(t.meta.has_timeline for t in traces),
        "kernel_count": kernel_count,
        "memop_count": memop_count,
        "total_time_ns": total,
        "total_time_ms": total / 1e6,
        "percent_base": "sum of kernel and memop durations (GPU op time, not wall time)",
        "categories": categories,
    }
    if amdahl_category in tax.categories and total:
        p = float(time_ns[tax.index(amdahl_category)]) / total
        ceiling, _ = amdahl(p, 2.0)
        result["amdahl"] = {"category": amdahl_category, "percent": 100.0 * p, "max_speedup": ceiling,
                            "formula": "1 / (1 - p)", "explanation": _explain(amdahl_category, p, ceiling)}
    else:
        why = "no GPU time in the input" if not total else f"taxonomy {tax.name!r} has no {amdahl_category!r} category"
        result["amdahl"] = {"category": amdahl_category, "percent": None, "max_speedup": None,
                            "formula": "1 / (1 - p)", "explanation": f"n/a: {why}"}
    return result


def seed002_table(result: dict) -> str:
    """The human table seed 002 printed (category, time ms, %, kernel count) plus the Amdahl line."""
    lines = [f"{'category':<18} {'time (ms)':>12} {'%':>7} {'kernels':>9}"]
    for c in result["categories"]:
        pct = "n/a" if c["percent"] is None else f"{c['percent']:.1f}"
        lines.append(f"{c['category']:<18} {c['time_ms']:>12.3f} {pct:>7} {c['kernel_count']:>9}")
    lines.append(f"{'total':<18} {result['total_time_ms']:>12.3f} {'100.0' if result['total_time_ns'] else 'n/a':>7} "
                 f"{result['kernel_count'] + result['memop_count']:>9}")
    lines.append("")
    lines.append(f"Amdahl ceiling ({result['amdahl']['category']}): {result['amdahl']['explanation']}")
    return "\n".join(lines)
