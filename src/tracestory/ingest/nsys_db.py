"""Reading an Nsight Systems SQLite export: integer columns as numpy arrays, string ids as codes.

Columns
-------
:meth:`Db.read` returns the asked integer columns of one table in rowid order, NULL as -1.
It first decodes the table's B-tree pages directly (:mod:`.nsys_btree`, ~10x faster than
SQLite's per-value decoding); when a page or record is outside what that reader verifies it
reads through SQLite instead: one ``group_concat`` text per column and chunk of rowids, parsed
by ``np.fromstring`` at C speed (Python's ``sqlite3`` would create one object per value),
chunks read by a small thread pool (sqlite releases the GIL while it steps).

Names
-----
``StringIds`` is read once; :meth:`Names.codes` maps an id column to codes of the trace's
:class:`StringPool` through a lookup array indexed by id, so Python touches each distinct id
once and the rows cost one numpy gather.
"""

from __future__ import annotations

import os
import sqlite3
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError
from ..trace import StringPool
from . import nsys_btree

_CHUNK_ROWS = 1 << 18  # rows per group_concat of the SQLite path
_LOW24 = 0xFFFFFF
_DENSE = 1 << 24  # ids below this are mapped through a lookup array, larger ones by np.unique


def _connect(uri: str) -> sqlite3.Connection:
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    # Exports carry user/host strings in the platform's encoding; never fail on them.
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


class Db:
    """A read-only connection plus the schema (tables and their columns)."""

    def __init__(self, path: Path, fast: bool = True):
        self.path = path
        self.fast = fast  # False: always read through SQLite (tests compare both paths)
        self.uri = f"{path.resolve().as_uri()}?mode=ro"
        try:
            self.con = _connect(self.uri)
            rows = self.con.execute("SELECT name, type, rootpage FROM sqlite_master "
                                    "WHERE type IN ('table', 'view')").fetchall()
        except sqlite3.DatabaseError as e:
            raise TraceFormatError(path, "an Nsight Systems SQLite export", f"a file SQLite cannot read ({e})") from None
        self.tables = {r[0] for r in rows}
        self._root = {r[0]: r[2] for r in rows if r[1] == "table" and r[2]}
        self._info: dict[str, list[tuple]] = {}
        self.fast_tables: set[str] = set()  # tables read by the page reader (for tests and notes)

    def close(self) -> None:
        self.con.close()

    def _table_info(self, table: str) -> list[tuple]:
        if table not in self._info:
            self._info[table] = (self.con.execute(f'PRAGMA table_info("{table}")').fetchall()
                                 if table in self.tables else [])
        return self._info[table]

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self._table_info(table)}

    def rows(self, sql: str) -> list[tuple]:
        return self.con.execute(sql).fetchall()

    def read(self, table: str, cols: dict[str, str], dtypes: dict[str, type] | None = None) -> dict[str, np.ndarray]:
        """``key -> column`` of ``table`` (each column must exist), in rowid order, NULL as -1;
        int64 unless ``dtypes`` says otherwise."""
        dtypes = dtypes or {}
        if not cols:
            return {}
        try:
            (n,), = self.con.execute(f'SELECT count(*) FROM "{table}"').fetchall()
        except sqlite3.DatabaseError as e:
            raise TraceFormatError(self.path, f"a readable {table} table", str(e)) from None
        if n == 0:
            return {k: np.empty(0, dtypes.get(k, np.int64)) for k in cols}
        out = self._read_pages(table, cols, n, dtypes) if self.fast else None
        if out is None:
            out = self._read_sql(table, cols)
            out = {k: v.astype(dtypes[k]) if k in dtypes else v for k, v in out.items()}
        else:
            self.fast_tables.add(table)
        return out

    def _read_pages(self, table: str, cols: dict[str, str], n: int, dtypes: dict) -> dict[str, np.ndarray] | None:
        info = self._table_info(table)
        if table not in self._root or not info:
            return None
        names = [r[1] for r in info]
        pk = [r for r in info if r[5]]
        # an INTEGER PRIMARY KEY column is the rowid, stored as NULL in the record
        alias = names.index(pk[0][1]) if len(pk) == 1 and pk[0][2].upper() == "INTEGER" else None
        index = {k: names.index(c) for k, c in cols.items()}
        return nsys_btree.read_columns(self.path, self._root[table], len(names), index, n,
                                       rowid_alias=alias, dtypes=dtypes)

    def _read_sql(self, table: str, cols: dict[str, str]) -> dict[str, np.ndarray]:
        lo, hi = self.con.execute(f'SELECT min(rowid), max(rowid) FROM "{table}"').fetchone()
        sql = (f'SELECT count(*), {", ".join(f"group_concat(IFNULL({c}, -1))" for c in cols.values())} '
               f'FROM "{table}" WHERE rowid >= ? AND rowid < ?')
        spans = list(pairwise(list(range(lo, hi + 1, _CHUNK_ROWS)) + [hi + 1]))
        if len(spans) == 1:
            parts = [self._chunk(sql, table, *spans[0], con=self.con)]
        else:
            workers = max(1, min(len(spans), os.cpu_count() or 1, 4))
            with ThreadPoolExecutor(workers) as pool:
                parts = list(pool.map(lambda s: self._chunk(sql, table, *s), spans))
        return {k: np.concatenate([p[i] for p in parts]) for i, k in enumerate(cols)}

    def _chunk(self, sql: str, table: str, a: int, b: int, con=None) -> list[np.ndarray]:
        own = con is None
        if own:
            con = _connect(self.uri)
        try:
            row = con.execute(sql, (a, b)).fetchone()
        finally:
            if own:
                con.close()
        n, texts = row[0], row[1:]
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for text in texts:
                try:
                    arr = np.fromstring(text, sep=",", dtype=np.int64) if text else np.empty(0, np.int64)
                except (ValueError, DeprecationWarning):
                    arr = None
                if arr is None or len(arr) != n:
                    raise TraceFormatError(self.path, f"integer columns in {table}",
                                           f"values that are not integers near {str(text)[:40]!r}")
                out.append(arr)
        return out


