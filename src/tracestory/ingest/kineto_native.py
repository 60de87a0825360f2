"""The compiled fast path of the Kineto reader: one chunk of events -> columns, no object per event.

Model
-----
:mod:`.kineto` cuts the ``traceEvents`` array into chunks (``[`` + whole events + ``]``). Each
chunk is first offered to ``_kineto_scan.scan`` (C, ``_kineto_scan.c``), which reads the text
once and writes, for every event, the fields the reader keeps straight into columns: ``ph``,
``cat`` (an index into the known categories), ``name`` (a code into the chunk's distinct names),
``pid``/``tid``, ``ts``/``dur``, the integer args, ``flops``, ``grid``/``block``, and, for the few
rows that carry them, the raw JSON of "Input Dims", "Input dims", "Input type", "Concrete Inputs"
and the metadata ``args.name``. :class:`NativeChunk` offers those columns to the reader's
builder through the same small interface as the msgspec structs (:class:`kineto._StructChunk`),
so the tables are built by one piece of code whichever path read the chunk.

Exactness
---------
The scanner is stricter than msgspec's typed decode and never laxer: a chunk it does not read
exactly as that decode would (a value of an unexpected type, an int written as a float, a
duplicate key, an escape in a key, a string pid with an escape, a grid that is not three ints,
an id beyond 18 digits, a number out of range, nesting deeper than 64, text that is not JSON) comes back ``None`` and is decoded by msgspec as before: a chunk is
read by one path completely. Numbers are rounded exactly as msgspec rounds them (one IEEE
operation on exact operands, or CPython's correctly rounded parser). ``benchmarks/kineto_same.py``
and ``tests/ingest/test_kineto_native.py`` compare the two paths' tables on every trace in the
repository.

The extension is built by ``pip install`` where a C compiler is at hand (setup.py; optional). Without
it, or with ``TRACESTORY_KINETO_NATIVE=0``, every chunk goes the msgspec way.
"""

from __future__ import annotations

import os
from collections import Counter
from itertools import compress
from collections.abc import Callable

import msgspec
import numpy as np

try:
    from . import _kineto_scan
except ImportError:  # built without a compiler: the msgspec path reads everything
    _kineto_scan = None  # type: ignore[assignment]

# The integer args, in the scanner's order, with their defaults when absent.
INT_ARGS = ("external_id", "correlation", "device", "stream", "bytes", "registers", "shared_memory",
            "total_allocated", "total_reserved", "delta_bytes", "device_id", "device_type",
            "in_nelems", "out_nelems", "group_size", "seq", "seq_lower")
_INT_INDEX = {name: i for i, name in enumerate(INT_ARGS)}
# The raw JSON args, in the scanner's order.
RAW_ARGS = ("input_dims", "input_dims_2021", "input_types", "concrete_inputs", "name", "coll_name", "dtype",
            "pg_name", "pg_ranks")
_RAW_INDEX = {name: i for i, name in enumerate(RAW_ARGS)}
_PID_STR = 1  # flags: the pid was a string (its first integer is in pid)
_M = ord("M")


def enabled() -> bool:
    """Whether chunks are offered to the compiled scanner (built, and not switched off)."""
    return _kineto_scan is not None and os.environ.get("TRACESTORY_KINETO_NATIVE", "1") != "0"


def release() -> None:
    """Free the scanner's buffers, which it keeps from chunk to chunk of one file."""
    if _kineto_scan is not None:
        _kineto_scan.release()


