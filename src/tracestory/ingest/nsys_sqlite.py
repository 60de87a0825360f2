"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> one :class:`Trace` per process.

Model
-----
An export holds one table per activity kind, times in integer ns on one clock, strings as ids
into ``StringIds``. Tables and what they fill:

=====================================  ===================================================
``CUPTI_ACTIVITY_KIND_KERNEL``         ``kernels`` (demangled name; short names in
                                       ``meta.extra["kernel_short_names"]``)
``CUPTI_ACTIVITY_KIND_MEMCPY/MEMSET``  ``memops``, named as Kineto names them
                                       (``Memcpy HtoD (Pinned -> Device)``, ``Memset (Device)``)
``CUPTI_ACTIVITY_KIND_RUNTIME``        ``api``: eventClass 0 runtime / 1 driver only (other
                                       classes, e.g. 67 backtraces in old exports, dropped);
                                       the ``_vNNNN`` suffix of 2022+ names is stripped
``NVTX_EVENTS``                        ``ranges`` side CPU: push/pop (59) and start/end (60)
                                       ranges, marks (34) as zero-length; name is ``text`` or
                                       ``StringIds[textId]``; ``domain`` is the name from the
                                       domain-create rows (75), "" for the default domain;
                                       ``depth`` is the nesting depth per thread
``CUDA_GPU_MEMORY_USAGE_EVENTS``       ``memory``: allocation (+bytes) / free (-bytes) events;
                                       ``allocated_bytes`` is the running sum per process and
                                       memory (device memory per device, host memory as -1)
``TARGET_INFO_GPU`` (2022+) or         ``meta.devices`` (the devices the process used)
``TARGET_INFO_CUDA_GPU`` (<= 2021)
``EXPORT_META_DATA`` (2022) /          ``meta.format_version`` (product version and schema)
``META_DATA_EXPORT`` (2024+)
=====================================  ===================================================

``globalPid``/``globalTid`` encode the process and thread: ``pid = (g >> 24) & 0xFFFFFF``,
``tid = g & 0xFFFFFF``; the process key of a thread is ``globalTid`` with the low 24 bits
cleared. Every table and every column is optional (2024 exports are lazy: empty tables are
absent); an absent column is the missing value (-1).

Processes: one Trace per process that has kernels or memory operations (ranks of an MPI or
torchrun job captured in one report); when none has, one per process with API calls or NVTX
ranges. With several processes, ``meta.rank`` is the index in OS pid order (an assumption:
the export does not know MPI ranks) and ``meta.world_size`` their count.

Speed
-----
Python's ``sqlite3`` creates one object per value, which caps a row fetch near 1 M rows/s
for a handful of columns. Numeric columns are instead read as one ``group_concat`` text per
column and chunk of rowids, parsed by ``np.fromstring`` at C speed; chunks are read by a
small thread pool (sqlite releases the GIL while it steps). Launch dimensions are packed into
two integers in SQL to cut the number of values. Peak memory is the kept columns plus the
text of the chunks in flight (``_CHUNK_ROWS`` rows each).

