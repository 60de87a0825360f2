"""Join Nsight Compute kernels to a trace's kernels by name and launch order.

Model
-----
ncu numbers the kernels it profiled in launch order, after its filters: ``--kernel-name``
(a subset of names), ``--launch-skip N`` and ``--launch-count M`` (a window). So the ncu kernel
sequence is a subsequence of the trace's kernel sequence (kernels ordered by start time).

Names differ between tools (ncu drops namespaces, prints lambdas and parameter lists its own way),
so both sides are reduced to a *key*: the first four identifiers of the demangled name once
namespace qualifiers, keywords and builtin types are removed
(``void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, ...`` and
``void reduce_kernel<512, 1, ReduceOp<BFloat16, ...`` both give ``reduce_kernel ReduceOp
BFloat16 MeanOps``). The alignment is the start position from which the ncu keys match the
trace keys as a subsequence with the smallest span (first one on ties; ``candidates`` counts the
ties, so a window that repeats every decode step is reported as ambiguous). When no full
alignment exists each ncu kernel is matched alone to the first trace kernel with its key.

Each match carries the GPU-time share of the matched trace kernel's exact name (sum of its
durations over the sum of all kernel durations), which is what "this kernel is 38% of GPU
time" means.

Limits: the ncu capture may come from another run of the same program (the fixtures here do);
the join then says which trace kernels are the same computation, not the same launch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..trace import Trace

_NS = re.compile(r"(\(anonymous namespace\)|unnamed>|[A-Za-z_]\w*)::")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_STOP = {"void", "const", "unsigned", "signed", "int", "long", "char", "float", "double", "bool", "short",
         "lambda", "instance", "operator", "true", "false", "ul", "u", "l", "struct", "class", "auto",
         "anonymous", "namespace", "unnamed", "std", "at", "native", "c10", "int64_t", "size_t"}
KEY_LEN = 4


def name_key(name: str) -> str:
    """Tool-independent key of a demangled kernel name (see module docstring)."""
    s = _NS.sub("", name)
    words = [w for w in _IDENT.findall(s) if w not in _STOP and not re.fullmatch(r"T\d+|\d.*", w)]
    return " ".join(words[:KEY_LEN])


@dataclass(frozen=True)
class NcuMatch:
    kernel_id: int                # ncu ID
    trace_row: int | None         # row in trace.kernels, None when unmatched
    trace_name: str | None
    trace_duration_ns: int | None  # that trace kernel's own duration
    name_total_ns: int | None     # all trace kernels with the same exact name
    name_count: int | None
    time_share: float | None      # name_total_ns / all kernel time


@dataclass(frozen=True)
class NcuJoin:
    matches: tuple[NcuMatch, ...]
    matched: int
    aligned: bool          # True when the whole ncu sequence aligned in order
    first_row: int | None  # trace kernel row of the first aligned kernel
    candidates: int        # equally good alignments (1 = unambiguous)
    total_kernel_ns: int

    @property
    def ambiguous(self) -> bool:
        return self.candidates > 1

    def for_kernel(self, kernel_id: int) -> NcuMatch | None:
        return next((m for m in self.matches if m.kernel_id == kernel_id), None)


def _align(tkeys: np.ndarray, nkeys: list[int]) -> tuple[int | None, int, list[int] | None]:
    """Smallest-span subsequence alignment of ``nkeys`` in ``tkeys`` (int codes)."""
    positions = {k: np.flatnonzero(tkeys == k) for k in set(nkeys)}
    if any(len(p) == 0 for p in positions.values()):
        return None, 0, None
    best_span, best, count = None, None, 0
    for s in positions[nkeys[0]].tolist():
        rows, cur = [s], s
        for k in nkeys[1:]:
            p = positions[k]
            i = np.searchsorted(p, cur, side="right")
            if i >= len(p):
                rows = None
                break
            cur = int(p[i])
            rows.append(cur)
            if best_span is not None and cur - s > best_span:
                rows = None  # already worse than the best: stop early
                break
        if rows is None:
            continue
        span = rows[-1] - s
        if best_span is None or span < best_span:
            best_span, best, count = span, rows, 1
        elif span == best_span:
            count += 1
    return (best[0] if best else None), count, best


def join_ncu(trace: Trace, km) -> NcuJoin:
    """Match each ncu kernel of ``km`` to a kernel of ``trace`` (see module docstring)."""
    k = trace.kernels
    dur = k.dur_ns if len(k) else np.zeros(0, dtype=np.int64)
    total = int(dur.sum()) if len(k) else 0
    codes = np.asarray(k["name"]) if len(k) else np.zeros(0, dtype=np.int32)
    uniq, inv = np.unique(codes, return_inverse=True)
    key_ids: dict[str, int] = {}
    ukeys = np.array([key_ids.setdefault(name_key(trace.name(int(c))), len(key_ids)) for c in uniq], dtype=np.int64)
    tkeys = ukeys[inv] if len(codes) else np.zeros(0, dtype=np.int64)
    per_name_ns = np.zeros(len(uniq), dtype=np.int64)
    per_name_n = np.zeros(len(uniq), dtype=np.int64)
    if len(codes):
        np.add.at(per_name_ns, inv, dur)
        np.add.at(per_name_n, inv, 1)
    nkeys = [key_ids.get(name_key(r.name), -1) for r in km.kernels]
    rows: list[int | None]
    aligned, first, candidates = False, None, 0
    if nkeys and all(x >= 0 for x in nkeys):
        first, candidates, best = _align(tkeys, nkeys)
        if best is not None:
            rows, aligned = list(best), True
    if not aligned:
        rows = []
        for x in nkeys:
            hit = np.flatnonzero(tkeys == x) if x >= 0 else np.zeros(0, dtype=np.int64)
            rows.append(int(hit[0]) if len(hit) else None)
    matches = []
    for rec, row in zip(km.kernels, rows):
        if row is None:
            matches.append(NcuMatch(rec.id, None, None, None, None, None, None))
            continue
        u = int(inv[row])
        matches.append(NcuMatch(
            kernel_id=rec.id, trace_row=row, trace_name=trace.name(int(codes[row])),
            trace_duration_ns=int(dur[row]), name_total_ns=int(per_name_ns[u]), name_count=int(per_name_n[u]),
            time_share=(float(per_name_ns[u]) / total) if total > 0 else None,
        ))
    return NcuJoin(matches=tuple(matches), matched=sum(m.trace_row is not None for m in matches),
                   aligned=aligned, first_row=first, candidates=candidates, total_kernel_ns=total)
