"""The kernel-category table (``tracestory categories``): per category of the taxonomy, the GPU op
time of all given traces together, its share, its row count and sample kernel names, and the
Amdahl ceiling of one category; as JSON and as a plain-text table.

It formats :class:`~tracestory.analysis.breakdown.Breakdown` results, one per trace (all ranks
or processes together): times are the breakdowns' exact integer ns sums; the shares' base is the
plain sum of GPU op durations (kernels + memops), not wall time. Categories come in taxonomy
order, empty ones included, so the layout is the same for every input. Sample names are the
longest-running names of the category over all traces (each breakdown contributes its own top
names of that category; pass breakdowns computed with a large ``top`` for an exact ranking).

Amdahl ceiling for ``amdahl_category`` (default ``expert_gemm``) with share ``p``: infinitely fast
kernels of that category speed the GPU work up by at most ``1 / (1 - p)`` (``None`` when
``p == 1``: unbounded), assuming everything else keeps its time and GPU op time bounds the run.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis.breakdown import Breakdown, amdahl
from ..analysis.categories import Taxonomy
from ..trace import Trace
from ..units import fmt_pct

EXPERT = "expert_gemm"
PERCENT_BASE = "sum of kernel and memop durations (GPU op time, not wall time)"


def _explain(category: str, p: float, ceiling: float | None) -> str:
    if ceiling is None:
        return (f"{category} is all of the GPU op time: making it infinitely fast removes all of it, "
                "so the ceiling is unbounded.")
    if p == 0:
        return f"{category} takes no GPU time in this input: optimizing it cannot speed this run up (ceiling 1.00x)."
    return (f"{category} is {fmt_pct(p)} of GPU op time. Even infinitely fast {category} kernels leave the "
            f"other {fmt_pct(1 - p)} (routing, permute, quant/dequant, allreduce, attention, ...), so the "
            f"GPU work can get at most 1 / (1 - {p:.3f}) = {ceiling:.2f}x faster (Amdahl's law).")


def category_table(breakdowns: Sequence[Breakdown], traces: Sequence[Trace], taxonomy: Taxonomy, *,
                   samples: int = 5, amdahl_category: str = EXPERT) -> dict:
    """The JSON document of the table (see the module docstring); ``breakdowns[i]`` is of
    ``traces[i]`` with ``taxonomy``."""
    time_ns = dict.fromkeys(taxonomy.categories, 0)
    count = dict.fromkeys(taxonomy.categories, 0)
    per_name: dict[tuple[str, str], int] = {}
    for b in breakdowns:
        for c in b.categories:
            time_ns[c.name] += c.time_ns
            count[c.name] += c.count
            for k in c.top_kernels:
                per_name[(c.name, k.name)] = per_name.get((c.name, k.name), 0) + k.time_ns
    total = sum(time_ns.values())
    categories = []
    for name in taxonomy.categories:
        top = sorted(((t, n) for (cat, n), t in per_name.items() if cat == name), key=lambda x: (-x[0], x[1]))
        categories.append({
            "category": name,
            "time_ns": time_ns[name],
            "time_ms": time_ns[name] / 1e6,
            "percent": 100.0 * time_ns[name] / total if total else None,
            "kernel_count": count[name],
            "sample_kernels": [n for _, n in top[:samples]],
        })
    kernel_count = sum(b.kernel_count for b in breakdowns)
    memop_count = sum(b.memop_count for b in breakdowns)
    result = {
        "taxonomy": taxonomy.name,
        "inputs": sorted({t.meta.source_path for t in traces}),
        "trace_count": len(traces),
        "has_timeline": all(t.meta.has_timeline for t in traces),
        "kernel_count": kernel_count,
        "memop_count": memop_count,
        "total_time_ns": total,
        "total_time_ms": total / 1e6,
        "percent_base": PERCENT_BASE,
        "categories": categories,
    }
    if amdahl_category in taxonomy.categories and total:
        p = time_ns[amdahl_category] / total
        ceiling, _ = amdahl(p, 2.0)
        result["amdahl"] = {"category": amdahl_category, "percent": 100.0 * p, "max_speedup": ceiling,
                            "formula": "1 / (1 - p)", "explanation": _explain(amdahl_category, p, ceiling)}
    else:
        why = ("no GPU time in the input" if not total
               else f"taxonomy {taxonomy.name!r} has no {amdahl_category!r} category")
        result["amdahl"] = {"category": amdahl_category, "percent": None, "max_speedup": None,
                            "formula": "1 / (1 - p)", "explanation": f"n/a: {why}"}
    return result


def category_table_text(result: dict) -> str:
    """The table as text (category, time in ms, %, rows) plus the Amdahl line."""
    lines = [f"{'category':<18} {'time (ms)':>12} {'%':>7} {'kernels':>9}"]
    for c in result["categories"]:
        pct = "n/a" if c["percent"] is None else f"{c['percent']:.1f}"
        lines.append(f"{c['category']:<18} {c['time_ms']:>12.3f} {pct:>7} {c['kernel_count']:>9}")
    lines.append(f"{'total':<18} {result['total_time_ms']:>12.3f} {'100.0' if result['total_time_ns'] else 'n/a':>7} "
                 f"{result['kernel_count'] + result['memop_count']:>9}")
    lines.append("")
    lines.append(f"Amdahl ceiling ({result['amdahl']['category']}): {result['amdahl']['explanation']}")
    return "\n".join(lines)
