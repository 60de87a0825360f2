"""GPU time per kernel category summed over every trace of the inputs, with the Amdahl ceiling of
one category: what ``tracestory categories`` prints.

Model: each trace is classified with the taxonomy and broken down (``breakdown`` with every name
of every category kept, so the sample names are ranked exactly over all traces). Per category:
the summed GPU op time (kernels and memops), the op count and the longest-running names. The
Amdahl ceiling of ``amdahl_category`` with share ``p`` of the GPU op time is ``1 / (1 - p)``
(``None`` when ``p == 1``: unbounded), assuming everything else keeps its time and GPU op time
bounds the run. Shares are of the sum of GPU op durations, not of wall time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..trace import Trace
from .breakdown import Breakdown, amdahl, breakdown
from .categories import Taxonomy, classify

EXPERT = "expert_gemm"


@dataclass(frozen=True)
class CategoryTotal:
    name: str
    time_ns: int
    count: int  # kernels and memops of the category
    sample_kernels: tuple[str, ...]  # longest-running names first (ties by name)


@dataclass(frozen=True)
class CategoryTotals:
    """Every category of the taxonomy (taxonomy order), summed over ``trace_count`` traces."""

    taxonomy: str
    inputs: tuple[str, ...]  # the traces' source paths, sorted, once each
    trace_count: int
    has_timeline: bool  # every trace has per-op times
    kernel_count: int
    memop_count: int
    total_time_ns: int
    categories: tuple[CategoryTotal, ...]
    amdahl_category: str
    amdahl_share: float | None  # share of the GPU op time; None when n/a (see ``amdahl_na``)
    amdahl_max_speedup: float | None  # 1 / (1 - p); None when p == 1 or n/a
    amdahl_na: str | None  # why the ceiling is n/a, else None


def totals_of(
    breakdowns: Sequence[Breakdown],
    traces: Sequence[Trace],
    taxonomy: Taxonomy,
    *,
    samples: int = 5,
    amdahl_category: str = EXPERT,
) -> CategoryTotals:
    """:class:`CategoryTotals` of ``breakdowns[i]`` (of ``traces[i]`` with ``taxonomy``)."""
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
    cats = []
    for name in taxonomy.categories:
        top = sorted(((t, n) for (cat, n), t in per_name.items() if cat == name), key=lambda x: (-x[0], x[1]))
        cats.append(CategoryTotal(name, time_ns[name], count[name], tuple(n for _, n in top[:samples])))
    share = ceiling = na = None
    if amdahl_category in taxonomy.categories and total:
        share = time_ns[amdahl_category] / total
        ceiling, _ = amdahl(share, 2.0)
    else:
        na = (
            "no GPU time in the input"
            if not total
            else f"taxonomy {taxonomy.name!r} has no {amdahl_category!r} category"
        )
    return CategoryTotals(
        taxonomy=taxonomy.name,
        inputs=tuple(sorted({t.meta.source_path for t in traces})),
        trace_count=len(traces),
        has_timeline=all(t.meta.has_timeline for t in traces),
        kernel_count=sum(b.kernel_count for b in breakdowns),
        memop_count=sum(b.memop_count for b in breakdowns),
        total_time_ns=total,
        categories=tuple(cats),
        amdahl_category=amdahl_category,
        amdahl_share=share,
        amdahl_max_speedup=ceiling,
        amdahl_na=na,
    )


def category_totals(
    traces: Sequence[Trace], taxonomy: Taxonomy, *, samples: int = 5, amdahl_category: str = EXPERT
) -> CategoryTotals:
    """Classify and break down every trace, then :func:`totals_of` (see the module docstring)."""
    bds = [breakdown(t, classify(t, taxonomy), top=len(t.kernels) + len(t.memops)) for t in traces]
    return totals_of(bds, traces, taxonomy, samples=samples, amdahl_category=amdahl_category)


__all__ = ["CategoryTotal", "CategoryTotals", "category_totals", "totals_of"]
