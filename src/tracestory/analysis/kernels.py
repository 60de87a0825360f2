"""What the kernel names say about the code that launched them: execution mode, precisions,
and the implementation behind each attention kernel, from the kernel knowledge base.

* **Execution mode**: graph replay when most linked kernel time comes from graph launches
  (:mod:`.graphs`), compiled when Inductor kernels are present, else eager; a program without
  PyTorch is said to be one (:mod:`.producer`).
* **Precisions named by kernels**: the precision each kernel name states
  (:func:`~tracestory.analysis.families.kernel_precision`), with the share of kernel time in each.
* **Attention implementations**: the knowledge base's implementation name of every kernel in
  the attention category, with launch counts and time (FlashAttention, FlashInfer, cuDNN SDPA,
  FlexAttention, paged attention, ...).

Limits: a name that states no precision contributes to none; a custom kernel named like a
library's is counted as that library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .families import kernel_implementation, kernel_precision


@dataclass(frozen=True)
class KernelFacts:
    execution_mode: str                                  # one sentence
    precisions: tuple[tuple[str, float], ...]            # (precision, share of kernel time), largest first
    attention: tuple[tuple[str, int, int], ...]          # (implementation, launches, time ns), by time


def execution_mode(producer) -> str:
    if producer is None:
        return "unknown"
    g = producer.graphs
    if producer.replays_graphs:
        mode = (f"graph replay: {g.graph_time_fraction * 100:.1f}% of kernel time from {g.graph_launches} graph "
                f"launch{'es' if g.graph_launches != 1 else ''}")
        return mode + (", with torch.compile (Inductor) kernels" if producer.compiled else "")
    if producer.compiled:
        return "compiled (torch.compile: Inductor kernels present)"
    if producer.framework == "none":
        return "a program without PyTorch, kernels launched one by one"
    return "eager (no Inductor kernels, no graph replays)"


def kernel_facts(analysis, producer=None) -> KernelFacts:
    """The :class:`KernelFacts` of one analysed trace."""
    tr = analysis.trace
    k = tr.kernels
    dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    total = int(dur.sum()) or 1
    codes, inverse = np.unique(k["name"], return_inverse=True)
    per_code = np.bincount(inverse, weights=dur, minlength=codes.size) if codes.size else np.zeros(0)
    names = [tr.name(int(c)) if c >= 0 else "" for c in codes]
    prec: dict[str, float] = {}
    for n, t in zip(names, per_code):
        p = kernel_precision(n)
        if p:
            prec[p] = prec.get(p, 0.0) + float(t) / total
    cats = analysis.classification.taxonomy.categories
    att_codes = [i for i, c in enumerate(cats) if "attention" in c]
    att: dict[str, list[int]] = {}
    if att_codes and codes.size:
        is_att = np.isin(analysis.classification.kernel_category, att_codes)
        counts = np.bincount(inverse[is_att], minlength=codes.size)
        times = np.bincount(inverse[is_att], weights=dur[is_att], minlength=codes.size)
        for j in np.flatnonzero(counts):
            impl = kernel_implementation(names[j]) or "other"
            a = att.setdefault(impl, [0, 0])
            a[0] += int(counts[j])
            a[1] += int(times[j])
    return KernelFacts(
        execution_mode=execution_mode(producer),
        precisions=tuple(sorted(prec.items(), key=lambda x: -x[1])),
        attention=tuple(sorted(((i, c, t) for i, (c, t) in att.items()), key=lambda x: -x[2])))
