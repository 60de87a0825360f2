"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> one :class:`Trace` per process.

Model
-----
An export holds one table per activity kind, times in integer ns on one clock, strings as ids
into ``StringIds``. Tables and what they fill:

=====================================  ===================================================
``CUPTI_ACTIVITY_KIND_KERNEL``         ``kernels`` (demangled name; short names in
                                       ``meta.extra["kernel_short_names"]``)
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``    ``kernels`` too: one opaque row per graph launch of a
                                       graph-level export (see CUDA graphs below), named
                                       ``CUDA graph <graphId> replay, nodes not traced``
``CUPTI_ACTIVITY_KIND_MEMCPY/MEMSET``  ``memops``, named as Kineto names them
                                       (``Memcpy HtoD (Pinned -> Device)``, ``Memset (Device)``)
``CUPTI_ACTIVITY_KIND_RUNTIME``        ``api``: eventClass 0 runtime / 1 driver only (other
                                       classes, e.g. 67 backtraces in old exports, dropped);
                                       the ``_vNNNN`` suffix of 2022+ names is stripped
``OSRT_API``                           ``osrt``: OS runtime library calls (``--trace=osrt``),
                                       eventClass 27 only (31/32 are the zero-length
                                       "profiling started/finished" marks)
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

CUDA graphs
-----------
With ``nsys profile --cuda-graph-trace=node`` each node of a replayed graph is a kernel row with
``graphNodeId`` (and, 2026+, ``graphId``) set and the ``correlationId`` of the
``cudaGraphLaunch`` that replayed it, so :mod:`tracestory.analysis.graphs` attributes it to that
launch through the correlation id, as on Kineto. With nsys's default graph-level tracing
(``--cuda-graph-trace=graph``) the nodes have no row; each launch is one
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row (its correlation id the launch's), kept as one opaque
kernel row so that its GPU time stays busy time and it counts as a graph replay; rows whose
start and end are both 0 (CUPTI could not time the graph) are dropped and counted.
``meta.extra["cuda_graphs"]`` says per process: ``trace_mode`` (``META_DATA_CAPTURE``'s
``CUDA_GRAPH_TRACE_OPTIONS:MODE``, "graph"/"node", None when not recorded), ``node_kernels``
(rows with a graph node id), ``graphs_with_node_kernels`` and ``whole_graph_launches`` (the
opaque rows, which the report's Limitations name).

Processes: one Trace per process that has kernels or memory operations (ranks of an MPI or
torchrun job captured in one report); when none has, one per process with API calls or NVTX
ranges. With several processes, ``meta.rank`` is the index in OS pid order (an assumption:
the export does not know MPI ranks) and ``meta.world_size`` their count.

Speed
-----
Columns are read by :class:`.nsys_db.Db`: straight from the table's B-tree pages with numpy
(:mod:`.nsys_btree`), through SQLite when a page or record is outside what that reader
verifies. No value becomes a Python object. Names are mapped id -> code through a lookup
array. Exports are written in start order, so a table is sorted only when it is not already
(one O(n) check). Peak memory is the kept columns plus the raw id columns (``globalPid``,
name ids) until they are mapped, plus a few ~1 MiB reader steps in flight. Measured on 2 M
kernels: docs/PERFORMANCE.md.

Damaged exports
---------------
The whole read is one guard: any error SQLite, the string decoding or the column conversion
raises on damaged pages becomes one :class:`TraceFormatError` naming the file. Activity
tables must have their ``start`` and ``end`` columns (refused otherwise). Rows with
impossible times (a NULL or negative start, an end before the start, a time of 2**62 ns or
more: an overflow) are dropped and counted in ``meta.extra["warnings"]`` (see :mod:`.files`);
a table none of whose rows has possible times is refused. A file shorter than the page count
in its SQLite header is refused (a cut-short copy).
Row counts are checked by the column reader against ``count(*)``. SQLite keeps no checksum
of the values, so a changed digit inside a valid time reads as that time.

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
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError, TracestoryError, UsageError
from ..trace import (
    API_DRIVER,
    API_RUNTIME,
    CPU_SIDE,
    StringPool,
    Trace,
    TraceMeta,
    build_trace,
    make_table,
)
from .files import refuse_special, state, with_warnings
from .nsys_db import Db, Names, as_text, distinct, pid_of, split_global_tid
from .nsys_meta import era, gpus, graph_trace_mode, metadata

_LOW24 = 0xFFFFFF
# False: read every table through SQLite (the tests compare both readers).
_PAGE_READER = True

KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
# The name of a whole-graph row of a graph-level export (one per graph launch, nodes not traced).
GRAPH_REPLAY_PREFIX = "CUDA graph "
RUNTIME, NVTX, MEMUSE = "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUDA_GPU_MEMORY_USAGE_EVENTS"
OSRT = "OSRT_API"
# The export's tables that the summary tables (cuda_api_sum, cuda_gpu_mem_*_sum, osrt_sum) read:
# which of them the export has is kept in meta.extra["nsys_tables"], so that an absent table is
# told apart from an empty one.
SUMMARY_TABLES = (KERNEL, MEMCPY, MEMSET, RUNTIME, OSRT)
_OSRT_CALL = 27  # ENUM_NSYS_EVENT_CLASS OS runtime; 31/32 are zero-length "profiling started/finished" marks

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
# Launch shape: export column -> kernels column (int32 in the schema), skipped by "core".
_LAUNCH = {"gridX": "grid_x", "gridY": "grid_y", "gridZ": "grid_z", "blockX": "block_x", "blockY": "block_y",
           "blockZ": "block_z", "registersPerThread": "registers_per_thread"}
_SHARED = {"staticSharedMemory": "_static", "dynamicSharedMemory": "_dynamic"}
_I4 = np.int32
_OVERFLOW_NS = 1 << 62  # 146 years: a time at or beyond it is an overflow, not a measurement
# What damaged pages or values can raise inside the read (beyond the project's own errors).
_BAD_BYTES = (sqlite3.Error, UnicodeError, TypeError, ValueError, OverflowError, IndexError, KeyError,
              MemoryError, OSError)


def _present(db: Db, table: str, wanted: dict[str, str | tuple[str, ...]], cols: set[str] | None = None) -> dict[str, str]:
    """``key -> column`` for the wanted columns that exist; a tuple means the first present one."""
    cols = db.columns(table) if cols is None else cols
    out = {}
    for key, col in wanted.items():
        found = next((c for c in col if c in cols), None) if isinstance(col, tuple) else (col if col in cols else None)
        if found is not None:
            out[key] = found
    return out


def _rows_of(raw: dict, n: int, keep: np.ndarray | None) -> tuple[dict, int]:
    """Only the rows of ``keep`` (None: all)."""
    if keep is None or keep.all():
        return raw, n
    return {k: v[keep] for k, v in raw.items()}, int(keep.sum())


def _col(raw: dict, key: str, n: int, fill: int = -1, dtype=np.int64) -> np.ndarray:
    return raw[key] if key in raw else np.full(n, fill, dtype)


def _nrows(raw: dict) -> int:
    return len(next(iter(raw.values()))) if raw else 0


def _possible_times(db: Db, table: str, raw: dict, warnings: list[str]) -> tuple[dict, int]:
    """Only the rows with possible times (see the module docstring); the others counted."""
    n = _nrows(raw)
    if n == 0:
        return raw, 0
    missing = [c for c in ("start_ns", "end_ns") if c not in raw]
    if missing:
        raise TraceFormatError(db.path, f"{table} with start and end columns",
                               f"no {' and no '.join(c.removesuffix('_ns') for c in missing)} column "
                               f"(columns: {', '.join(sorted(db.columns(table)))[:120]})")
    start, end = raw["start_ns"], raw["end_ns"]
    ok = (start >= 0) & (end >= start) & (end < _OVERFLOW_NS)
    if ok.all():
        return raw, n
    bad = int(n - ok.sum())
    if bad == n:
        raise TraceFormatError(db.path, f"{table} rows with possible times",
                               f"none of {n} (every start missing or negative, end before start, or overflowing)")
    warnings.append(f"{table}: {bad} of {n} rows dropped: a missing or negative start, an end before the "
                    "start, or an overflowing time")
    return _rows_of(raw, n, ok)


# --------------------------------------------------------------------------- tables
def _kernels(db: Db, names: Names, warnings: list[str], core: bool = False) -> tuple[dict, dict] | None:
    if KERNEL not in db.tables:
        return None
    cols = db.columns(KERNEL) - (set(_LAUNCH) | set(_SHARED) | {"shortName"} if core else set())
    wanted = {"start_ns": "start", "end_ns": "end", "device": "deviceId", "stream": "streamId",
              "correlation": "correlationId", "gpid": "globalPid", "name": ("demangledName", "shortName", "name"),
              "short": ("shortName",), "_graph_node": ("graphNodeId",), "_graph": ("graphId",),
              **{v: k for k, v in _LAUNCH.items()}, **{v: k for k, v in _SHARED.items()}}
    # int32 where the schema has int32 (no cast copy later); per-block shared memory fits too
    dtypes = {"device": _I4, "_static": _I4, "_dynamic": _I4, **{v: _I4 for v in _LAUNCH.values()}}
    raw, n = _possible_times(db, KERNEL, db.read(KERNEL, _present(db, KERNEL, wanted, cols), dtypes), warnings)
    out = {k: v for k, v in raw.items() if k not in ("short", "gpid", "name", "_static", "_dynamic")}
    parts = [raw[k] for k in ("_static", "_dynamic") if k in raw]
    if parts:  # static + dynamic; a NULL (-1) part counts as 0
        shm = parts[0].astype(np.int64) if len(parts) == 1 else np.add(parts[0], parts[1], dtype=np.int64)
        for p in parts:
            if (p < 0).any():
                shm += p < 0  # undo the -1 of a NULL part
        out["shared_mem_bytes"] = shm
    ids = raw.get("name")
    out["name"] = names.codes(ids) if ids is not None else np.full(n, -1, _I4)
    short = {}
    if "short" in raw and ids is not None and n:
        # the short name of each distinct kernel name, from its first row (a reversed scatter:
        # the last write wins, which is the first row)
        first_short = np.full(len(names.pool.strings), -1, np.int64)
        first_short[out["name"][::-1]] = raw["short"][::-1]
        for code in np.flatnonzero(first_short >= 0).tolist():
            short[names.pool.strings[code]] = names.ids.get(int(first_short[code]), "")
    gpid = _col(raw, "gpid", n)
    out["pid"] = pid_of(gpid)
    return dict(out, _key=gpid), short


def _graph_trace(db: Db, names: Names, warnings: list[str]) -> dict | None:
    """Whole-graph rows of a graph-level export (see the module docstring), shaped as kernel
    rows: one opaque GPU interval per graph launch, named after its graph."""
    if GRAPH_TRACE not in db.tables:
        return None
    wanted = {"start_ns": "start", "end_ns": "end", "device": "deviceId", "stream": "streamId",
              "correlation": "correlationId", "gpid": "globalPid", "graph": "graphId"}
    raw = db.read(GRAPH_TRACE, _present(db, GRAPH_TRACE, wanted), {"device": _I4})
    n = _nrows(raw)
    if n and "start_ns" in raw and "end_ns" in raw:
        # CUPTI: start = end = 0 when the graph's times could not be collected
        timed = (raw["start_ns"] != 0) | (raw["end_ns"] != 0)
        if not timed.all():
            warnings.append(f"{GRAPH_TRACE}: {int(n - timed.sum())} of {n} graph launches without times "
                            "(CUPTI could not collect them) dropped")
            raw, n = _rows_of(raw, n, timed)
    raw, n = _possible_times(db, GRAPH_TRACE, raw, warnings)
    if n == 0:
        return None
    graph = _col(raw, "graph", n)
    name = names.strings_of(graph, lambda g: f"{GRAPH_REPLAY_PREFIX}{g if g >= 0 else '?'} replay, nodes not traced")
    gpid = _col(raw, "gpid", n)
    out = {k: _col(raw, k, n) for k in ("start_ns", "end_ns", "correlation")}
    out.update(device=_col(raw, "device", n, dtype=_I4), stream=_col(raw, "stream", n), name=name,
               pid=pid_of(gpid), _key=gpid, _graph_row=np.ones(n, bool))
    return out


def _with_graph_rows(kernels: dict | None, graphs: dict | None) -> dict | None:
    """Kernel rows followed by the whole-graph rows (missing kernel columns as -1)."""
    if graphs is None:
        return kernels
    if kernels is None:
        return graphs
    n_k, n_g = len(kernels["_key"]), len(graphs["_key"])
    out = {}
    for key in set(kernels) | set(graphs):
        a, b = kernels.get(key), graphs.get(key)
        dtype = (a if a is not None else b).dtype
        fill = False if dtype == bool else -1
        a = np.full(n_k, fill, dtype) if a is None else a
        b = np.full(n_g, fill, dtype) if b is None else b
        out[key] = np.concatenate([a, b.astype(dtype, copy=False)])
    return out


def _graph_facts(kernels: dict | None, sel: np.ndarray | None, mode: str | None) -> dict:
    """What the export says about CUDA graphs in one process (``meta.extra["cuda_graphs"]``)."""
    def pick(col):
        v = kernels.get(col) if kernels is not None else None
        return None if v is None else (v if sel is None else v[sel])

    node, graph, whole = pick("_graph_node"), pick("_graph"), pick("_graph_row")
    is_node = (node > 0) if node is not None else None
    return {
        "trace_mode": mode,
        "node_kernels": int(is_node.sum()) if is_node is not None else 0,
        "graphs_with_node_kernels": (int(len(distinct(graph[is_node & (graph >= 0)])))
                                     if graph is not None and is_node is not None else None),
        "whole_graph_launches": int(whole.sum()) if whole is not None else 0,
    }


def _memops(db: Db, names: Names, warnings: list[str]) -> dict | None:
    parts = []
    common = {"start_ns": "start", "end_ns": "end", "device": "deviceId", "stream": "streamId",
              "correlation": "correlationId", "gpid": "globalPid", "bytes": "bytes"}
    keep = ("start_ns", "end_ns", "device", "stream", "correlation", "bytes", "gpid")
    if MEMCPY in db.tables:
        raw, n = _possible_times(db, MEMCPY, db.read(MEMCPY, _present(
            db, MEMCPY, {**common, "copy": "copyKind", "src": "srcKind", "dst": "dstKind"})), warnings)
        copy, src, dst = _col(raw, "copy", n), _col(raw, "src", n, 7), _col(raw, "dst", n, 7)

        def label(key: int) -> str:
            c, s, d = key // 256 - 1, (key // 16) % 16, key % 16
            cname = _COPY_NAMES[c] if 0 <= c < len(_COPY_NAMES) else "Unknown"
            return f"Memcpy {cname} ({_MEM_KINDS[min(s, 7)]} -> {_MEM_KINDS[min(d, 7)]})"

        key = ((np.clip(copy, -1, 254) + 1) * 256 + np.where(src >= 0, np.minimum(src, 7), 7) * 16
               + np.where(dst >= 0, np.minimum(dst, 7), 7))
        kind_of = np.asarray(_COPY_KIND, np.int32)
        kind = np.where((copy >= 0) & (copy < len(_COPY_KIND)), kind_of[np.clip(copy, 0, len(_COPY_KIND) - 1)], 6)
        parts.append(dict({k: _col(raw, k, n) for k in keep},
                          name=names.strings_of(key, label), kind=kind.astype(np.int32)))
    if MEMSET in db.tables:
        raw, n = _possible_times(db, MEMSET, db.read(MEMSET, _present(db, MEMSET, {**common, "mem": "memKind"})),
                                 warnings)
        mem = _col(raw, "mem", n, 7)
        label = names.strings_of(np.where((mem >= 0) & (mem < 8), mem, 7), lambda m: f"Memset ({_MEM_KINDS[m]})")
        parts.append(dict({k: _col(raw, k, n) for k in keep}, name=label, kind=np.zeros(n, np.int32)))
    if not parts:
        return None
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    out["pid"] = pid_of(out["gpid"])
    out["_key"] = out.pop("gpid")
    return out


def _strip_version(name: str) -> str:
    return _VERSION_SUFFIX.sub("", name)


def _api(db: Db, names: Names, warnings: list[str]) -> dict | None:
    if RUNTIME not in db.tables:
        return None
    raw = db.read(RUNTIME, _present(db, RUNTIME, {"start_ns": "start", "end_ns": "end", "cls": "eventClass",
                                                  "gtid": "globalTid", "correlation": "correlationId", "name": "nameId"}))
    # eventClass 0 runtime / 1 driver only (e.g. 67 = backtrace duplicates in old exports)
    raw, n = _rows_of(raw, _nrows(raw), np.isin(raw["cls"], (0, 1)) if "cls" in raw else None)
    raw, n = _possible_times(db, RUNTIME, raw, warnings)
    name = names.codes(raw["name"], _strip_version) if "name" in raw else np.full(n, -1, np.int32)
    if "cls" in raw:
        kind = np.where(raw["cls"] == 1, API_DRIVER, API_RUNTIME)
    else:  # no eventClass column: runtime calls are the cuda* ones
        is_rt = np.fromiter((s.startswith("cuda") for s in names.pool.strings), bool, len(names.pool.strings))
        kind = np.where(is_rt[np.maximum(name, 0)], API_RUNTIME, API_DRIVER)
    pid, tid, key = split_global_tid(_col(raw, "gtid", n))
    return dict({k: _col(raw, k, n) for k in ("start_ns", "end_ns", "correlation")}, name=name,
                kind=kind.astype(np.int32), pid=pid, tid=tid, _key=key)


def _osrt(db: Db, names: Names, warnings: list[str]) -> dict | None:
    """OS runtime library calls (``OSRT_API``), one row per call: the ``osrt`` table."""
    if OSRT not in db.tables:
        return None
    raw = db.read(OSRT, _present(db, OSRT, {"start_ns": "start", "end_ns": "end", "cls": "eventClass",
                                            "gtid": "globalTid", "name": "nameId"}))
    raw, n = _rows_of(raw, _nrows(raw), raw["cls"] == _OSRT_CALL if "cls" in raw else None)
    raw, n = _possible_times(db, OSRT, raw, warnings)
    name = names.codes(raw["name"]) if "name" in raw else np.full(n, -1, np.int32)
    pid, tid, key = split_global_tid(_col(raw, "gtid", n))
    return dict({k: _col(raw, k, n) for k in ("start_ns", "end_ns")}, name=name, pid=pid, tid=tid, _key=key)


def _ranges(db: Db, names: Names, warnings: list[str]) -> tuple[dict | None, int]:
    if NVTX not in db.tables:
        return None, 0
    cols = db.columns(NVTX)
    if "eventType" not in cols:
        return None, 0
    types = (_NVTX_MARK, _NVTX_PUSHPOP, _NVTX_STARTEND)
    raw = db.read(NVTX, _present(db, NVTX, {"start_ns": "start", "end_ns": "end", "type": "eventType",
                                            "gtid": "globalTid", "text_id": "textId", "domain": "domainId"}))
    raw, n = _rows_of(raw, _nrows(raw), np.isin(raw["type"], types))
    # Names: `text` (unregistered strings) else the registered string `textId`.
    where = f"eventType IN {types}"
    texts = ([r[0] for r in db.rows(f"SELECT CAST(text AS TEXT) FROM {NVTX} WHERE {where} ORDER BY rowid")]
             if "text" in cols else [None] * n)
    if len(texts) != n:
        raise TraceFormatError(db.path, f"{NVTX} rows to read consistently", f"{len(texts)} texts for {n} rows")
    has_text = np.fromiter((t is not None for t in texts), bool, n)
    name = names.codes(np.where(has_text, -1, _col(raw, "text_id", n)))
    if has_text.any():
        name[has_text] = names.pool.encode([t for t in texts if t is not None])
    domains = {}
    if "domainId" in cols and "text" in cols:
        for did, text in db.rows(f"SELECT domainId, text FROM {NVTX} WHERE eventType = {_NVTX_DOMAIN}"):
            if did is not None and did not in domains:
                domains[did] = as_text(text) or f"domain {did}"
    dom = _col(raw, "domain", n)
    domain = names.strings_of(np.where(dom > 0, dom, 0), lambda d: domains.get(d, f"domain {d}") if d > 0 else "")
    start, end = _col(raw, "start_ns", n), _col(raw, "end_ns", n)
    end = np.where(_col(raw, "type", n) == _NVTX_MARK, start, end)  # marks are zero-length
    if n and "start_ns" not in raw:
        raise TraceFormatError(db.path, f"{NVTX} with a start column", f"columns {', '.join(sorted(cols))[:120]}")
    impossible = (start < 0) | ((end >= 0) & (end < start)) | (end >= _OVERFLOW_NS) | (start >= _OVERFLOW_NS)
    if impossible.any():
        warnings.append(f"{NVTX}: {int(impossible.sum())} of {n} ranges dropped: a missing or negative start, "
                        "an end before the start, or an overflowing time")
    ok = (end >= start) & ~impossible
    unterminated = ~ok & ~impossible
    pid, tid, key = split_global_tid(_col(raw, "gtid", n))
    out = {"start_ns": start, "end_ns": end, "name": name, "domain": domain, "side": np.full(n, CPU_SIDE, np.int32),
           "pid": pid, "tid": tid, "_key": key}
    return {k: v[ok] for k, v in out.items()}, int(unterminated.sum())


def _memory(db: Db) -> dict | None:
    if MEMUSE not in db.tables:
        return None
    raw = db.read(MEMUSE, _present(db, MEMUSE, {"ts_ns": "start", "gpid": "globalPid", "device": "deviceId",
                                                "bytes": "bytes", "kind": "memKind", "op": "memoryOperationType"}))
    n = _nrows(raw)
    if n == 0 or "bytes" not in raw or "ts_ns" not in raw:
        return None
    op = _col(raw, "op", n, 0)
    delta = np.where(op == 1, -raw["bytes"], raw["bytes"])
    on_device = np.isin(_col(raw, "kind", n, 2), _DEVICE_MEM_KINDS)
    device = np.where(on_device, _col(raw, "device", n), -1)
    gpid = _col(raw, "gpid", n)
    # running sum per (process, device) in time order
    order = np.lexsort((np.arange(n), raw["ts_ns"], device, gpid))
    d = delta[order]
    csum = np.cumsum(d)
    first = np.ones(n, bool)
    first[1:] = (gpid[order][1:] != gpid[order][:-1]) | (device[order][1:] != device[order][:-1])
    base = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    allocated = np.empty(n, np.int64)
    allocated[order] = csum - csum[base] + d[base]
    return {"ts_ns": raw["ts_ns"], "device": device, "allocated_bytes": allocated, "delta_bytes": delta,
            "pid": pid_of(gpid), "_key": gpid}


# --------------------------------------------------------------------------- entry point
def load_nsys_sqlite(path: str | os.PathLike, *, kernel_columns: str = "all", require_gpu: bool = True) -> list[Trace]:
    """Read an ``nsys export --type sqlite`` file: one Trace per process with GPU activity.

    ``kernel_columns="core"`` skips the launch shape (grid, block, registers, shared memory,
    short names: left missing) for a faster load when only times and names are needed.
    ``require_gpu``: raise :class:`TraceFormatError` when no process has a kernel, memcpy or
    memset row (a run traced without ``-t cuda``, or one that launched nothing), as the Kineto
    reader does; ``False`` reads the CPU side (CUDA API calls, NVTX) alone.
    """
    if kernel_columns not in ("all", "core"):
        raise UsageError(f"kernel_columns must be 'all' or 'core', got {kernel_columns!r}")
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    refuse_special(path)
    with open(path, "rb") as f:
        head = f.read(16)
    if head != b"SQLite format 3\x00":
        raise TraceFormatError(path, "an Nsight Systems SQLite export", f"a file starting with {head!r}")
    _check_length(path)
    warnings: list[str] = []
    try:
        db = Db(path, fast=_PAGE_READER)
        try:
            traces = _load(db, warnings, core=kernel_columns == "core", require_gpu=require_gpu)
        finally:
            db.close()
    except TracestoryError:
        raise
    except _BAD_BYTES as e:
        raise TraceFormatError(path, "a readable Nsight Systems SQLite export",
                               f"damaged content ({type(e).__name__}: {str(e)[:160]})") from None
    state(path, warnings)
    return traces


def _check_length(path: Path) -> None:
    """Refuse a file shorter than the page count its header states (a cut-short copy). The
    header's count is valid when its change counter (offset 24) equals the version-valid-for
    number (offset 92), as the SQLite file format says."""
    with open(path, "rb") as f:
        head = f.read(100)
        size = os.fstat(f.fileno()).st_size
    if len(head) < 100:
        raise TraceFormatError(path, "an SQLite file with its 100-byte header", f"{size} bytes")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    if pages and head[24:28] == head[92:96] and size < pages * page_size:
        raise TraceFormatError(path, f"{pages} pages of {page_size} bytes as the SQLite header says "
                                     f"({pages * page_size} bytes)", f"{size} bytes (cut short)")


def _load(db: Db, warnings: list[str], core: bool = False, require_gpu: bool = True) -> list[Trace]:
    known = {KERNEL, MEMCPY, MEMSET, RUNTIME, NVTX, GRAPH_TRACE}
    if not known & db.tables:
        listed = ", ".join(sorted(db.tables)[:6]) or "no tables"
        raise TraceFormatError(db.path, "an Nsight Systems export (CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS tables)",
                               f"a SQLite database with {listed}")
    pool = StringPool()
    names = Names(db, pool)
    k = _kernels(db, names, warnings, core)
    kernels, short = k if k else (None, {})
    kernels = _with_graph_rows(kernels, _graph_trace(db, names, warnings))
    memops, api, memory = _memops(db, names, warnings), _api(db, names, warnings), _memory(db)
    ranges, unterminated = _ranges(db, names, warnings)
    if names.unknown:
        warnings.append(f"{len(names.unknown)} name IDs not in StringIds"
                        f"{'' if 'StringIds' in db.tables else ' (no StringIds table)'}: shown as <string ID>")
    tables = {"kernels": kernels, "memops": memops, "api": api, "ranges": ranges, "memory": memory,
              "osrt": _osrt(db, names, warnings)}
    keys_of = {kind: set(distinct(t["_key"]).tolist()) for kind, t in tables.items() if t is not None}

    def keys(*kinds):
        return set().union(*(keys_of.get(kind, set()) for kind in kinds)) - {-1}

    procs = sorted(keys("kernels", "memops"))
    if not procs and require_gpu and (keys("api") or keys("ranges")):
        n_api = sum(len(t["_key"]) for k, t in tables.items() if k == "api" and t is not None)
        n_rng = sum(len(t["_key"]) for k, t in tables.items() if k == "ranges" and t is not None)
        raise TraceFormatError(
            db.path, "GPU activity (CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY or _MEMSET rows)",
            f"{n_api:,} CUDA API calls, {n_rng:,} NVTX ranges and none on the GPU (was it traced with -t cuda?)")
    procs = procs or sorted(keys("api", "ranges"))
    if not procs:
        raise TraceFormatError(db.path, "GPU activity, CUDA API calls or NVTX ranges", "none in any process")
    meta_kv = metadata(db)
    devices_of = gpus(db)
    process_names = {}
    if "PROCESSES" in db.tables and {"globalPid", "name"} <= db.columns("PROCESSES"):
        process_names = {g: as_text(n) or None for g, n in db.rows("SELECT globalPid, name FROM PROCESSES")}
    version = meta_kv.get("EXPORT_PRODUCT_VERSION")
    schema = meta_kv.get("EXPORT_SCHEMA_VERSION")
    fmt = f"{version} (schema {schema})" if version and schema else (version or schema)
    procs.sort(key=lambda g: ((g >> 24) & _LOW24, g))
    graph_mode = graph_trace_mode(db)
    traces = []
    for rank, gpid in enumerate(procs):
        parts = {}
        graph_facts = _graph_facts(None, None, graph_mode)
        for kind, t in tables.items():
            if t is None:
                continue
            # the usual single-process export: every row is this process's, no copy
            whole = keys_of[kind] == {gpid}
            sel = None if whole else t["_key"] == gpid
            cols = {c: (v if whole else v[sel]) for c, v in t.items() if not c.startswith("_")}
            if kind == "kernels":
                graph_facts = _graph_facts(t, sel, graph_mode)
            if kind == "ranges":
                cols["depth"] = _depth(cols["start_ns"], cols["end_ns"], cols["tid"])
            parts[kind] = make_table(kind, **cols)
        used = set()
        for kind in ("kernels", "memops"):
            if kind in parts:
                used |= set(distinct(parts[kind]["device"]).tolist())
        devices = (tuple(devices_of[d] for d in sorted(used) if d in devices_of)
                   or tuple(devices_of[d] for d in sorted(devices_of)))
        extra = {"nsys_metadata": meta_kv, "export_era": era(db), "global_pid": int(gpid),
                 "kernel_short_names": short, "nvtx_unterminated": unterminated, "cuda_graphs": graph_facts,
                 **_summary_tables(db, tables, procs)}
        meta = TraceMeta(
            source_path=str(db.path), source_format="nsys-sqlite", format_version=fmt, devices=devices,
            rank=rank if len(procs) > 1 else None, world_size=len(procs) if len(procs) > 1 else None,
            process_id=int((gpid >> 24) & _LOW24), process_name=process_names.get(gpid), extra=extra,
        )
        traces.append(build_trace(with_warnings(meta, warnings), pool, **parts))
    return traces


def _summary_tables(db: Db, tables: dict, procs: list[int]) -> dict:
    """What the summary tables need to tell an absent table from an empty one: the export's
    tables among :data:`SUMMARY_TABLES` (``nsys_tables``), and the API and OS runtime calls of
    processes that are no trace here (no GPU activity, e.g. a launcher), which ``nsys stats``
    counts and a per-process table does not (``calls_in_other_processes``)."""
    out: dict = {"nsys_tables": [t for t in SUMMARY_TABLES if t in db.tables]}
    other = {}
    for kind, table in (("api", RUNTIME), ("osrt", OSRT)):
        t = tables.get(kind)
        if t is not None and len(t["_key"]):
            n = int((~np.isin(t["_key"], procs)).sum())
            if n:
                other[table] = n
    if other:
        out["calls_in_other_processes"] = other
    return out


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
