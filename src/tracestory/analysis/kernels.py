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
* **Unfused attention** (bmm + softmax): attention computed as separate kernels (``Q @ K^T``,
  softmax, ``P @ V``) has no attention-category kernel. It is recognised on the CPU side, where
  the ops are: a softmax op (``aten::softmax``, ``aten::_softmax``, ``aten::_safe_softmax``) whose
  nearest matrix-multiply ops before and after it on its thread (``aten::bmm``, ``aten::matmul``,
  ``aten::baddbmm``, ``aten::einsum``; the outermost of nested ones) are called by the same caller
  as the softmax (the same enclosing op or range, or none), or a softmax op inside an op, range or
  ``nn.Module`` call (when the module calls are given) named like attention (``*Attention*``,
  ``*attn*``, not SDPA's own ops). The evidence quotes the counts and the names.

Limits: a name that states no precision contributes to none; a custom kernel named like a
library's is counted as that library. Unfused attention needs CPU ops: a GPU-only trace cannot
show it (its softmax kernels and GEMMs could be anything); a softmax over the output of a linear
layer (``aten::linear`` calls the matmul) is not taken, since its matmul has another caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..ingest.kineto import parse_json_field
from ..trace import CPU_SIDE, Trace, factorize
from .families import kernel_implementation, kernel_precision, named_precisions
from .nesting import nest_intervals, thread_codes

UNFUSED_ATTENTION = "unfused (bmm + softmax)"
_SOFTMAX_OP = re.compile(r"^aten::_?(safe_)?softmax$")
_MATMUL_OP = re.compile(r"^aten::(bmm|matmul|baddbmm|einsum)$")
_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)
_FUSED_ATTENTION_OP = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|_native_multi_head")


@dataclass(frozen=True)
class KernelFacts:
    execution_mode: str                                  # one sentence
    precisions: tuple[tuple[str, float], ...]            # (precision, share of kernel time), largest first
    attention: tuple[tuple[str, int, int], ...]          # (implementation, launches, time ns), by time
    # Evidence of attention computed as separate bmm + softmax ops (module docstring); () when none
    unfused_attention: tuple[str, ...] = ()
    # precisions the GEMM/attention ops' recorded input types name (fp8 .. fp32); () when none recorded
    op_input_precisions: tuple[str, ...] = ()

    @property
    def attention_kind(self) -> str:
        """``"fused"`` (attention kernels found), ``UNFUSED_ATTENTION``, both joined, or ``"none found"``."""
        kinds = (["fused"] if self.attention else []) + ([UNFUSED_ATTENTION] if self.unfused_attention else [])
        return " and ".join(kinds) if kinds else "none found"


def execution_mode(producer) -> str:
    if producer is None:
        return "unknown"
    g = producer.graphs
    if producer.replays_graphs:
        mode = (f"graph replay: {g.graph_time_fraction * 100:.1f}% of kernel time from {g.graph_launches} graph "
                f"launch{'es' if g.graph_launches != 1 else ''}")
        return mode + (", with torch.compile (Inductor) kernels" if producer.compiled else "")
    partly = (
        f"; {g.graph_time_fraction * 100:.1f}% of kernel time replayed from {g.graph_launches} graph "
        f"launch{'es' if g.graph_launches != 1 else ''}"
        if g.graph_kernels
        else ""
    )
    if producer.compiled:
        return "compiled (torch.compile: Inductor kernels present)" + partly
    if producer.framework == "none":
        return ("a program without PyTorch, kernels launched one by one" if not partly
                else "a program without PyTorch, most kernels launched one by one" + partly)
    if partly:
        return "eager for most kernel time (no Inductor kernels)" + partly
    return "eager (no Inductor kernels, no graph replays)"


