"""The Trace model: one process's (rank's) GPU and CPU activity as columnar tables.

Every source (Kineto JSON, Nsight Systems SQLite or CSV) fills the same model, so every
analysis works on every source.

Conventions
-----------
* One ``Trace`` per rank / process. Times are **integer nanoseconds** on the source's clock;
  intervals are ``[start_ns, end_ns)``. Sizes are bytes, work is FLOPs.
* Tables are :class:`Table` objects: equal-length numpy columns, never lists of objects.
* Names are dictionary-encoded: every ``name`` (and ``domain``) column holds ``int32`` codes
  into ``Trace.strings``. Classify or group on the codes, then look names up once.
* A missing integer is ``-1``, a missing float ``NaN``. Analyses turn those into ``None``;
  a missing value is never reported as 0.

Tables and their columns are listed in :data:`SCHEMAS`; :func:`make_table` fills the
columns a source does not have with the missing value, so every table always has every
column of its schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from .errors import ToolNotFound

I1, I4, I8, F8, OBJ = np.int8, np.int32, np.int64, np.float64, object

# Memory-operation kinds (``memops["kind"]`` is an index into this tuple).
MEMOP_KINDS: tuple[str, ...] = (
    "memset",
    "memcpy_htod",
    "memcpy_dtoh",
    "memcpy_dtod",
    "memcpy_htoh",
    "memcpy_peer",
    "memcpy_other",
)
MEMSET = 0

# API call kinds (``api["kind"]``).
API_RUNTIME, API_DRIVER = 0, 1
# Range sides (``ranges["side"]``).
CPU_SIDE, GPU_SIDE = 0, 1

SCHEMAS: dict[str, dict[str, type]] = {
    "kernels": {
        "start_ns": I8, "end_ns": I8, "device": I4, "stream": I8, "correlation": I8,
        "name": I4, "external_id": I8, "pid": I8,
        "grid_x": I4, "grid_y": I4, "grid_z": I4, "block_x": I4, "block_y": I4, "block_z": I4,
        "registers_per_thread": I4, "shared_mem_bytes": I8,
    },
    "memops": {
        "start_ns": I8, "end_ns": I8, "device": I4, "stream": I8, "correlation": I8,
        "name": I4, "external_id": I8, "pid": I8, "kind": I4, "bytes": I8,
    },
    "api": {
        "start_ns": I8, "end_ns": I8, "name": I4, "correlation": I8, "pid": I8, "tid": I8,
        "external_id": I8, "kind": I4,
    },
    "ops": {
        "start_ns": I8, "end_ns": I8, "name": I4, "pid": I8, "tid": I8, "external_id": I8,
        "flops": F8, "input_dims": OBJ, "input_types": OBJ,
        # attention ops' score mask (Kineto "Concrete Inputs"): -1 unknown, 0 full,
        # 1 causal top-left aligned, 2 causal bottom-right aligned (ingest.kineto_attention)
        "causal": I1,
    },
    "ranges": {
        "start_ns": I8, "end_ns": I8, "name": I4, "side": I4, "pid": I8, "tid": I8,
        "device": I4, "depth": I4, "external_id": I8, "domain": I4,
    },
    "memory": {
        "ts_ns": I8, "device": I4, "allocated_bytes": I8, "reserved_bytes": I8,
        "delta_bytes": I8, "pid": I8,
    },
    # One row per collective (NCCL) kernel whose source recorded the collective's arguments
    # (Kineto's "Collective name", "In msg nelems", ...). ``kernel_index`` is the row of the
    # kernel in ``kernels`` (-1 when unknown); ``name``, ``dtype``, ``pg_name`` and ``pg_ranks``
    # are string codes (``pg_ranks`` in the canonical form "[0, 1]"); ``seq`` is the process
    # group's sequence number when recorded, else -1. Sizes are element counts.
    "collectives": {
        "kernel_index": I8, "start_ns": I8, "end_ns": I8, "name": I4, "in_nelems": I8,
        "out_nelems": I8, "group_size": I4, "dtype": I4, "pg_name": I4, "pg_ranks": I4,
        "seq": I8, "device": I4, "stream": I8,
    },
    # OS runtime library calls (Nsight Systems ``--trace=osrt``: ``OSRT_API``), kept apart
    # from ``api`` so that no CUDA analysis sees them; read by the ``osrt_sum`` table only.
    "osrt": {"start_ns": I8, "end_ns": I8, "name": I4, "pid": I8, "tid": I8},
}


def _missing(dtype: type, n: int) -> np.ndarray:
    if dtype is OBJ:
        return np.full(n, None, dtype=object)
    if dtype is F8:
        return np.full(n, np.nan)
    return np.full(n, -1, dtype=dtype)


class Table:
    """Equal-length numpy columns. Immutable by convention: methods return new tables."""

    __slots__ = ("_cols", "_n")

    def __init__(self, columns: Mapping[str, np.ndarray]):
        cols = {k: np.asarray(v) for k, v in columns.items()}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of unequal length: { {k: len(v) for k, v in cols.items()} }")
        self._cols = cols
        self._n = lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, column: str) -> np.ndarray:
        return self._cols[column]

    def __contains__(self, column: str) -> bool:
        return column in self._cols

    def __repr__(self) -> str:
        return f"Table({self._n} rows: {', '.join(self._cols)})"

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._cols)

    def take(self, index: np.ndarray) -> "Table":
        """Rows selected by an integer index array or a boolean mask."""
        return Table({k: v[index] for k, v in self._cols.items()})

    def sorted_by(self, *columns: str) -> "Table":
        """Rows ordered by the given columns (first is the primary key); stable."""
        order = np.lexsort(tuple(self._cols[c] for c in reversed(columns)))
        return self.take(order)

    def with_columns(self, **columns: np.ndarray) -> "Table":
        return Table({**self._cols, **columns})

    @property
    def dur_ns(self) -> np.ndarray:
        """``end_ns - start_ns`` for interval tables."""
        return self._cols["end_ns"] - self._cols["start_ns"]

    @staticmethod
    def concat(tables: Sequence["Table"]) -> "Table":
        tables = [t for t in tables if t is not None]
        if not tables:
            return Table({})
        keys = tables[0].columns
        return Table({k: np.concatenate([t[k] for t in tables]) for k in keys})


def make_table(kind: str, /, n: int | None = None, **columns: Iterable) -> Table:
    """Build a table of schema ``kind``; absent columns get the missing value.

    ``n`` is needed only when no column is given (an empty or all-missing table).
    """
    schema = SCHEMAS[kind]
    unknown = set(columns) - set(schema)
    if unknown:
        raise KeyError(f"{kind}: unknown columns {sorted(unknown)}")
    arrays = {}
    for name, values in columns.items():
        dtype = schema[name]
        if dtype is OBJ:
            arr = np.empty(len(values), dtype=object)
            arr[:] = list(values) if not isinstance(values, np.ndarray) else values
        else:
            arr = np.asarray(values, dtype=dtype)
        arrays[name] = arr
    if n is None:
        n = len(next(iter(arrays.values()))) if arrays else 0
    return Table({c: arrays[c] if c in arrays else _missing(t, n) for c, t in schema.items()})


def empty_table(kind: str) -> Table:
    return make_table(kind, n=0)


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` (sorted distinct values, and each element's index
    among them) for a 1-D integer column, in O(n) when its values span a range no wider than a few
    times its length, as dictionary codes and stream ids do: a presence table over the range
    instead of a sort (a sort of 2 M name codes took ~0.2 s; this, ~0.02 s). Anything else (floats,
    a sparse range) is handed to ``np.unique``; the result is the same either way."""
    v = np.asarray(values)
    if v.ndim != 1 or v.size == 0 or v.dtype.kind not in "iu":
        return np.unique(v, return_inverse=True)
    lo, hi = int(v.min()), int(v.max())
    span = hi - lo + 1
    if span > 4 * v.size + 1024:
        return np.unique(v, return_inverse=True)
    offset = v.astype(np.int64) - lo if lo else v
    present = np.zeros(span, dtype=bool)
    present[offset] = True
    uniq = np.flatnonzero(present)
    lookup = np.empty(span, dtype=np.intp)
    lookup[uniq] = np.arange(uniq.size)
    return (uniq + lo).astype(v.dtype), lookup[offset]


