"""Per-category GPU time and the Amdahl ceilings it implies.

Model
-----
Every kernel and memop row counts with its duration ``end_ns - start_ns``. The base of every
percentage is their plain sum, ``total_time_ns = kernel_time_ns + memop_time_ns``: the
**share of GPU op time**, not of wall time. Concurrent activities (several streams) are each
counted in full, and idle gaps count nowhere; use the timeline analysis for wall time.

Each row is in exactly one category (see :mod:`tracestory.analysis.categories`), so the
categories' ``time_ns`` sum exactly to ``total_time_ns`` (integer sums, no float rounding).

For a category with share ``p = time_ns / total_time_ns``:

* ``amdahl_max_speedup = 1 / (1 - p)``: the whole workload's speedup if that category took no
  time at all; ``None`` when ``p == 1`` (unbounded).
* ``whatif_speedup = 1 / ((1 - p) + p / k)``: the speedup if that category ran ``k`` times
  faster (``k = speedup_factor``, default 2).

Both assume the rest of the GPU time stays as it is and that GPU op time is what bounds the
run: for a CPU- or launch-bound run they overstate what a faster kernel buys.

Kernel statistics group rows by (name, category): a range rule can put one name in two
categories. Categories are listed by time, largest first (ties in taxonomy order); empty
categories are left out. Grouping is vectorized (``np.unique`` + ``np.add.at`` /
``np.bincount`` over codes).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from ..errors import UsageError
from ..trace import Trace, factorize
from .categories import Classification, classify, taxonomy


class KernelStat(msgspec.Struct, frozen=True):
    name: str
    category: str
    time_ns: int
    count: int
    mean_ns: float
    min_ns: int
    max_ns: int
    percent: float  # of total GPU op time (kernels + memops), 0..100


class CategoryStat(msgspec.Struct, frozen=True):
    name: str
    time_ns: int
    count: int
    percent: float  # of total GPU op time, 0..100
    mean_ns: float | None
    amdahl_max_speedup: float | None  # 1/(1-p); None when p == 1 (unbounded)
    whatif_speedup: float  # 1/((1-p) + p/k): this category k times faster
    top_kernels: tuple[KernelStat, ...]  # up to `top`, by time


@dataclass(frozen=True)
class Breakdown:
    taxonomy: str
    speedup_factor: float  # k
    kernel_count: int
    kernel_time_ns: int
    memop_count: int
    memop_time_ns: int
    total_time_ns: int  # kernel_time_ns + memop_time_ns == sum of categories' time_ns
    categories: tuple[CategoryStat, ...]  # by time desc; empty categories left out
    kernels: tuple[KernelStat, ...]  # top kernels overall by time (up to `top_overall`)


def amdahl(p: float, k: float) -> tuple[float | None, float]:
    """``(1/(1-p), 1/((1-p) + p/k))`` for a share ``p`` in [0, 1]; the first is ``None`` at p == 1."""
    rest = 1.0 - p
    max_speedup = None if rest <= 0.0 else 1.0 / rest
    return max_speedup, 1.0 / (max(rest, 0.0) + p / k)


def breakdown(
    trace: Trace,
    classification: Classification | None = None,
    *,
    k: float = 2.0,
    top: int = 5,
    top_overall: int = 15,
) -> Breakdown:
    """GPU op time per category of ``classification`` (default: the ``llm`` taxonomy)."""
    if not k > 0:
        raise UsageError(f"speedup factor k must be > 0, got {k}")
    if top < 0 or top_overall < 0:
        raise UsageError(f"top and top_overall must be >= 0, got {top} and {top_overall}")
    if classification is None:
        classification = classify(trace, taxonomy("llm"))
    tax = classification.taxonomy
    kern, mem = trace.kernels, trace.memops
    if len(classification.kernel_category) != len(kern) or len(classification.memop_category) != len(mem):
        raise UsageError(
            "classification does not belong to this trace: "
            f"{len(classification.kernel_category)}/{len(classification.memop_category)} rows classified, "
            f"trace has {len(kern)} kernels and {len(mem)} memops"
        )

    k_dur = kern.dur_ns.astype(np.int64)
    m_dur = mem.dur_ns.astype(np.int64)
    kernel_time, memop_time = int(k_dur.sum()), int(m_dur.sum())
    total = kernel_time + memop_time

    ncat = len(tax.categories)
    cat = np.concatenate([classification.kernel_category, classification.memop_category]).astype(np.int64)
    dur = np.concatenate([k_dur, m_dur])
    names = np.concatenate([kern["name"], mem["name"]]).astype(np.int64)

    cat_time = np.zeros(ncat, dtype=np.int64)
    np.add.at(cat_time, cat, dur)  # integer sums: exact
    cat_count = np.bincount(cat, minlength=ncat)

    # One group per (name code, category) pair.
    key = (names + 1) * ncat + cat  # +1: a missing name (-1) stays a valid key
    uniq, inv = factorize(key)
    g = len(uniq)
    g_time = np.zeros(g, dtype=np.int64)
    np.add.at(g_time, inv, dur)
    g_count = np.bincount(inv, minlength=g)
    g_min = np.full(g, np.iinfo(np.int64).max, dtype=np.int64)
    g_max = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(g_min, inv, dur)
    np.maximum.at(g_max, inv, dur)
    g_cat = uniq % ncat
    g_name = uniq // ncat - 1
    # Largest time first; ties by name code so the order is deterministic.
    order = np.lexsort((g_name, -g_time))

    def pct(t: int) -> float:
        return 100.0 * t / total if total > 0 else 0.0

    def stat(i: int) -> KernelStat:
        t, n = int(g_time[i]), int(g_count[i])
        return KernelStat(
            name=trace.name(int(g_name[i])),
            category=tax.categories[int(g_cat[i])],
            time_ns=t,
            count=n,
            mean_ns=t / n,
            min_ns=int(g_min[i]),
            max_ns=int(g_max[i]),
            percent=pct(t),
        )

    per_cat: dict[int, list[KernelStat]] = {}
    for i in order.tolist():
        c = int(g_cat[i])
        lst = per_cat.setdefault(c, [])
        if len(lst) < top:
            lst.append(stat(i))

    cats = []
    for c in sorted(np.flatnonzero(cat_count > 0).tolist(), key=lambda c: (-int(cat_time[c]), c)):
        t, n = int(cat_time[c]), int(cat_count[c])
        p = t / total if total > 0 else 0.0
        max_speedup, whatif = amdahl(p, k)
        cats.append(
            CategoryStat(
                name=tax.categories[c],
                time_ns=t,
                count=n,
                percent=pct(t),
                mean_ns=t / n if n else None,
                amdahl_max_speedup=max_speedup,
                whatif_speedup=whatif,
                top_kernels=tuple(per_cat.get(c, ())),
            )
        )

    return Breakdown(
        taxonomy=tax.name,
        speedup_factor=float(k),
        kernel_count=len(kern),
        kernel_time_ns=kernel_time,
        memop_count=len(mem),
        memop_time_ns=memop_time,
        total_time_ns=total,
        categories=tuple(cats),
        kernels=tuple(stat(i) for i in order[:top_overall].tolist()),
    )
