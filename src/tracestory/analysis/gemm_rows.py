"""Rows (M) of the GEMM ops of a trace, read from their recorded input shapes.

One reader for every part that asks how many rows a matrix multiply had (the workload's
decode/prefill signals, the Execution Story's "prefill M against decode M").

Model: M is the product of all but the last dimension of the left operand, the operand whose
rows become the output's rows. For ``aten::addmm`` and ``aten::baddbmm`` the left operand is the
second input (the first is the bias/``self`` added to the product); for every other op it is the
first input. So ``linear`` on (B, S, K) gives B*S, ``mm`` on (M, K) gives M, ``bmm`` on (B, M, K)
gives B*M (all rows of the batch).

Limits: needs ``record_shapes`` (ops without a shape cell, or whose left operand is not a list of
at least two integers, are left out); a scalar or 1-D left operand has no rows. Nested calls
count once: of the GEMM ops with a known M nested on one thread (``linear`` calling ``addmm``,
``matmul`` calling ``bmm``) only the outermost is kept, whose M is the same rows seen before the
reshape (a ``linear`` whose input shape was not recorded leaves its ``addmm`` counted).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..ingest.kineto import parse_json_field
from ..trace import Trace
from .derived import memo
from .nesting import nest_intervals, thread_codes

GEMM_OPS = ("aten::linear", "aten::mm", "aten::addmm", "aten::matmul", "aten::_scaled_mm", "aten::bmm")
"""The ops whose left operand's rows are the GEMM's M."""

_LEFT_IS_SECOND = frozenset({"aten::addmm", "aten::baddbmm"})


def _rows_of(dims: object, left: int) -> int | None:
    if not isinstance(dims, list) or len(dims) <= left:
        return None
    a = dims[left]
    if isinstance(a, list) and len(a) >= 2 and all(isinstance(d, int) and not isinstance(d, bool) for d in a):
        return int(np.prod(a[:-1], dtype=np.int64))
    return None


def _outermost(ops, sel: np.ndarray) -> np.ndarray:
    """Mask of the rows of ``sel`` not nested inside another row of ``sel`` on their thread."""
    if sel.size < 2:
        return np.ones(sel.size, dtype=bool)
    start = ops["start_ns"][sel].astype(np.int64)
    end = ops["end_ns"][sel].astype(np.int64)
    (thread,) = thread_codes(ops["pid"][sel], ops["tid"][sel])
    none = np.zeros(0, dtype=np.int64)
    nest, _ = nest_intervals(start, end, thread, none, none, np.arange(sel.size))
    nested = np.zeros(sel.size, dtype=bool)
    nested[nest.source_row[nest.depth > 0]] = True  # empty intervals are never nested, so kept
    return ~nested


def gemm_rows(trace: Trace, names: Iterable[str] = GEMM_OPS) -> tuple[np.ndarray, np.ndarray]:
    """(op row indices, M) of the ops named ``names`` whose left operand's shape was recorded,
    indices ascending (read-only arrays, kept per trace: the story asks twice, per phase set).
    Each distinct (op name, shape cell) is decoded once: a model repeats a few shapes over
    thousands of calls."""
    wanted = tuple(sorted(set(names)))
    return memo(trace, "gemm_rows:" + ",".join(wanted), lambda: _gemm_rows(trace, wanted))


def _gemm_rows(trace: Trace, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    ops = trace.ops
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if not len(ops) or "input_dims" not in ops:
        return empty
    left = {c: int(n in _LEFT_IS_SECOND) for n in names if (c := trace.code_of(n)) >= 0}
    if not left:
        return empty
    sel = np.flatnonzero(np.isin(ops["name"], list(left)))
    cells = ops["input_dims"][sel]
    codes = ops["name"][sel]
    decoded: dict = {}
    rows = np.full(sel.size, -1, dtype=np.int64)
    for j, (code, cell) in enumerate(zip(codes.tolist(), cells.tolist(), strict=True)):
        key = (code, cell)
        if key not in decoded:
            dims = parse_json_field(cell) if isinstance(cell, (bytes, bytearray)) else None
            decoded[key] = _rows_of(dims, left[code])
        m = decoded[key]
        if m is not None:
            rows[j] = m
    ok = rows >= 0
    sel, rows = sel[ok], rows[ok]
    keep = _outermost(ops, sel)
    return sel[keep], rows[keep]
