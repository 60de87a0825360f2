"""Arrays derived from one Trace that several analyses read, computed once per Trace object.

Model: a :class:`~tracestory.trace.Trace` is immutable (its tables are never written in place), so
an array computed from it stays right for as long as that Trace object lives. :func:`memo` keeps
such arrays in a table keyed on the Trace's identity. Each entry is dropped by a finalizer of its
Trace (a weak reference: the entry never keeps the Trace alive, and holds none of its objects), so
nothing outlives the trace, and a second load, a window or any other new Trace gets its own
entries. Cached arrays are made read-only: a caller that writes into one fails at once instead of
changing what the next caller reads.

What is cached (the callers name their keys): in ``links``, the API rows sorted by correlation id,
each GPU op's launch row and launch times, the GPU-op columns (times in int64), their start order
and the union of every GPU op; in ``timeline``, the idle gaps with the op before and after each.
The timeline, stream stats, phases, gaps, exposure, idle gaps, tables, operators and the critical
path all read these, which used to be recomputed up to a dozen times per trace.

Limits: identity, not content: two equal Trace objects compute their arrays twice. A value must
not refer to its Trace (the entry would keep it alive). Not locked: two threads asking for the same
entry at once may both compute it (same result; one is kept).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..trace import Trace

T = TypeVar("T")

# id(trace) -> {key: value}; an entry is removed by the trace's finalizer (see the module docstring).
_ENTRIES: dict[int, dict[str, Any]] = {}


def _read_only(value: Any) -> None:
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, tuple):
        for v in value:
            _read_only(v)


def memo(trace: Trace, key: str, compute: Callable[[], T]) -> T:
    """``compute()`` the first time ``key`` is asked of this ``trace`` object, the kept value after.
    Arrays in the value (also inside a tuple) are made read-only."""
    tid = id(trace)
    entry = _ENTRIES.get(tid)
    if entry is None:
        entry = _ENTRIES[tid] = {}
        # Runs when the trace is freed (before its id can be reused) or at exit.
        weakref.finalize(trace, _ENTRIES.pop, tid, None)
    if key in entry:
        return entry[key]  # type: ignore[no-any-return]
    value = compute()
    _read_only(value)
    entry[key] = value
    return value


SHAPE_ROWS_LOOKED_AT = 100_000


def op_shapes_recorded(trace: Trace) -> bool:
    """Whether the trace's CPU ops carry input shapes (Kineto's ``record_shapes=True``): some op
    among the first :data:`SHAPE_ROWS_LOOKED_AT` has an ``input_dims`` cell other than empty or
    ``[]`` (cells are the raw JSON text, bytes or str). Readers without shapes leave the column
    empty or out."""
    ops = trace.ops
    if not len(ops) or "input_dims" not in ops:
        return False
    return memo(trace, "op_shapes_recorded",
                lambda: any(len(d) > 2 for d in filter(None, ops["input_dims"][:SHAPE_ROWS_LOOKED_AT])))


def cached_traces() -> int:
    """How many Trace objects have entries now (for tests: entries die with their trace)."""
    return len(_ENTRIES)


__all__ = ["cached_traces", "memo", "op_shapes_recorded"]