Limits
------
Unterminated NVTX ranges (no end: capture stopped inside them) are dropped and counted in
``meta.extra["nvtx_unterminated"]``. ``allocated_bytes`` counts only what was allocated
during the capture (the baseline before it is unknown). Device info of 2021 exports
(``TARGET_INFO_CUDA_GPU``) follows CUPTI's device record (bandwidth in kB/s, clock in kHz).
"""

from __future__ import annotations

import os
import re
import sqlite3
import warnings
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError, UsageError
from ..trace import (
    API_DRIVER,
    API_RUNTIME,
    CPU_SIDE,
    DeviceInfo,
    StringPool,
    Trace,
    TraceMeta,
    build_trace,
    make_table,
)

_CHUNK_ROWS = 1 << 18
_LOW24 = 0xFFFFFF

KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME, NVTX, MEMUSE = "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUDA_GPU_MEMORY_USAGE_EVENTS"

# nsys enums (ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND); note the memory kinds start at
# Pageable = 0, unlike CUPTI's own enum.
_COPY_NAMES = ("Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP",
               "UVM HtoD", "UVM DtoH", "UVM DtoD")
# MEMOP_KINDS index per copyKind: arrays are device memory, UVM copies go the way they say.
_COPY_KIND = (6, 1, 2, 1, 2, 3, 3, 3, 3, 4, 5, 1, 2, 3)
_MEM_KINDS = ("Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static", "Unknown")
_DEVICE_MEM_KINDS = (2, 3, 5)  # device, array, device static
_NVTX_MARK, _NVTX_PUSHPOP, _NVTX_STARTEND, _NVTX_DOMAIN = 34, 59, 60, 75
_VERSION_SUFFIX = re.compile(r"_v\d+$")
# Launch shape columns, skipped by ``kernel_columns="core"``.
_LAUNCH_COLS = {"shortName", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                "staticSharedMemory", "dynamicSharedMemory"}


# --------------------------------------------------------------------------- reading columns
def _connect(uri: str) -> sqlite3.Connection:
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    # Exports carry user/host strings in the platform's encoding; never fail on them.
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


class _Db:
    """A read-only connection plus the schema (tables and their columns)."""

    def __init__(self, path: Path):
        self.path = path
        self.uri = f"{path.resolve().as_uri()}?mode=ro"
        try:
            self.con = _connect(self.uri)
            rows = self.con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        except sqlite3.DatabaseError as e:
            raise TraceFormatError(path, "an Nsight Systems SQLite export", f"a file SQLite cannot read ({e})") from None
        self.tables = {r[0] for r in rows}
        self._cols: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = ({r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')}
                                 if table in self.tables else set())
        return self._cols[table]

    def read(self, table: str, exprs: dict[str, str], where: str | None = None) -> dict[str, np.ndarray]:
        """int64 columns ``name -> SQL expression`` (NULL -> -1), in rowid order."""
        if not exprs:
            return {}
        try:
            lo, hi = self.con.execute(f'SELECT min(rowid), max(rowid) FROM "{table}"').fetchone()
        except sqlite3.DatabaseError as e:
            raise TraceFormatError(self.path, f"a readable {table} table", str(e)) from None
        if lo is None:
            return {k: np.empty(0, np.int64) for k in exprs}
        sql = (f'SELECT count(*), {", ".join(f"group_concat(IFNULL({e}, -1))" for e in exprs.values())} '
               f'FROM "{table}" WHERE rowid >= ? AND rowid < ?' + (f" AND ({where})" if where else ""))
        bounds = list(range(lo, hi + 1, _CHUNK_ROWS)) + [hi + 1]
        spans = list(pairwise(bounds))
        if len(spans) == 1:
            parts = [self._chunk(sql, table, *spans[0], con=self.con)]
        else:
            workers = max(1, min(len(spans), os.cpu_count() or 1, 4))
            with ThreadPoolExecutor(workers) as pool:
                parts = list(pool.map(lambda s: self._chunk(sql, table, *s), spans))
        return {k: np.concatenate([p[i] for p in parts]) for i, k in enumerate(exprs)}

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

    def rows(self, sql: str) -> list[tuple]:
        return self.con.execute(sql).fetchall()


def _exprs(db: _Db, table: str, wanted: dict[str, str | tuple[str, ...]], cols: set[str] | None = None) -> dict[str, str]:
    """Keep the wanted expressions whose columns exist; a tuple means the first present column."""
    cols = db.columns(table) if cols is None else cols
    out = {}
    for key, expr in wanted.items():
        if isinstance(expr, tuple):
            found = next((c for c in expr if c in cols), None)
            if found is not None:
                out[key] = found
        elif all(c in cols for c in re.findall(r"[A-Za-z_]\w*", expr) if c != "IFNULL"):
            out[key] = expr
    return out


def _pack_dims(cols: set[str], names: tuple[str, ...], bits: int) -> str | None:
    """SQL packing ``(v+1)`` of each present column into ``bits``-bit fields (0 = NULL)."""
    parts = [f"(IFNULL({c} + 1, 0) << {i * bits})" for i, c in enumerate(names) if c in cols]
    return " | ".join(parts) if parts else None


def _unpack_dims(packed: np.ndarray | None, names: tuple[str, ...], cols: set[str], bits: int, n: int) -> dict:
    out = {}
    mask = (1 << bits) - 1
    for i, c in enumerate(names):
        if packed is None or c not in cols:
            out[c] = np.full(n, -1, np.int64)
        else:
            out[c] = ((packed >> (i * bits)) & mask) - 1
    return out


# --------------------------------------------------------------------------- names
class _Names:
    """``StringIds`` ids -> codes of the trace's StringPool, touching each distinct id once."""

    def __init__(self, db: _Db, pool: StringPool):
        self.pool = pool
        self.ids = dict(db.rows("SELECT id, value FROM StringIds")) if "StringIds" in db.tables else {}

    def codes(self, ids: np.ndarray, transform=None) -> np.ndarray:
        def make(i: int) -> str:
            s = self.ids.get(i, f"<string {i}>") if i >= 0 else ""
            return transform(s) if transform is not None else s

        return self.strings_of(ids, make)

    def strings_of(self, labels: np.ndarray, make) -> np.ndarray:
        """Codes for labels computed by ``make(label) -> str`` over the distinct labels."""
        uniq, inv = _factorize(labels)
        return self.pool.encode([make(int(u)) for u in uniq])[inv] if len(uniq) else np.empty(0, np.int32)


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct values, index of each value in them)``; a lookup table instead of a sort when
    the values are small non-negative-ish ids (string ids, enum keys), which is the usual case."""
    values = np.asarray(values, dtype=np.int64)
    if len(values) == 0:
        return values, np.empty(0, np.intp)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 1 << 24:
        uniq, inv = np.unique(values, return_inverse=True)
        return uniq, inv.reshape(-1)
    present = np.zeros(hi - lo + 1, bool)
    present[values - lo] = True
    uniq = np.flatnonzero(present)
    lut = np.zeros(hi - lo + 1, np.intp)
    lut[uniq] = np.arange(len(uniq))
    return uniq + lo, lut[values - lo]


def _pid(g: np.ndarray) -> np.ndarray:
    return np.where(g >= 0, (g >> 24) & _LOW24, -1)


def _tid(g: np.ndarray) -> np.ndarray:
    return np.where(g >= 0, g & _LOW24, -1)


def _process_key(global_tid: np.ndarray) -> np.ndarray:
    return np.where(global_tid >= 0, global_tid & ~np.int64(_LOW24), -1)


# --------------------------------------------------------------------------- tables
def _kernels(db: _Db, names: _Names, core: bool = False) -> tuple[dict, dict] | None:
    if KERNEL not in db.tables:
        return None
    cols = db.columns(KERNEL) - (_LAUNCH_COLS if core else set())
    want = _exprs(db, KERNEL, {
        "start_ns": "start", "end_ns": "end", "device": "deviceId", "stream": "streamId",
        "correlation": "correlationId", "gpid": "globalPid", "name": ("demangledName", "shortName", "name"),
        "short": ("shortName",), "grid_x": "gridX",
        "shared_mem_bytes": "IFNULL(staticSharedMemory, 0) + IFNULL(dynamicSharedMemory, 0)",
    }, cols)
    if not any(c in cols for c in ("staticSharedMemory", "dynamicSharedMemory")):
        want.pop("shared_mem_bytes", None)
    gyz, blk = ("gridY", "gridZ"), ("blockX", "blockY", "blockZ", "registersPerThread")
    for key, names_, bits in (("_gyz", gyz, 20), ("_blk", blk, 12)):
        expr = _pack_dims(cols, names_, bits)
        if expr:
            want[key] = expr
    raw = db.read(KERNEL, want)
    n = len(raw["start_ns"]) if "start_ns" in raw else 0
    out = {k: v for k, v in raw.items() if not k.startswith("_") and k not in ("short", "gpid", "name")}
    out.update({k.replace("X", "_x").replace("Y", "_y").replace("Z", "_z"): v
                for k, v in _unpack_dims(raw.get("_gyz"), gyz, cols, 20, n).items()})
    b = _unpack_dims(raw.get("_blk"), blk, cols, 12, n)
    out.update(block_x=b["blockX"], block_y=b["blockY"], block_z=b["blockZ"], registers_per_thread=b["registersPerThread"])
    out["name"] = names.codes(raw["name"]) if "name" in raw else np.full(n, -1, np.int32)
    short = {}
    if "short" in raw and "name" in raw:
        # the short name of each distinct kernel name, from its first row
        first = np.full(len(names.pool.strings), -1, np.int64)
        first[out["name"][::-1]] = np.arange(n)[::-1]
        for code in np.flatnonzero(first >= 0):
            sid = int(raw["short"][first[code]])
            if sid >= 0:
                short[names.pool.strings[code]] = names.ids.get(sid, "")
    gpid = raw.get("gpid", np.full(n, -1, np.int64))
    out["pid"] = _pid(gpid)
    return dict(out, _key=gpid), short


def _memops(db: _Db, names: _Names) -> dict | None:
    parts = []
    if MEMCPY in db.tables:
        raw = db.read(MEMCPY, _exprs(db, MEMCPY, {
            "start_ns": "start", "end_ns": "end", "device": "deviceId", "stream": "streamId",
            "correlation": "correlationId", "gpid": "globalPid", "bytes": "bytes",
            "copy": "copyKind", "src": "srcKind", "dst": "dstKind"}))
        n = len(raw.get("start_ns", ()))
        copy = raw.get("copy", np.full(n, -1, np.int64))
        src = raw.get("src", np.full(n, 7, np.int64))
        dst = raw.get("dst", np.full(n, 7, np.int64))

        def label(key: int) -> str:
            c, s, d = key // 256 - 1, (key // 16) % 16, key % 16
            cname = _COPY_NAMES[c] if 0 <= c < len(_COPY_NAMES) else "Unknown"
            return f"Memcpy {cname} ({_MEM_KINDS[min(s, 7)]} -> {_MEM_KINDS[min(d, 7)]})"

        key = (np.clip(copy, -1, 254) + 1) * 256 + np.where(src >= 0, np.minimum(src, 7), 7) * 16 + np.where(dst >= 0, np.minimum(dst, 7), 7)
        kind_of = np.asarray(_COPY_KIND, np.int32)
        kind = np.where((copy >= 0) & (copy < len(_COPY_KIND)), kind_of[np.clip(copy, 0, len(_COPY_KIND) - 1)], 6)
        parts.append(dict(_take(raw, n, "start_ns", "end_ns", "device", "stream", "correlation", "bytes", "gpid"),
                          name=names.strings_of(key, label), kind=kind.astype(np.int32)))
    if MEMSET in db.tables:
        raw = db.read(MEMSET, _exprs(db, MEMSET, {
            "start_ns": "start", "end_ns": "end", "device": "deviceId", "stream": "streamId",
            "correlation": "correlationId", "gpid": "globalPid", "bytes": "bytes", "mem": "memKind"}))
        n = len(raw.get("start_ns", ()))
        mem = raw.get("mem", np.full(n, 7, np.int64))
        label = names.strings_of(np.where((mem >= 0) & (mem < 8), mem, 7), lambda m: f"Memset ({_MEM_KINDS[m]})")
        parts.append(dict(_take(raw, n, "start_ns", "end_ns", "device", "stream", "correlation", "bytes", "gpid"),
                          name=label, kind=np.zeros(n, np.int32)))
    if not parts:
        return None
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    out["pid"] = _pid(out["gpid"])
    out["_key"] = out.pop("gpid")
    return out


def _take(raw: dict, n: int, *keys: str) -> dict:
    return {k: raw.get(k, np.full(n, -1, np.int64)) for k in keys}


def _strip_version(name: str) -> str:
    return _VERSION_SUFFIX.sub("", name)


def _api(db: _Db, names: _Names) -> dict | None:
    if RUNTIME not in db.tables:
        return None
    cols = db.columns(RUNTIME)
    raw = db.read(RUNTIME, _exprs(db, RUNTIME, {
        "start_ns": "start", "end_ns": "end", "cls": "eventClass", "gtid": "globalTid",
        "correlation": "correlationId", "name": "nameId"}),
        where="eventClass IN (0, 1)" if "eventClass" in cols else None)
    n = len(raw.get("start_ns", ()))
    name = names.codes(raw["name"], _strip_version) if "name" in raw else np.full(n, -1, np.int32)
    if "cls" in raw:
        kind = np.where(raw["cls"] == 1, API_DRIVER, API_RUNTIME)
    else:  # no eventClass column: runtime calls are the cuda* ones
        is_rt = np.fromiter((s.startswith("cuda") for s in names.pool.strings), bool, len(names.pool.strings))
        kind = np.where(is_rt[np.maximum(name, 0)], API_RUNTIME, API_DRIVER)
    gtid = raw.get("gtid", np.full(n, -1, np.int64))
    return dict(_take(raw, n, "start_ns", "end_ns", "correlation"), name=name, kind=kind.astype(np.int32),
                pid=_pid(gtid), tid=_tid(gtid), _key=_process_key(gtid))


def _ranges(db: _Db, names: _Names) -> tuple[dict | None, int]:
    if NVTX not in db.tables:
        return None, 0
    cols = db.columns(NVTX)
    if "eventType" not in cols:
        return None, 0
    types = f"eventType IN ({_NVTX_MARK}, {_NVTX_PUSHPOP}, {_NVTX_STARTEND})"
    raw = db.read(NVTX, _exprs(db, NVTX, {"start_ns": "start", "end_ns": "end", "type": "eventType",
                                          "gtid": "globalTid", "text_id": "textId", "domain": "domainId"}), where=types)
    n = len(raw.get("start_ns", ()))
    # Names: `text` (unregistered strings) else the registered string `textId`.
    texts = [r[0] for r in db.rows(f"SELECT text FROM {NVTX} WHERE {types} ORDER BY rowid")] if "text" in cols else [None] * n
    if len(texts) != n:
        raise TraceFormatError(db.path, f"{NVTX} rows to read consistently", f"{len(texts)} texts for {n} rows")
    text_id = raw.get("text_id", np.full(n, -1, np.int64))
    has_text = np.fromiter((t is not None for t in texts), bool, n)
    name = names.codes(np.where(has_text, -1, text_id))
    if has_text.any():
        name[has_text] = names.pool.encode([t for t in texts if t is not None])
    domains = {}
    if "domainId" in cols and "text" in cols:
        for did, text in db.rows(f"SELECT domainId, text FROM {NVTX} WHERE eventType = {_NVTX_DOMAIN}"):
            if did is not None and did not in domains:
                domains[did] = text or f"domain {did}"
    dom = raw.get("domain", np.full(n, -1, np.int64))
    domain = names.strings_of(np.where(dom > 0, dom, 0), lambda d: domains.get(d, f"domain {d}") if d > 0 else "")
    start, end = raw["start_ns"], raw.get("end_ns", np.full(n, -1, np.int64))
    is_mark = raw.get("type", np.full(n, -1)) == _NVTX_MARK
    end = np.where(is_mark, start, end)
    ok = end >= start
    gtid = raw.get("gtid", np.full(n, -1, np.int64))
    out = dict(start_ns=start, end_ns=end, name=name, domain=domain, side=np.full(n, CPU_SIDE, np.int32),
               pid=_pid(gtid), tid=_tid(gtid), _key=_process_key(gtid))
    return {k: v[ok] for k, v in out.items()}, int((~ok).sum())


def _memory(db: _Db) -> dict | None:
    if MEMUSE not in db.tables:
        return None
    raw = db.read(MEMUSE, _exprs(db, MEMUSE, {"ts_ns": "start", "gpid": "globalPid", "device": "deviceId",
                                              "bytes": "bytes", "kind": "memKind", "op": "memoryOperationType"}))
    n = len(raw.get("ts_ns", ()))
    if n == 0 or "bytes" not in raw:
        return None
    op = raw.get("op", np.zeros(n, np.int64))
    delta = np.where(op == 1, -raw["bytes"], raw["bytes"])
    on_device = np.isin(raw.get("kind", np.full(n, 2)), _DEVICE_MEM_KINDS)
    device = np.where(on_device, raw.get("device", np.full(n, -1, np.int64)), -1)
    gpid = raw.get("gpid", np.full(n, -1, np.int64))
    # running sum per (process, device) in time order
    order = np.lexsort((np.arange(n), raw["ts_ns"], device, gpid))
    d = delta[order]
    csum = np.cumsum(d)
    first = np.ones(n, bool)
    first[1:] = (gpid[order][1:] != gpid[order][:-1]) | (device[order][1:] != device[order][:-1])
    base = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    allocated = np.empty(n, np.int64)
    allocated[order] = csum - csum[base] + d[base]
    return dict(ts_ns=raw["ts_ns"], device=device, allocated_bytes=allocated, delta_bytes=delta,
                pid=_pid(gpid), _key=gpid)


# --------------------------------------------------------------------------- meta
def _metadata(db: _Db) -> dict[str, str]:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in db.tables and {"name", "value"} <= db.columns(table):
            return {str(k): str(v) for k, v in db.rows(f"SELECT name, value FROM {table}")}
    return {}


def _gpus(db: _Db) -> dict[int, DeviceInfo]:
    def get(row: dict, *keys, scale=1):
        for k in keys:
            v = row.get(k)
            if v is not None and v != 0:
                return v * scale if scale != 1 else v
        return None

    out: dict[int, DeviceInfo] = {}
    for table, scale_bw, scale_clk in (("TARGET_INFO_CUDA_GPU", 1000, 1000), ("TARGET_INFO_GPU", 1, 1)):
        if table not in db.tables:
            continue
        cur = db.con.execute(f"SELECT * FROM {table}")
        keys = [d[0] for d in cur.description]
        for values in cur.fetchall():
            row = dict(zip(keys, values))
            did = next((row[k] for k in ("id", "deviceId", "cuDevice") if row.get(k) is not None), None)
            if did is None or int(did) in out:
                continue  # the 2021 CUDA table comes first: it has the properties
            sm = get(row, "smCount", "numMultiprocessors")
            if sm is None and table == "TARGET_INFO_GPU" and "smCount" in row:
                continue  # a display adapter without CUDA (Intel, Basic Render Driver)
            out[int(did)] = DeviceInfo(
                id=int(did), name=str(row.get("name") or "unknown"), sm_count=sm,
                cc_major=get(row, "computeMajor", "computeCapabilityMajor"),
                cc_minor=row.get("computeMinor", row.get("computeCapabilityMinor")),
                total_memory_bytes=get(row, "totalMemory", "globalMemorySize"),
                l2_cache_bytes=get(row, "l2CacheSize"),
                memory_bandwidth_bytes_per_s=(float(v) if (v := get(row, "memoryBandwidth", "globalMemoryBandwidth", scale=scale_bw)) else None),
                clock_hz=(float(v) if (v := get(row, "clockRate", "coreClockRate", scale=scale_clk)) else None),
            )
    return out


# --------------------------------------------------------------------------- entry point
def load_nsys_sqlite(path: str | os.PathLike, *, kernel_columns: str = "all") -> list[Trace]:
    """Read an ``nsys export --type sqlite`` file: one Trace per process with GPU activity.

    ``kernel_columns="core"`` skips the launch shape (grid, block, registers, shared memory,
    short names: left missing) for a faster load when only times and names are needed.
    """
    if kernel_columns not in ("all", "core"):
        raise UsageError(f"kernel_columns must be 'all' or 'core', got {kernel_columns!r}")
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(16)
    if head != b"SQLite format 3\x00":
        raise TraceFormatError(path, "an Nsight Systems SQLite export", f"a file starting with {head!r}")
    db = _Db(path)
    try:
        return _load(db, core=kernel_columns == "core")
    finally:
        db.con.close()


def _load(db: _Db, core: bool = False) -> list[Trace]:
    known = {KERNEL, MEMCPY, MEMSET, RUNTIME, NVTX}
    if not known & db.tables:
        listed = ", ".join(sorted(db.tables)[:6]) or "no tables"
        raise TraceFormatError(db.path, "an Nsight Systems export (CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS tables)",
                               f"a SQLite database with {listed}")
    pool = StringPool()
    names = _Names(db, pool)
    k = _kernels(db, names, core)
    kernels, short = k if k else (None, {})
    memops, api, memory = _memops(db, names), _api(db, names), _memory(db)
    ranges, unterminated = _ranges(db, names)
    tables = {"kernels": kernels, "memops": memops, "api": api, "ranges": ranges, "memory": memory}

    def keys(*kinds):
        found = [np.unique(tables[t]["_key"]) for t in kinds if tables[t] is not None]
        return set(np.concatenate(found).tolist()) - {-1} if found else set()

    procs = sorted(keys("kernels", "memops")) or sorted(keys("api", "ranges"))
    if not procs:
        raise TraceFormatError(db.path, "GPU activity, CUDA API calls or NVTX ranges", "none in any process")
    meta_kv = _metadata(db)
    gpus = _gpus(db)
    process_names = {}
    if "PROCESSES" in db.tables and {"globalPid", "name"} <= db.columns("PROCESSES"):
        process_names = {g: n for g, n in db.rows("SELECT globalPid, name FROM PROCESSES")}
    version = meta_kv.get("EXPORT_PRODUCT_VERSION")
    schema = meta_kv.get("EXPORT_SCHEMA_VERSION")
    fmt = f"{version} (schema {schema})" if version and schema else (version or schema)
    procs.sort(key=lambda g: ((g >> 24) & _LOW24, g))
    traces = []
    for rank, gpid in enumerate(procs):
        parts = {}
        for kind, t in tables.items():
            if t is None:
                continue
            sel = t["_key"] == gpid
            whole = bool(sel.all())  # the usual single-process export: no copy
            cols = {c: (v if whole else v[sel]) for c, v in t.items() if c != "_key"}
            if kind == "ranges":
                cols["depth"] = _depth(cols["start_ns"], cols["end_ns"], cols["tid"])
            parts[kind] = make_table(kind, **cols)
        used = set()
        for kind in ("kernels", "memops"):
            if kind in parts:
                used |= set(np.unique(parts[kind]["device"]).tolist())
        devices = tuple(gpus[d] for d in sorted(used) if d in gpus) or tuple(gpus[d] for d in sorted(gpus))
        extra = {"nsys_metadata": meta_kv, "export_era": _era(db, meta_kv), "global_pid": int(gpid),
                 "kernel_short_names": short, "nvtx_unterminated": unterminated}
        meta = TraceMeta(
            source_path=str(db.path), source_format="nsys-sqlite", format_version=fmt, devices=devices,
            rank=rank if len(procs) > 1 else None, world_size=len(procs) if len(procs) > 1 else None,
            process_id=int((gpid >> 24) & _LOW24), process_name=process_names.get(gpid), extra=extra,
        )
        traces.append(build_trace(meta, pool, **parts))
    return traces


def _depth(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Nesting depth per thread: ranges opened before (start asc, end desc) and still open at
    this start. Zero-length marks never enclose anything, so only non-empty ranges count."""
    depth = np.zeros(len(start), np.int32)
    for t in np.unique(tid):  # one pass per thread, not per range
        idx = np.flatnonzero(tid == t)
        order = idx[np.lexsort((-end[idx], start[idx]))]
        s, e = start[order], end[order]
        nonempty = e > s
        opened = np.cumsum(nonempty) - nonempty
        closed = np.searchsorted(np.sort(e[nonempty]), s, side="right")
        depth[order] = np.maximum(opened - closed, 0)
    return depth


def _era(db: _Db, meta_kv: dict) -> str:
    if "META_DATA_EXPORT" in db.tables:
        return "2024+"
    if "EXPORT_META_DATA" in db.tables:
        return "2022"
    return "2021"