def as_text(v) -> str:
    """A value SQLite returned where a string belongs, as a string (a blob decoded leniently)."""
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return "" if v is None else str(v)


class Names:
    """``StringIds`` ids -> codes of the trace's StringPool, touching each distinct id once."""

    def __init__(self, db: Db, pool: StringPool):
        self.pool = pool
        # CAST: a damaged or hand-edited export may hold a number or a blob where a string
        # belongs; SQLite turns it into text (decoded leniently by the connection)
        self.ids = (dict(db.rows("SELECT id, CAST(value AS TEXT) FROM StringIds")) if "StringIds" in db.tables
                    else {})
        if None in self.ids.values():
            self.ids = {i: v or "" for i, v in self.ids.items()}
        self.unknown: set[int] = set()  # ids looked up and not found (named "<string ID>")

    def codes(self, ids: np.ndarray, transform: Callable[[str], str] | None = None) -> np.ndarray:
        def make(i: int) -> str:
            if i >= 0 and i not in self.ids:
                self.unknown.add(i)
            s = self.ids.get(i, f"<string {i}>") if i >= 0 else ""
            return transform(s) if transform is not None else s

        return self.strings_of(ids, make)

    def strings_of(self, labels: np.ndarray, make: Callable[[int], str]) -> np.ndarray:
        """int32 codes for labels computed by ``make(label) -> str`` over the distinct labels."""
        return map_distinct(labels, lambda uniq: self.pool.encode([make(int(u)) for u in uniq]))


def map_distinct(values: np.ndarray, *fs: Callable[[np.ndarray], np.ndarray], dtype=np.int32):
    """``f(distinct values)[index of each value]`` for each ``f`` (a tuple when several): each
    ``f`` sees each distinct value once. Values within a range of 2**24 (string ids, enum keys,
    the threads of one process: the usual case) go through a lookup array indexed by value (one
    gather per ``f``, no sort); anything else through ``np.unique``."""
    values = np.asarray(values)
    if len(values) == 0:
        out = tuple(np.empty(0, dtype) for _ in fs)
    else:
        lo, hi = int(values.min()), int(values.max())
        if lo == hi:  # one value (one process, one device): no per-row lookup at all
            out = tuple(np.full(len(values), np.asarray(f(np.array([lo])))[0], dtype) for f in fs)
        elif hi - lo < _DENSE:
            base = 0 if 0 <= lo and hi < _DENSE else lo  # ids index the lookup array as they are
            idx = values - base if base else values
            present = np.zeros(hi + 1 - base, bool)
            present[idx] = True
            uniq = np.flatnonzero(present)
            out = []
            for f in fs:
                lut = np.zeros(len(present), dtype)
                lut[uniq] = f(uniq + base)
                out.append(lut[idx])
            out = tuple(out)
        else:
            uniq, inv = np.unique(values, return_inverse=True)
            out = tuple(np.asarray(f(uniq), dtype)[inv.reshape(-1)] for f in fs)
    return out[0] if len(fs) == 1 else out


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values; O(n) when all are equal (one process: the usual export)."""
    if len(values) and values.min() == values.max():
        return values[:1].copy()
    return np.unique(values)


def _pid(u: np.ndarray) -> np.ndarray:
    return np.where(u >= 0, (u >> 24) & _LOW24, -1)


def pid_of(global_pid: np.ndarray) -> np.ndarray:
    """Process id of each ``globalPid`` (-1 stays -1)."""
    return map_distinct(global_pid, _pid, dtype=np.int64)


def split_global_tid(global_tid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pid, tid, process key)`` of each ``globalTid``; the key is the process's ``globalPid``
    (the thread bits cleared). -1 stays -1."""
    return map_distinct(global_tid, _pid, lambda u: np.where(u >= 0, u & _LOW24, -1),
                        lambda u: np.where(u >= 0, u & ~np.int64(_LOW24), -1), dtype=np.int64)