class StringPool:
    """Dictionary encoder shared by all tables of one trace.

    ``encode`` factorizes a batch of strings at C speed (``dict.fromkeys`` + ``map``); only
    the batch's distinct values are touched by Python code.
    """

    def __init__(self, strings: Iterable[str] = ("",)):
        self._index: dict[str, int] = {}
        self.strings: list[str] = []
        for s in strings:
            self.code(s)

    def code(self, s: str) -> int:
        c = self._index.get(s)
        if c is None:
            c = self._index[s] = len(self.strings)
            self.strings.append(s)
        return c

    def known(self, names: Iterable[str]) -> dict[str, int]:
        """The codes of those of ``names`` already in the pool (none is added)."""
        return {n: self._index[n] for n in names if n in self._index}

    def encode(self, values: Sequence[str]) -> np.ndarray:
        try:  # usually every value is known already (later chunks of a trace): one pass
            return np.fromiter(map(self._index.__getitem__, values), dtype=np.int32, count=len(values))
        except KeyError:
            pass
        for s in dict.fromkeys(values):
            if s not in self._index:
                self.code(s)
        return np.fromiter(map(self._index.__getitem__, values), dtype=np.int32, count=len(values))


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as the source describes it. Unknown fields are ``None``."""

    id: int
    name: str
    sm_count: int | None = None
    cc_major: int | None = None
    cc_minor: int | None = None
    total_memory_bytes: int | None = None
    l2_cache_bytes: int | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    clock_hz: float | None = None

    @property
    def compute_capability(self) -> str | None:
        if self.cc_major is None:
            return None
        return f"{self.cc_major}.{self.cc_minor if self.cc_minor is not None else 0}"


@dataclass(frozen=True)
class TraceMeta:
    """Where a trace came from and what it ran on."""

    source_path: str
    source_format: str  # "kineto", "nsys-sqlite", "nsys-csv"
    format_version: str | None = None
    devices: tuple[DeviceInfo, ...] = ()
    rank: int | None = None
    world_size: int | None = None
    process_id: int | None = None
    process_name: str | None = None
    distributed: Mapping | None = None
    # Whether kernels carry real start times (False for a summary-only input such as
    # ``nsys stats cuda_gpu_kern_sum``: breakdown works, timeline analyses do not).
    has_timeline: bool = True
    extra: Mapping = field(default_factory=dict)
    # What the reader dropped or repaired and why, with counts, one short sentence each
    # ("848 kernel events without ph 'X' ignored"). Empty for an undamaged file.
    warnings: tuple[str, ...] = ()

    @property
    def stated_warnings(self) -> tuple[str, ...]:
        """The damage the reader stated: ``warnings``, else the ``warnings`` a reader kept in ``extra``."""
        if self.warnings:
            return tuple(self.warnings)
        return tuple((self.extra or {}).get("warnings", ()))


@dataclass(frozen=True)
class Trace:
    """One rank's activity. See the module docstring for conventions."""

    meta: TraceMeta
    strings: tuple[str, ...]
    kernels: Table
    memops: Table
    api: Table
    ops: Table
    ranges: Table
    memory: Table
    collectives: Table = field(default_factory=lambda: empty_table("collectives"))
    osrt: Table = field(default_factory=lambda: empty_table("osrt"))

    def name(self, code: int) -> str:
        return self.strings[code] if code >= 0 else ""

    def names(self, codes: np.ndarray) -> np.ndarray:
        """Object array of names for an array of codes."""
        table = np.asarray(self.strings, dtype=object)
        return table[np.asarray(codes)]

    def code_of(self, name: str) -> int:
        try:
            return self.strings.index(name)
        except ValueError:
            return -1

    def __repr__(self) -> str:
        return (f"Trace({self.label!r}, {self.meta.source_format}, kernels={len(self.kernels)}, "
                f"memops={len(self.memops)}, ops={len(self.ops)}, ranges={len(self.ranges)})")

    def kernels_frame(self):
        """The kernels as a ``pandas.DataFrame``, one row per kernel in start order, with real
        names (not codes) and the unit in each column name: ``name``, ``start_ns``, ``end_ns``,
        ``dur_ns``, ``device``, ``stream``, ``correlation``, ``grid_x`` .. ``block_z``,
        ``registers_per_thread``, ``shared_mem_bytes``. A value the source did not record is
        ``<NA>`` (nullable integer columns), never -1. pandas is optional (``pip install pandas``).
        With the analysis's ``category``, ``phase`` and ``op`` columns:
        ``tracestory.analyze(trace).kernels_frame()``.

        >>> t = tracestory.load("trace.json.gz")                              # doctest: +SKIP
        >>> df = t.kernels_frame()                                            # doctest: +SKIP
        >>> df.groupby("name")["dur_ns"].agg(["count", "sum", "median"]).nlargest(5, "sum")  # doctest: +SKIP
        """
        try:
            import pandas as pd
        except ImportError:
            raise ToolNotFound("pandas", "pip install pandas (the kernels are also in Trace.kernels)") from None
        k = self.kernels
        cols = {"name": pd.array(self.names(k["name"]).tolist() if len(k) else [], dtype="string"),
                "start_ns": k["start_ns"].astype(np.int64), "end_ns": k["end_ns"].astype(np.int64),
                "dur_ns": k.dur_ns.astype(np.int64)}
        for c in ("device", "stream", "correlation", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                  "registers_per_thread", "shared_mem_bytes"):
            v = k[c].astype(np.int64)
            cols[c] = pd.array(np.where(v < 0, 0, v), dtype="Int64")
            cols[c][v < 0] = pd.NA
        return pd.DataFrame(cols)

    @property
    def label(self) -> str:
        """Short human label: file name plus the rank of a distributed run (a ``rank0`` file
        name alone, with no world size above 1, is a single process and gets no rank)."""
        import os

        base = os.path.basename(self.meta.source_path)
        r, w = self.meta.rank, self.meta.world_size
        distributed = r is not None and (r > 0 or (w is not None and w > 1))
        return f"{base} (rank {r})" if distributed else base