class NativeChunk:
    """One chunk's columns from the scanner: a row per event in file order, but the flows (ph
    s/t/f) of categories the reader does not know ("ac2g", "fwdbwd"), which are only counted.

    ``cat_kind`` maps a category index (the scanner's) to the reader's table kind; the last
    entry serves unknown categories (index -1)."""

    def __init__(self, result: tuple, cats: tuple[str, ...], cat_kind: np.ndarray, names: list[str]):
        (n, flows, ph, cat, name, flags, pid, tid, ts, dur, flops, ints, grid, block, raws, _, _) = result
        self.n = n
        self.event_count = n + flows  # flows (ph s/t/f) of other categories are counted, not rows
        # views of the scanner's buffers (bytearrays it writes again on its next call, unless a
        # view is still alive then): the builder copies what it keeps
        self.ph = np.frombuffer(ph, dtype=np.uint8, count=n)
        self.cat = np.frombuffer(cat, dtype=np.int8, count=n)
        self.name = np.frombuffer(name, dtype=np.int32, count=n)
        self.flags = np.frombuffer(flags, dtype=np.uint8, count=n)
        self.cols = {"pid": np.frombuffer(pid, dtype=np.int64, count=n),
                     "tid": np.frombuffer(tid, dtype=np.int64, count=n),
                     "ts": np.frombuffer(ts, dtype=np.float64, count=n),
                     "dur": np.frombuffer(dur, dtype=np.float64, count=n),
                     "flops": np.frombuffer(flops, dtype=np.float64, count=n)}
        self.ints = np.frombuffer(ints, dtype=np.int64, count=n * len(INT_ARGS)).reshape(n, len(INT_ARGS))
        self.grid = np.frombuffer(grid, dtype=np.int32, count=n * 3).reshape(n, 3)
        self.block = np.frombuffer(block, dtype=np.int32, count=n * 3).reshape(n, 3)
        self.raws = [(np.frombuffer(rows, dtype=np.int64), objs) for rows, objs in raws]
        self.cats = cats
        self.cat_kind = cat_kind
        self.names = names

    def kinds(self) -> np.ndarray:
        return self.cat_kind[self.cat]

    def is_x(self) -> np.ndarray:
        return self.ph == ord("X")

    def cat_counts(self, mask: np.ndarray) -> Counter:
        """Rows of ``mask`` per category, in the order the categories first appear."""
        if not mask.any():
            return Counter()
        codes, first, counts = np.unique(self.cat[mask], return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        return Counter({self.cats[c]: int(k) for c, k in zip(codes[order].tolist(), counts[order].tolist()) if c >= 0})

    def count_cat(self, text: str) -> int:
        return int(np.count_nonzero(self.cat == self.cats.index(text))) if text in self.cats else 0

    def named(self, idx: np.ndarray, text: str) -> np.ndarray:
        code = self.names.index(text) if text in self.names else -1
        return self.name[idx] == code

    def process_names(self, idx: np.ndarray) -> list[tuple[int, str]]:
        """(pid, args.name) of the metadata events named "process_name" among rows ``idx``."""
        rows = idx[(self.ph[idx] == _M) & self.named(idx, "process_name") & (self.flags[idx] & _PID_STR == 0)]
        if not rows.size:
            return []
        raw = self.raw_at("name")
        out = []
        for r in rows.tolist():
            text = raw(r)
            name = msgspec.json.decode(text) if text else ""
            if name:
                out.append((int(self.cols["pid"][r]), name))
        return out

    def rows(self, idx: np.ndarray) -> NativeRows:
        return NativeRows(self, idx)

    def raw_at(self, field: str) -> Callable[[int], bytes]:
        """The raw JSON of ``field`` at a chunk row (``b""`` when absent)."""
        rows, objs = self.raws[_RAW_INDEX[field]]
        at: dict[int, bytes] = {}

        def raw(r: int) -> bytes:
            if not at and rows.size:  # built on the first call: most chunks never ask
                at.update(zip(rows.tolist(), objs))
            return at.get(r, b"")
        return raw


class NativeRows:
    """Rows ``idx`` of a :class:`NativeChunk`, read by the builder (see :class:`kineto._StructRows`)."""

    def __init__(self, chunk: NativeChunk, idx: np.ndarray):
        self.chunk = chunk
        self.idx = idx

    def __len__(self) -> int:
        return len(self.idx)

    def take(self, mask: np.ndarray) -> NativeRows:
        return NativeRows(self.chunk, self.idx[mask])

    def floats(self, field: str) -> np.ndarray:
        return self.chunk.cols[field][self.idx]

    def ints(self, field: str) -> np.ndarray:
        c = self.chunk
        if field in ("pid", "tid"):
            return c.cols[field][self.idx]
        return c.ints[self.idx, _INT_INDEX[field]]

    def dims(self, field: str) -> np.ndarray:
        return (self.chunk.grid if field == "grid" else self.chunk.block)[self.idx]

    def name_codes(self, pool) -> np.ndarray:
        """The rows' names as codes of ``pool``, new names added in their first-seen order here (as
        encoding the names row by row would)."""
        local = self.chunk.name[self.idx]
        if not local.size:
            return np.zeros(0, dtype=np.int32)
        # the first row of each local code, without a sort: written back to front, the first wins
        first = np.full(len(self.chunk.names), local.size, dtype=np.int64)
        first[local[::-1]] = np.arange(local.size - 1, -1, -1)
        present = np.flatnonzero(first < local.size)
        in_order = present[np.argsort(first[present], kind="stable")]
        names = self.chunk.names
        lookup = np.zeros(len(names), dtype=np.int32)
        lookup[in_order] = pool.encode([names[c] for c in in_order.tolist()])
        return lookup[local]

    def _present(self, field: str) -> tuple[np.ndarray, list]:
        """(positions among these rows, raw JSON) of the rows that carry ``field``."""
        rows, objs = self.chunk.raws[_RAW_INDEX[field]]
        if not rows.size or not self.idx.size:
            return np.zeros(0, dtype=np.int64), []
        pos = np.searchsorted(self.idx, rows)
        hit = (pos < len(self.idx)) & (self.idx[np.minimum(pos, len(self.idx) - 1)] == rows)
        if hit.all():
            return pos, objs
        return pos[hit], list(compress(objs, hit))

    def raws(self, field: str) -> np.ndarray:
        """The raw JSON of ``field`` per row as an object array of bytes (``b""`` when absent)."""
        out = np.full(len(self.idx), b"", dtype=object)
        pos, objs = self._present(field)
        if pos.size:
            out[pos] = objs
        return out

    def raw_at(self, field: str) -> Callable[[int], bytes]:
        at = self.chunk.raw_at(field)
        idx = self.idx
        return lambda i: at(int(idx[i]))

    def collectives(self) -> tuple[np.ndarray, list[str]]:
        """(positions, names) of the rows whose "Collective name" is not empty: no work per row
        for the rows without one."""
        pos, objs = self._present("coll_name")
        names = [msgspec.json.decode(raw) for raw in objs]
        keep = [i for i, name in enumerate(names) if name]
        return pos[keep], [names[i] for i in keep]


class Scanner:
    """The compiled scanner, set up with the reader's categories and phases."""

    def __init__(self, cat_kind: dict[str, int], phases: str, flows: str):
        self.cats = tuple(cat_kind)
        self.cat_bytes = tuple(c.encode() for c in self.cats)
        self.cat_kind = np.array([*cat_kind.values(), -1], dtype=np.int8)  # [-1]: an unknown category
        self.phases = phases
        self.flows = flows

    def __call__(self, text: memoryview) -> NativeChunk | None:
        """The chunk's columns, or ``None`` for the msgspec path (see the module docstring)."""
        result = _kineto_scan.scan(text, self.cat_bytes, self.phases, self.flows)
        if result is None:
            return None
        try:
            names = [b.decode() if not esc else msgspec.json.decode(b'"' + b + b'"')
                     for b, esc in zip(result[15], result[16])]
        except (UnicodeDecodeError, msgspec.DecodeError):
            return None
        if len(set(names)) != len(names):  # two spellings of one name (an escape): one code each is wrong
            return None
        return NativeChunk(result, self.cats, self.cat_kind, names)
