"""GPU time per CPU operator (top-level and leaf, by input shapes) and per ``nn.Module``.

Model
-----
Every GPU op (kernel or memcpy/memset) is linked to the API call that launched it by
correlation id (:func:`tracestory.analysis.links.gpu_ops_launch_index`). The launch call is
then placed in the CPU ops that enclose it: same process and thread, ``op.start <= launch.start
< op.end``. Of that chain of enclosing ops,

* the **leaf** op is the innermost (the one that launched the work: ``aten::mm``,
  ``aten::_flash_attention_forward``, a Triton kernel's ``record_function``), and
* the **top-level** op is the outermost (``aten::linear``, ``aten::scaled_dot_product_attention``,
  a framework's custom op).

The GPU time of an op is the plain sum of the durations of the GPU ops it launched (concurrent
streams each count in full, as in :mod:`tracestory.analysis.breakdown`); ``share`` is that sum
over the total GPU op time of the trace, so the rows of one level plus the two rows below sum to 1.
Ops are grouped by (name, input dims, input types) when the trace recorded shapes
(``record_shapes=True``), by name alone otherwise.

Which CPU intervals are ops: the trace's ``ops`` table (Kineto ``cpu_op``) without
``ProfilerStep#N`` step markers. A launch outside every op but inside a CPU-side range (a
``record_function`` user annotation) is given to the innermost such range (its ``kind`` is
``"annotation"``). A trace without an ops table (Nsight Systems) uses its CPU-side NVTX ranges
as the ops (``kind`` ``"nvtx"``): with ``torch.autograd.profiler.emit_nvtx`` those are the aten
ops themselves.

Nothing is dropped. GPU ops whose launch call is not in the trace (launched before the
profiler started, or a source without correlation ids) are **unattributed**; GPU ops whose
launch lies outside every op and range are **outside ops**. Both are counted and reported.

Modules: the ``nn.Module: Name_k`` ranges that torch.profiler writes with ``with_stack`` /
``with_modules`` (Kineto ``python_function`` events, read by
:func:`tracestory.ingest.kineto_modules.load_module_ranges`, or CPU ranges with that name
prefix). A module's **inclusive** GPU time is that of every launch inside any of its calls,
nested modules included; its **self** time excludes the launches inside a child module.
Module calls are grouped by their path of enclosing modules (``BertModel_0/BertEncoder_0/...``).

Limits
------
* CUDA graph replays: the kernels a ``cudaGraphLaunch`` replays carry the correlation id of
  that one graph launch, so all of their time goes to the op (or module) enclosing the graph
  launch, not to the ops that were recorded into the graph at capture time.
* Launches from a thread that recorded no ops (a C++ worker, NCCL's own threads) fall in
  "outside ops".
* Nesting is taken as the profiler records it: properly nested per thread. An interval that
  overlaps a sibling instead of nesting is never taken to enclose a launch it does not contain
  (each match is checked), so such launches move up to the nearest op that does contain them.

Vectorised: the nesting and the innermost-interval search are sorts and ``searchsorted``
(:mod:`tracestory.analysis.nesting`); groups are packed int64 keys; no loop over events.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from ..trace import CPU_SIDE, Table, Trace
from .links import api_column, gpu_ops_launch_index
from .nesting import dense_codes, nest_intervals, thread_codes

TOP_KERNELS = 3
MODULE_PREFIX = "nn.Module: "
_STEP_MARKER = re.compile(r"^ProfilerStep#\d+$")

# Row names of the GPU time no op can be given: used by the tables.
UNATTRIBUTED = "(unattributed: launch call not in trace)"
OUTSIDE_OPS = "(launched outside every CPU op)"


@dataclass(frozen=True)
class OpStat:
    """GPU work launched from one group of CPU ops (same name, input dims and types)."""

    name: str
    kind: str  # "op" (cpu_op), "annotation" (record_function range), "nvtx" (nsys range)
    input_dims: str | None  # the recorded JSON text, e.g. "[[1, 512, 4096], [4096, 4096]]"; None: not recorded
    input_types: str | None  # e.g. '["c10::BFloat16", "c10::BFloat16"]'; None: not recorded
    calls: int  # op instances that launched GPU work
    launches: int  # launch calls (API rows) inside them
    gpu_op_count: int  # kernels + memops launched
    kernel_count: int
    gpu_ns: int  # plain sum of the GPU ops' durations
    share: float  # gpu_ns / total GPU op time of the trace, 0..1
    top_kernels: tuple[tuple[str, int], ...]  # up to 3 (name, gpu_ns), largest first


@dataclass(frozen=True)
class ModuleStat:
    """GPU work launched inside the calls of one module path."""

    path: str  # enclosing modules joined by "/", outermost first, e.g. "BertModel_0/BertEncoder_0/BertLayer_1"
    name: str  # the last element of the path, e.g. "BertLayer_1"
    depth: int  # 0 for a module no other module encloses
    calls: int
    gpu_op_count: int  # inclusive
    gpu_ns: int  # inclusive: launches inside the module and its children
    self_gpu_ns: int  # launches inside the module but in none of its child modules
    share: float  # gpu_ns / total GPU op time, 0..1


@dataclass(frozen=True)
class Operators:
    """GPU time per top-level op, per leaf op and per module of one trace."""

    op_source: str  # "cpu_op", "nvtx" or "none" (the trace has no CPU ops or ranges)
    shapes_recorded: bool  # some op carries input dims
    module_source: str  # "python_function", "ranges" or "none"
    gpu_op_count: int
    total_gpu_ns: int  # kernels + memops, plain sum of durations
    top_level: tuple[OpStat, ...]  # by gpu_ns, largest first
    leaf: tuple[OpStat, ...]
    modules: tuple[ModuleStat, ...]  # in the order of their first call (parents before children)
    unattributed_count: int  # GPU ops whose launch call is not in the trace
    unattributed_ns: int
    outside_ops_count: int  # launched, but outside every op and range
    outside_ops_ns: int
    module_gpu_ns: int  # GPU time launched inside some module (0 without modules)
    # Per GPU op (kernels then memops, the order of links.gpu_ops_launch_index): the chosen leaf /
    # top-level interval, -1 where none. Numbered over the candidate intervals: the rows of
    # ``trace.ops`` (or of the CPU ranges, for "nvtx") without step markers, in table order, then
    # the CPU ranges that stand in for ops ("annotation").
    leaf_row: np.ndarray = field(compare=False, repr=False, default=None)
    top_row: np.ndarray = field(compare=False, repr=False, default=None)
    # Per GPU op, the same order: the name code (into ``trace.strings``) of its leaf / top-level
    # op, -1 where none (``Results.kernels_frame``'s ``op`` and ``top_op`` columns).
    leaf_name: np.ndarray = field(compare=False, repr=False, default=None)
    top_name: np.ndarray = field(compare=False, repr=False, default=None)


# --------------------------------------------------------------------------- grouping
def _factorize(values: np.ndarray) -> np.ndarray:
    """Dense int codes of hashable values (bytes, str) at C speed."""
    index: dict = {}
    for v in dict.fromkeys(values.tolist()):
        index[v] = len(index)
    return np.fromiter(map(index.__getitem__, values.tolist()), dtype=np.int64, count=len(values))


def _text(raw) -> str | None:
    """Recorded JSON (dims or types) in one compact line, ``None`` when not recorded."""
    if raw is None or len(raw) == 0:
        return None
    try:
        return json.dumps(json.loads(raw), separators=(", ", ": "))
    except ValueError:
        return raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)


def _group_ops(trace: Trace, rows: np.ndarray, candidates: "_Candidates", op_instance: np.ndarray,
               launch: np.ndarray, is_kernel: np.ndarray, dur: np.ndarray, gpu_name: np.ndarray,
               total: int) -> tuple[OpStat, ...]:
    """OpStats of the GPU ops that have an op (``rows`` >= 0 marks them, per GPU op)."""
    has = rows >= 0
    if not has.any():
        return ()
    r = rows[has]
    # group key: (kind, name, dims, types) of the interval each GPU op was given to
    kinds, names, dims, types = (candidates.column(c, r) for c in ("kind", "name", "input_dims", "input_types"))
    g = dense_codes(kinds, names, _factorize(dims), _factorize(types))
    ng = int(g.max()) + 1
    d = dur[has]
    gpu_ns_int = np.zeros(ng, dtype=np.int64)
    np.add.at(gpu_ns_int, g, d)
    count = np.bincount(g, minlength=ng)
    kcount = np.bincount(g, weights=is_kernel[has], minlength=ng).astype(np.int64)
    calls = _distinct_per_group(g, op_instance[has], ng)
    launches = _distinct_per_group(g, launch[has], ng)
    first = np.full(ng, -1, dtype=np.int64)
    first[g[::-1]] = np.arange(r.size)[::-1]  # one representative interval per group
    # top kernels: (group, GPU op name) sums, largest first within each group
    pair = dense_codes(g, gpu_name[has])
    p_time = np.zeros(int(pair.max()) + 1, dtype=np.int64)
    np.add.at(p_time, pair, d)
    p_group = np.zeros_like(p_time)
    p_group[pair] = g
    p_name = np.zeros_like(p_time)
    p_name[pair] = gpu_name[has]
    by = np.lexsort((p_name, -p_time, p_group))
    top: dict[int, list[tuple[str, int]]] = {}
    for i in by.tolist():  # one entry per (group, name) pair, not per event
        lst = top.setdefault(int(p_group[i]), [])
        if len(lst) < TOP_KERNELS:
            lst.append((trace.name(int(p_name[i])), int(p_time[i])))
    out = []
    for i in range(ng):
        row = int(first[i])
        out.append(OpStat(
            name=trace.name(int(names[row])),
            kind=_KIND_NAMES[int(kinds[row])],
            input_dims=_text(dims[row]),
            input_types=_text(types[row]),
            calls=int(calls[i]),
            launches=int(launches[i]),
            gpu_op_count=int(count[i]),
            kernel_count=int(kcount[i]),
            gpu_ns=int(gpu_ns_int[i]),
            share=float(gpu_ns_int[i]) / total if total > 0 else 0.0,
            top_kernels=tuple(top.get(i, ())),
        ))
    out.sort(key=lambda s: (-s.gpu_ns, s.name, s.input_dims or "", s.input_types or "", s.kind))
    return tuple(out)


def _distinct_per_group(g: np.ndarray, item: np.ndarray, ng: int) -> np.ndarray:
    """Number of distinct non-negative ``item`` values per group."""
    ok = item >= 0
    if not ok.any():
        return np.zeros(ng, dtype=np.int64)
    width = int(item[ok].max()) + 1
    v = np.sort(g[ok] * width + item[ok])  # g and item < 2**31 in any real trace: no overflow
    first = np.ones(v.size, dtype=bool)
    first[1:] = v[1:] != v[:-1]  # (a sort, not np.unique: its hash path is slower here)
    return np.bincount(v[first] // width, minlength=ng)


_KIND_OP, _KIND_ANNOTATION, _KIND_NVTX = 0, 1, 2
_KIND_NAMES = ("op", "annotation", "nvtx")


# --------------------------------------------------------------------------- entry point
def _step_marker_codes(trace: Trace, codes: np.ndarray) -> np.ndarray:
    """Boolean mask over ``codes``: names that are step markers or module ranges."""
    uniq = np.unique(codes)
    bad = [c for c in uniq.tolist() if c >= 0 and (_STEP_MARKER.match(trace.strings[c])
                                                   or trace.strings[c].startswith(MODULE_PREFIX))]
    return np.isin(codes, np.asarray(bad, dtype=codes.dtype))


def _module_ranges_in_trace(trace: Trace) -> Table | None:
    """CPU ranges named ``nn.Module: X`` already in the trace, as a module table."""
    r = trace.ranges
    if len(r) == 0:
        return None
    cpu = r["side"] == CPU_SIDE
    codes = np.unique(r["name"][cpu])
    mod = [c for c in codes.tolist() if c >= 0 and trace.strings[c].startswith(MODULE_PREFIX)]
    if not mod:
        return None
    rows = np.flatnonzero(cpu & np.isin(r["name"], mod))
    return Table({"start_ns": r["start_ns"][rows], "end_ns": r["end_ns"][rows], "pid": r["pid"][rows],
                  "tid": r["tid"][rows], "name": trace.names(r["name"][rows])})


def operators(trace: Trace, modules: Table | None = None) -> Operators:
    """GPU time per top-level op, per leaf op and per module (see the module docstring).

    ``modules``: module call ranges, a :class:`~tracestory.trace.Table` with ``start_ns``,
    ``end_ns``, ``pid``, ``tid`` and ``name`` (str, ``"nn.Module: X_0"`` or ``"X_0"``), such as
    :func:`tracestory.ingest.kineto_modules.load_module_ranges` returns. Without it, CPU ranges of
    the trace named ``nn.Module: ...`` are used when there are any.

    >>> from tracestory.ingest.kineto import load_kineto
    >>> ops = operators(load_kineto("trace.json.gz"))        # doctest: +SKIP
    >>> ops.leaf[0].name, ops.leaf[0].input_dims, ops.leaf[0].share   # doctest: +SKIP
    ('aten::mm', '[[512, 4096], [4096, 14336]]', 0.41)
    """
    k, m = trace.kernels, trace.memops
    dur = np.concatenate([k.dur_ns, m.dur_ns]).astype(np.int64)
    gpu_name = np.concatenate([k["name"], m["name"]]).astype(np.int64)
    is_kernel = np.concatenate([np.ones(len(k), np.int64), np.zeros(len(m), np.int64)])
    total = int(dur.sum())
    n_gpu = dur.size
    launch = gpu_ops_launch_index(trace)
    linked = launch >= 0
    l_start = api_column(trace, launch, "start_ns")
    l_pid = api_column(trace, launch, "pid")
    l_tid = api_column(trace, launch, "tid")

    ops, ranges = trace.ops, trace.ranges
    cpu_r = np.flatnonzero(ranges["side"] == CPU_SIDE) if len(ranges) else np.zeros(0, np.int64)
    cpu_r = cpu_r[~_step_marker_codes(trace, ranges["name"][cpu_r])] if cpu_r.size else cpu_r
    if len(ops):
        op_rows = np.flatnonzero(~_step_marker_codes(trace, ops["name"]))
        op_source = "cpu_op"
        primary = _Source(ops, op_rows, _KIND_OP, with_shapes=True)
        fallback = _Source(ranges, cpu_r, _KIND_ANNOTATION, with_shapes=False) if cpu_r.size else None
    elif cpu_r.size:
        op_source = "nvtx"
        primary, fallback = _Source(ranges, cpu_r, _KIND_NVTX, with_shapes=False), None
    else:
        op_source, primary, fallback = "none", None, None

    # Candidate intervals: primary rows first, fallback rows after them.
    sources = [s for s in (primary, fallback) if s is not None]
    candidates = _Candidates(sources)
    leaf = np.full(n_gpu, -1, dtype=np.int64)
    top = np.full(n_gpu, -1, dtype=np.int64)
    pts = np.flatnonzero(linked)
    for src, offset in zip(sources, candidates.offsets):
        t, r = src.table, src.rows
        thread_i, thread_p = thread_codes(t["pid"][r], t["tid"][r], (l_pid[pts], l_tid[pts]))
        nest, inner = nest_intervals(t["start_ns"][r].astype(np.int64, copy=False), t["end_ns"][r].astype(np.int64, copy=False),
                            thread_i, l_start[pts], thread_p, np.arange(r.size, dtype=np.int64) + offset)
        hit = inner >= 0
        # keep the primary source's answer; the fallback only fills launches it left open
        fill = hit & (leaf[pts] < 0)
        leaf[pts[fill]] = nest.source_row[inner[fill]]
        # an annotation standing in for an op is its own top level: its outer ranges are
        # phases (decode_3, ProfilerStep), not operators
        outer = nest.root[inner[fill]] if src is primary else inner[fill]
        top[pts[fill]] = nest.source_row[outer]

    unattributed = ~linked
    outside = linked & (leaf < 0)
    leaf_name = np.full(n_gpu, -1, dtype=np.int64)
    top_name = np.full(n_gpu, -1, dtype=np.int64)
    if sources:
        for rows, out in ((leaf, leaf_name), (top, top_name)):
            has = rows >= 0
            out[has] = candidates.column("name", rows[has])
    if sources:
        common = dict(trace=trace, candidates=candidates, launch=launch, is_kernel=is_kernel, dur=dur,
                      gpu_name=gpu_name, total=total)
        leaf_stats = _group_ops(rows=leaf, op_instance=leaf, **common)
        top_stats = _group_ops(rows=top, op_instance=top, **common)
        shapes = bool(primary is not None and primary.kind == _KIND_OP
                      and any(len(x) > 2 for x in ops["input_dims"][primary.rows[:10000]] if x is not None))
    else:
        leaf_stats = top_stats = ()
        shapes = False

    module_table, module_source = modules, "python_function" if modules is not None and len(modules) else "none"
    if module_table is None:
        module_table = _module_ranges_in_trace(trace)
        module_source = "ranges" if module_table is not None else "none"
    mod_stats, module_ns = _modules(module_table, launch, linked, l_start, l_pid, l_tid, dur, total) \
        if module_table is not None and len(module_table) else ((), 0)

    return Operators(
        op_source=op_source,
        shapes_recorded=shapes,
        module_source=module_source if mod_stats else "none",
        gpu_op_count=n_gpu,
        total_gpu_ns=total,
        top_level=top_stats,
        leaf=leaf_stats,
        modules=mod_stats,
        unattributed_count=int(unattributed.sum()),
        unattributed_ns=int(dur[unattributed].sum()),
        outside_ops_count=int(outside.sum()),
        outside_ops_ns=int(dur[outside].sum()),
        module_gpu_ns=module_ns,
        leaf_row=leaf,
        top_row=top,
        leaf_name=leaf_name,
        top_name=top_name,
    )


@dataclass(frozen=True)
class _Source:
    table: Table
    rows: np.ndarray
    kind: int
    with_shapes: bool


class _Candidates:
    """The candidate intervals of every source as one row space (source 0's rows first): the
    rows that ``leaf_row`` / ``top_row`` hold. Columns are gathered only for the rows asked."""

    def __init__(self, sources: list[_Source]):
        self.sources = sources
        sizes = [s.rows.size for s in sources]
        self.offsets = [int(x) for x in np.concatenate([[0], np.cumsum(sizes)])] if sources else [0]

    def column(self, name: str, rows: np.ndarray) -> np.ndarray:
        """``name`` ("kind", "name", "input_dims", "input_types") at candidate ``rows``."""
        text = name in ("input_dims", "input_types")
        out = np.full(rows.size, None, dtype=object) if text else np.zeros(rows.size, dtype=np.int64)
        for si, src in enumerate(self.sources):
            lo, hi = self.offsets[si], self.offsets[si + 1]
            m = (rows >= lo) & (rows < hi)
            local = src.rows[rows[m] - lo]
            if name == "kind":
                out[m] = src.kind
            elif not text:
                out[m] = src.table[name][local]
            elif src.with_shapes:
                out[m] = src.table[name][local]
        return out


def _modules(mods: Table, launch: np.ndarray, linked: np.ndarray, l_start: np.ndarray, l_pid: np.ndarray,
             l_tid: np.ndarray, dur: np.ndarray, total: int) -> tuple[tuple[ModuleStat, ...], int]:
    """Inclusive and self GPU time per module path."""
    pts = np.flatnonzero(linked)
    thread_m, thread_p = thread_codes(np.asarray(mods["pid"]), np.asarray(mods["tid"]), (l_pid[pts], l_tid[pts]))
    start = np.asarray(mods["start_ns"], dtype=np.int64)
    end = np.asarray(mods["end_ns"], dtype=np.int64)
    nest, inner = nest_intervals(start, end, thread_m, l_start[pts], thread_p, np.arange(len(mods)))
    n = nest.start.size
    if n == 0:
        return (), 0
    names = np.asarray([str(x)[len(MODULE_PREFIX):] if str(x).startswith(MODULE_PREFIX) else str(x)
                        for x in np.asarray(mods["name"])[nest.source_row].tolist()], dtype=object)
    # paths, outermost first: one string per module call, built level by level
    path = names.copy()
    for d in range(1, int(nest.depth.max()) + 1):
        at = np.flatnonzero((nest.depth == d) & (nest.parent >= 0))
        path[at] = path[nest.parent[at]] + "/" + names[at]
    hit = inner >= 0
    self_ns = np.zeros(n, dtype=np.int64)
    self_count = np.zeros(n, dtype=np.int64)
    np.add.at(self_ns, inner[hit], dur[pts[hit]])
    np.add.at(self_count, inner[hit], 1)
    incl_ns, incl_count = self_ns.copy(), self_count.copy()
    for d in range(int(nest.depth.max()), 0, -1):  # children into parents, deepest level first
        at = np.flatnonzero((nest.depth == d) & (nest.parent >= 0))
        np.add.at(incl_ns, nest.parent[at], incl_ns[at])
        np.add.at(incl_count, nest.parent[at], incl_count[at])
    code = _factorize(path)
    ng = int(code.max()) + 1
    g_incl = np.zeros(ng, np.int64)
    g_self = np.zeros(ng, np.int64)
    g_cnt = np.zeros(ng, np.int64)
    np.add.at(g_incl, code, incl_ns)
    np.add.at(g_self, code, self_ns)
    np.add.at(g_cnt, code, incl_count)
    calls = np.bincount(code, minlength=ng)
    first = np.full(ng, -1, dtype=np.int64)
    first[code[::-1]] = np.arange(n)[::-1]
    stats = []
    for i in sorted(range(ng), key=lambda i: (int(nest.start[first[i]]), int(nest.depth[first[i]]))):
        row = int(first[i])
        stats.append(ModuleStat(
            path=str(path[row]), name=str(names[row]), depth=int(nest.depth[row]),
            calls=int(calls[i]), gpu_op_count=int(g_cnt[i]), gpu_ns=int(g_incl[i]), self_gpu_ns=int(g_self[i]),
            share=float(g_incl[i]) / total if total > 0 else 0.0,
        ))
    inside_any = int(dur[pts[hit]].sum())
    return tuple(stats), inside_any