def build_trace(meta: TraceMeta, pool: StringPool, **tables: Table) -> Trace:
    """Assemble a Trace; absent tables are empty, each table is sorted by start time. A table
    already in order (exports usually are) is kept as it is: one O(n) check instead of a sort
    and a copy of every column.

    ``collectives["kernel_index"]`` is given as a row of the ``kernels`` table as passed in and
    is renumbered here to the row of the same kernel after sorting."""
    out = {}
    kernel_order = None
    for kind in SCHEMAS:
        t = tables.get(kind)
        if t is None or len(t) == 0:
            out[kind] = empty_table(kind) if t is None else t
            continue
        key = "ts_ns" if kind == "memory" else "start_ns"
        col = t[key]
        if len(col) < 2 or bool((col[1:] >= col[:-1]).all()):
            out[kind] = t  # a stable sort would not move any row
            continue
        if kind == "kernels":
            # same order as Table.sorted_by (a stable sort on one key), kept for the renumbering
            kernel_order = np.argsort(t["start_ns"], kind="stable")
            out[kind] = t.take(kernel_order)
            continue
        out[kind] = t.sorted_by(key)
    coll = out["collectives"]
    if len(coll) and kernel_order is not None:
        new_row = np.empty(kernel_order.size, dtype=np.int64)
        new_row[kernel_order] = np.arange(kernel_order.size)
        ki = coll["kernel_index"]
        ok = (ki >= 0) & (ki < kernel_order.size)
        out["collectives"] = coll.with_columns(
            kernel_index=np.where(ok, new_row[np.where(ok, ki, 0)], -1).astype(np.int64))
    return Trace(meta=meta, strings=tuple(pool.strings), **out)