def unfused_attention(trace: Trace, modules=None) -> tuple[str, ...]:
    """Evidence phrases that attention runs unfused, as bmm + softmax ops (module docstring); ()
    when the CPU ops show none or the trace has none.

    ``modules``: the trace's ``nn.Module`` calls when known (the table
    :func:`tracestory.ingest.kineto_modules.load_module_ranges` returns: ``start_ns``, ``end_ns``,
    ``pid``, ``tid``, ``name`` as text); a softmax op inside a module named like attention
    (``BertSelfAttention``, ``TimesformerSelfAttention``) is then quoted too."""
    ops, rng = trace.ops, trace.ranges
    if len(ops) == 0:
        return ()
    op_names = [trace.name(int(c)) for c in np.unique(ops["name"])]
    soft_codes = [c for c in np.unique(ops["name"]).tolist() if _SOFTMAX_OP.search(trace.name(c))]
    if not soft_codes or not any(_MATMUL_OP.search(n) for n in op_names):
        return ()
    cpu = np.flatnonzero(rng["side"] == CPU_SIDE) if len(rng) else np.zeros(0, dtype=np.int64)
    # one table of CPU intervals: ops, then CPU ranges
    start = np.concatenate([ops["start_ns"], rng["start_ns"][cpu]]).astype(np.int64)
    end = np.concatenate([ops["end_ns"], rng["end_ns"][cpu]]).astype(np.int64)
    name = np.concatenate([ops["name"], rng["name"][cpu]]).astype(np.int64)
    thread, = thread_codes(np.concatenate([ops["pid"], rng["pid"][cpu]]), np.concatenate([ops["tid"], rng["tid"][cpu]]))
    nest, _ = nest_intervals(start, end, thread, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                             np.arange(start.size))
    names = {int(c): trace.name(int(c)) for c in np.unique(name)}
    row_code = name[nest.source_row]  # name code of each row, in nesting order
    is_soft = np.isin(row_code, [c for c, n in names.items() if _SOFTMAX_OP.search(n)])
    is_mm = np.isin(row_code, [c for c, n in names.items() if _MATMUL_OP.search(n)])
    # the outermost of nested ops of one kind (aten::matmul calling aten::bmm, aten::softmax calling
    # aten::_softmax): drop those under another of their kind
    parent = nest.parent
    has_parent = parent >= 0
    for flags in (is_mm, is_soft):
        under = np.zeros(flags.size, dtype=bool)
        under[has_parent] = flags[parent[has_parent]]
        flags &= ~under
    tkey = nest.key_start // nest.span  # thread of each row (rows are sorted by thread, then start)
    between, in_named = 0, 0
    named_by: dict[str, int] = {}
    mm_rows = np.flatnonzero(is_mm)
    for r in np.flatnonzero(is_soft).tolist():
        # an ancestor named like attention (not a fused attention op: SDPA's math path is its own)
        a = int(parent[r])
        while a >= 0:
            n = names[int(row_code[a])]
            if _ATTENTION_NAME.search(n) and not _FUSED_ATTENTION_OP.search(n):
                in_named += 1
                named_by[n] = named_by.get(n, 0) + 1
                break
            a = int(parent[a])
        j = np.searchsorted(mm_rows, r)
        if j == 0 or j == mm_rows.size:
            continue
        before, after = int(mm_rows[j - 1]), int(mm_rows[j])
        if tkey[before] == tkey[r] == tkey[after] and parent[before] == parent[r] == parent[after] \
                and nest.end[before] <= nest.start[r] and nest.end[r] <= nest.start[after]:
            nxt_soft = np.flatnonzero(is_soft[r + 1:after])
            if nxt_soft.size == 0:
                between += 1
    in_module, module_name = 0, ""
    if modules is not None and len(modules):
        soft_rows = np.flatnonzero(is_soft)
        m_names = [str(n) for n in modules["name"]]
        att = np.array([bool(_ATTENTION_NAME.search(n)) and not _FUSED_ATTENTION_OP.search(n) for n in m_names])
        if att.any() and soft_rows.size:
            src = nest.source_row[soft_rows]
            is_op = src < len(ops)
            s_start, s_pid, s_tid = (ops["start_ns"][src[is_op]], ops["pid"][src[is_op]], ops["tid"][src[is_op]])
            ms, me = modules["start_ns"][att], modules["end_ns"][att]
            mp, mt = modules["pid"][att], modules["tid"][att]
            hit = np.zeros(s_start.size, dtype=bool)
            for j in range(ms.size):  # attention modules: a few per layer
                hit |= (s_pid == mp[j]) & (s_tid == mt[j]) & (s_start >= ms[j]) & (s_start < me[j])
            in_module = int(np.count_nonzero(hit))
            if in_module:
                module_name = m_names[int(np.flatnonzero(att)[0])]
    evidence = []
    if between:
        evidence.append(f"{between} softmax op{'s' if between != 1 else ''} between two matmul/bmm ops of the "
                        "same caller (Q @ K^T, softmax, P @ V)")
    if in_named:
        top = max(named_by.items(), key=lambda x: (x[1], x[0]))[0]
        evidence.append(f"{in_named} softmax op{'s' if in_named != 1 else ''} inside ops or ranges named like "
                        f"attention ({top[:60]})")
    if in_module:
        evidence.append(f"{in_module} softmax op{'s' if in_module != 1 else ''} inside modules named like attention "
                        f"({module_name[:60]})")
    return tuple(evidence)


def kernel_facts(analysis, producer=None, modules=None) -> KernelFacts:
    """The :class:`KernelFacts` of one analysed trace (``modules``: see :func:`unfused_attention`)."""
    tr = analysis.trace
    k = tr.kernels
    dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    total = int(dur.sum()) or 1
    codes, inverse = factorize(k["name"])
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
        attention=tuple(sorted(((i, c, t) for i, (c, t) in att.items()), key=lambda x: -x[2])),
        unfused_attention=unfused_attention(tr, modules),
        op_input_precisions=op_input_precisions(tr))


_GEMM_ATTENTION_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::_scaled_mm")


def op_input_precisions(tr: Trace) -> tuple[str, ...]:
    """Precisions named by the recorded input types of GEMM and attention ops (each distinct
    ``input_types`` cell decoded once), narrowest first (the kernel-name precision tokens)."""
    if not len(tr.ops) or "input_types" not in tr.ops:
        return ()
    codes = [i for i, s in enumerate(tr.strings) if s in _GEMM_ATTENTION_OPS or "scaled_dot_product" in s]
    sel = np.flatnonzero(np.isin(tr.ops["name"], codes))
    types: set[str] = set()
    for v in dict.fromkeys(tr.ops["input_types"][sel].tolist()):
        t = parse_json_field(v) if isinstance(v, (bytes, bytearray)) else None
        if isinstance(t, list):
            types.update(str(x) for x in t if x)
    return named_precisions(sorted(types))
