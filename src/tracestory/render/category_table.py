"""The kernel-category table (``tracestory categories``): per category of the taxonomy, the GPU op
time of all given traces together, its share, its row count and sample kernel names, and the
Amdahl ceiling of one category; as JSON and as a plain-text table.

It formats a :class:`~tracestory.analysis.category_totals.CategoryTotals` (all ranks or processes
together; the model and the Amdahl ceiling are described there): times are exact integer ns
sums; the shares' base is the plain sum of GPU op durations (kernels + memops), not wall time.
Categories come in taxonomy order, empty ones included, so the layout is the same for every
input.
"""

from __future__ import annotations

from ..analysis.category_totals import CategoryTotals
from ..units import fmt_pct

PERCENT_BASE = "sum of kernel and memop durations (GPU op time, not wall time)"


def _explain(category: str, p: float, ceiling: float | None) -> str:
    if ceiling is None:
        return (
            f"{category} is all of the GPU op time: making it infinitely fast removes all of it, "
            "so the ceiling is unbounded."
        )
    if p == 0:
        return f"{category} takes no GPU time in this input: optimizing it cannot speed this run up (ceiling 1.00x)."
    return (
        f"{category} is {fmt_pct(p)} of GPU op time. Even infinitely fast {category} kernels leave the "
        f"other {fmt_pct(1 - p)} (routing, permute, quant/dequant, allreduce, attention, ...), so the "
        f"GPU work can get at most 1 / (1 - {p:.3f}) = {ceiling:.2f}x faster (Amdahl's law)."
    )


def category_table(t: CategoryTotals) -> dict:
    """The JSON document of the table (see the module docstring)."""
    total = t.total_time_ns
    categories = [
        {
            "category": c.name,
            "time_ns": c.time_ns,
            "time_ms": c.time_ns / 1e6,
            "percent": 100.0 * c.time_ns / total if total else None,
            "kernel_count": c.count,
            "sample_kernels": list(c.sample_kernels),
        }
        for c in t.categories
    ]
    result = {
        "taxonomy": t.taxonomy,
        "inputs": list(t.inputs),
        "trace_count": t.trace_count,
        "has_timeline": t.has_timeline,
        "kernel_count": t.kernel_count,
        "memop_count": t.memop_count,
        "total_time_ns": total,
        "total_time_ms": total / 1e6,
        "percent_base": PERCENT_BASE,
        "categories": categories,
    }
    if t.amdahl_share is not None:
        p = t.amdahl_share
        result["amdahl"] = {
            "category": t.amdahl_category,
            "percent": 100.0 * p,
            "max_speedup": t.amdahl_max_speedup,
            "formula": "1 / (1 - p)",
            "explanation": _explain(t.amdahl_category, p, t.amdahl_max_speedup),
        }
    else:
        result["amdahl"] = {
            "category": t.amdahl_category,
            "percent": None,
            "max_speedup": None,
            "formula": "1 / (1 - p)",
            "explanation": f"n/a: {t.amdahl_na}",
        }
    return result


def category_table_text(result: dict) -> str:
    """The table as text (category, time in ms, %, rows) plus the Amdahl line."""
    lines = [f"{'category':<18} {'time (ms)':>12} {'%':>7} {'kernels':>9}"]
    for c in result["categories"]:
        pct = "n/a" if c["percent"] is None else f"{c['percent']:.1f}"
        lines.append(f"{c['category']:<18} {c['time_ms']:>12.3f} {pct:>7} {c['kernel_count']:>9}")
    lines.append(
        f"{'total':<18} {result['total_time_ms']:>12.3f} {'100.0' if result['total_time_ns'] else 'n/a':>7} "
        f"{result['kernel_count'] + result['memop_count']:>9}"
    )
    lines.append("")
    lines.append(f"Amdahl ceiling ({result['amdahl']['category']}): {result['amdahl']['explanation']}")
    return "\n".join(lines)
