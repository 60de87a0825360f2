"""rocprof (v1) Chrome-trace JSON -> :class:`~tracestory.trace.Trace`.

Model
-----
``rocprof --hip-trace`` (ROCm's first profiler, ``tblextr.py``) writes one JSON object: a
``traceEvents`` array and an ``otherData`` object holding the ``rocminfo`` output as flat keys
(``Agent3.MarketingName``, ``Agent3.ComputeUnit``, ...). Events carry no ``cat``; rows are told
apart by the process they sit in, named by ``process_name`` metadata events (``ph`` "M"):

=====================  ============================================================
``CPU HIP API``        ``api`` (runtime calls; tid from ``args.tid``, the call's own
                       arguments as text in ``args.args``)
``COPY``               ``memops`` (``CopyHostToDevice``, ``CopyDeviceToHost``, ...)
``GPU<n>``             ``kernels`` of device ``n`` (stream from ``args.stream-id``)
=====================  ============================================================

Complete events (``ph`` "X") hold their exact times as strings, ``args.BeginNs`` and
``args.EndNs`` (integer nanoseconds); ``ts``/``dur`` are the same times in truncated
microseconds and are used only to follow flows. Flow events (``ph`` "s" / "t", ``cat``
DataFlow) link a HIP call to the GPU work it submitted: the "s" end sits inside the call
(same tid, ``ts`` within the call's microseconds), the "t" end at the GPU event's ``ts`` on its
process and lane. The flow id becomes the ``correlation`` of both rows, as Kineto's
correlation does. A memop linked to its call gets the call's ``sizeBytes(N)`` as bytes and its
``kind(K)`` (hipMemcpyKind 0-3) as kind; an unlinked one has bytes -1 and the kind its name says.
Copies are renamed as Kineto and the nsys readers name memops, rocprof's name kept in
parentheses (``Memcpy HtoD (CopyHostToDevice)``), so the kernel rules see them as copies.
A kernel linked to a ``hipLaunchKernel`` gets the call's ``numBlocks``/``dimBlocks``.

Devices: one per ``GPU<n>`` process that holds an event (rocprof names GPU0 .. the highest id
used, so empty rows are not devices of the run), described by the n-th GPU agent of ``otherData``'s
rocminfo (marketing name with rocprof's spaces removed, gfx name, compute units as ``sm_count``,
max clock) when rocminfo lists that many GPU agents; else only ``GPU<n>``.

Limits: ``CPU HSA API``, ``Markers and Ranges`` (rocTX), ``GPU Barriers<n>`` and any other process
are not read; their complete events are counted in ``TraceMeta.warnings``, as are events without
usable ``BeginNs``/``EndNs``. Every application process of the file is one Trace (rocprof
keeps the process id only in ``args.pid``). The whole document is read into memory.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np

from ..errors import TraceFormatError
from ..trace import (
    API_RUNTIME,
    MEMOP_KINDS,
    MEMSET,
    DeviceInfo,
    StringPool,
    Trace,
    TraceMeta,
    build_trace,
    make_table,
)
from .files import read_bytes, state
from .sniffs import SNIFF_MARKERS, is_rocprof_head  # noqa: F401  (its sniff, where it was)

EXPECTED = "a rocprof JSON trace (a JSON object with traceEvents)"

HIP_API, COPY = "CPU HIP API", "COPY"
_GPU = re.compile(r"GPU(\d+)")
# Markers found in the first 64 KiB of a rocprof v1 JSON (the process names it writes first;
# otherData's rocminfo keys, which come last, only in a small file).
_KIND = {0: MEMOP_KINDS.index("memcpy_htoh"), 1: MEMOP_KINDS.index("memcpy_htod"),
         2: MEMOP_KINDS.index("memcpy_dtoh"), 3: MEMOP_KINDS.index("memcpy_dtod")}
_NAME_KIND = (("HostToDevice", "memcpy_htod"), ("DeviceToHost", "memcpy_dtoh"),
              ("DeviceToDevice", "memcpy_dtod"), ("HostToHost", "memcpy_htoh"), ("PeerToPeer", "memcpy_peer"),
              ("Fill", "memset"))
_SIZE = re.compile(r"\bsizeBytes\((\d+)\)")
_CALL_KIND = re.compile(r"\bkind\((\d+)\)")
_DIMS = {k: re.compile(k + r"\(\{z\((\d+)\) y\((\d+)\) x\((\d+)") for k in ("numBlocks", "dimBlocks")}
_SHARED = re.compile(r"\bsharedMemBytes\((\d+)\)")


# --------------------------------------------------------------------------- columns
def _ints(values: list) -> np.ndarray:
    """int64 column of values written as numbers or strings of digits; -1 where unreadable."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:   # C-level map: every value a number or a string of digits (the usual file)
        return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
    except (ValueError, OverflowError, TypeError):
        return np.fromiter((_int(v) for v in values), dtype=np.int64, count=len(values))


def _int(v) -> int:
    if isinstance(v, bool):
        return -1
    try:
        out = int(v)
    except (TypeError, ValueError, OverflowError):
        try:
            out = int(float(v))
        except (TypeError, ValueError, OverflowError):
            return -1
    return out if -(1 << 62) < out < (1 << 62) else -1


def _args(e: dict) -> dict:
    a = e.get("args")
    return a if isinstance(a, dict) else {}


class _Rows:
    """The complete events of one table: their event dicts and args, exact times, and flow keys."""

    def __init__(self, events: list[dict], warnings: Counter, what: str):
        args = [_args(e) for e in events]
        begin = _ints([a.get("BeginNs") for a in args])
        end = _ints([a.get("EndNs") for a in args])
        ok = (begin >= 0) & (end >= begin)
        if not ok.all():
            warnings[f"{what} events without a usable args.BeginNs/EndNs (dropped)"] += int((~ok).sum())
            keep = np.flatnonzero(ok)
            events, args = [events[i] for i in keep], [args[i] for i in keep]
            begin, end = begin[ok], end[ok]
        self.events, self.args, self.begin, self.end = events, args, begin, end
        self.ts_us = _ints([e.get("ts") for e in events])       # the flows' time base
        self.dur_us = _ints([e.get("dur") for e in events])
        self.correlation = np.full(len(events), -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.events)

    def names(self) -> list[str]:
        return [str(e.get("name", a.get("Name", ""))) for e, a in zip(self.events, self.args)]


# --------------------------------------------------------------------------- flows
def _link_calls(api: _Rows, tids: np.ndarray, s_id: np.ndarray, s_tid: np.ndarray, s_ts: np.ndarray) -> dict:
    """flow id -> row of ``api`` whose [ts, ts + dur] (microseconds, 1 us of truncation allowed)
    holds the flow's start, on the same thread."""
    out: dict[int, int] = {}
    for tid in np.unique(s_tid):
        rows = np.flatnonzero((tids == tid) & (api.ts_us >= 0))
        if not len(rows):
            continue
        rows = rows[np.argsort(api.ts_us[rows], kind="stable")]
        ts = api.ts_us[rows]
        end = ts + np.maximum(api.dur_us[rows], 0) + 1
        pick = np.flatnonzero(s_tid == tid)
        i = np.searchsorted(ts, s_ts[pick], side="right") - 1
        hit = (i >= 0) & (s_ts[pick] <= end[np.maximum(i, 0)])
        out.update(zip(s_id[pick][hit].tolist(), rows[i[hit]].tolist()))
    return out


def _link_ops(ops: _Rows, lanes: np.ndarray, t_id: np.ndarray, t_lane: np.ndarray, t_ts: np.ndarray) -> dict:
    """flow id -> row of ``ops`` on the flow's lane starting at the flow's end ``ts``; several
    flows ending at one microsecond of a lane take that lane's events of that microsecond in order."""
    out: dict[int, int] = {}
    for lane in np.unique(t_lane):
        rows = np.flatnonzero(lanes == lane)
        if not len(rows):
            continue
        rows = rows[np.argsort(ops.ts_us[rows], kind="stable")]
        ts = ops.ts_us[rows]
        pick = np.flatnonzero(t_lane == lane)
        pick = pick[np.lexsort((t_id[pick], t_ts[pick]))]
        want = t_ts[pick]
        rank = np.arange(len(pick)) - np.searchsorted(want, want, side="left")
        i = np.searchsorted(ts, want, side="left") + rank
        hit = i < len(ts)
        hit[hit] &= ts[i[hit]] == want[hit]
        out.update(zip(t_id[pick][hit].tolist(), rows[i[hit]].tolist()))
    return out


def _flows(events: list[dict], hip_pid: str | None) -> tuple[np.ndarray, ...]:
    starts = [e for e in events if e.get("ph") == "s" and str(e.get("pid")) == hip_pid]
    ends = [e for e in events if e.get("ph") == "t"]
    s = (_ints([e.get("id") for e in starts]), _ints([e.get("tid") for e in starts]),
         _ints([e.get("ts") for e in starts]))
    t = (_ints([e.get("id") for e in ends]), [f"{e.get('pid')}/{e.get('tid')}" for e in ends],
         _ints([e.get("ts") for e in ends]))
    return s, t


# --------------------------------------------------------------------------- devices
def _agents(other: dict) -> list[dict]:
    """rocminfo's GPU agents from ``otherData``, in agent order."""
    agents: dict[int, dict] = {}
    for key, value in other.items():
        m = re.match(r"Agent(\d+)\.(.+)$", str(key))
        if m:
            agents.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return [a for _, a in sorted(agents.items()) if str(a.get("DeviceType", "")).upper() == "GPU"]


def _device(n: int, agent: dict | None) -> DeviceInfo:
    if not agent:
        return DeviceInfo(id=n, name=f"GPU{n}")
    market, gfx = str(agent.get("MarketingName", "")).strip(), str(agent.get("Name", "")).strip()
    name = f"{market} ({gfx})" if market and gfx and gfx != market else (market or gfx or f"GPU{n}")
    cus = _int(str(agent.get("ComputeUnit", "")).split("(")[0])
    mhz = _int(str(agent.get("MaxClockFreq.(MHz)", "")).split("(")[0])
    return DeviceInfo(id=n, name=name, sm_count=cus if cus > 0 else None,
                      clock_hz=float(mhz) * 1e6 if mhz > 0 else None)


# --------------------------------------------------------------------------- reader
def load_rocprof_json(path: str | os.PathLike, *, require_gpu: bool = True) -> Trace:
    """Read a rocprof v1 ``--hip-trace`` JSON (``.json`` or ``.json.gz``); see the module docstring.

    ``require_gpu``: raise :class:`TraceFormatError` when no kernel or copy event is read."""
    path = Path(path)
    try:
        doc = msgspec.json.decode(read_bytes(path))
    except msgspec.DecodeError as e:
        raise TraceFormatError(path, EXPECTED, f"invalid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError(path, EXPECTED, f"a JSON {type(doc).__name__} without a traceEvents list")
    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e]
    if not events:
        raise TraceFormatError(path, "trace events", "an empty traceEvents list")
    other = doc.get("otherData") if isinstance(doc.get("otherData"), dict) else {}

    procs = {str(e.get("pid")): str(_args(e).get("name", "")) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    hip_pid = next((p for p, n in procs.items() if n == HIP_API), None)
    gpu_of = {p: int(m.group(1)) for p, n in procs.items() if (m := _GPU.fullmatch(n))}
    copy_pids = {p for p, n in procs.items() if n == COPY}

    warnings: Counter = Counter()
    by_pid: dict[str, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X":
            by_pid.setdefault(str(e.get("pid")), []).append(e)
    for p, evs in by_pid.items():
        if p != hip_pid and p not in gpu_of and p not in copy_pids:
            warnings[f"complete events of process {procs.get(p, 'pid ' + p)!r} not read"] += len(evs)

    pool = StringPool()
    api = _Rows(by_pid.get(hip_pid, []) if hip_pid else [], warnings, f"{HIP_API!r}")
    gpu_pids = sorted(gpu_of, key=gpu_of.get)
    kern = _Rows([e for p in gpu_pids for e in by_pid.get(p, [])], warnings, "GPU kernel")
    copy = _Rows([e for p in sorted(copy_pids) for e in by_pid.get(p, [])], warnings, f"{COPY!r}")
    if require_gpu and not len(kern) and not len(copy):
        raise TraceFormatError(path, "GPU activity (complete events of 'GPU<n>' or 'COPY' processes)",
                               f"{len(events)} events and none on the GPU (was rocprof run with --hip-trace?)")

    # flows: call -> GPU op
    (s_id, s_tid, s_ts), (t_id, t_lane, t_ts) = _flows(events, hip_pid)
    api_tid = _ints([a.get("tid", e.get("tid")) for e, a in zip(api.events, api.args)])
    api_tid_flow = _ints([e.get("tid") for e in api.events])  # the flow's tid is the event's lane
    calls = _link_calls(api, api_tid_flow, s_id, s_tid, s_ts)
    t_lane_arr = np.array(t_lane, dtype=object)
    for rows in (kern, copy):
        lanes = np.array([f"{e.get('pid')}/{e.get('tid')}" for e in rows.events], dtype=object)
        for fid, row in _link_ops(rows, lanes, t_id, t_lane_arr, t_ts).items():
            call = calls.get(fid)
            if call is not None and fid >= 0:
                rows.correlation[row] = fid
                api.correlation[call] = fid
    call_text = [str(a.get("args", "")) for a in api.args]
    api_names = api.names()

    def linked_text(rows: _Rows) -> list[str | None]:
        idx = {int(c): i for i, c in enumerate(api.correlation.tolist()) if c >= 0}
        return [call_text[idx[c]] if c in idx else None for c in rows.correlation.tolist()]

    # kernels
    k_text = linked_text(kern)
    dims = {k: np.full((len(kern), 3), -1, dtype=np.int32) for k in _DIMS}
    shared = np.full(len(kern), -1, dtype=np.int64)
    for i, text in enumerate(k_text):
        if not text:
            continue
        for k, rx in _DIMS.items():
            m = rx.search(text)
            if m:
                dims[k][i] = (int(m.group(3)), int(m.group(2)), int(m.group(1)))   # x, y, z
        m = _SHARED.search(text)
        if m:
            shared[i] = int(m.group(1))
    k_dev = np.array([gpu_of[str(e.get("pid"))] for e in kern.events], dtype=np.int32)
    kernels = make_table(
        "kernels", start_ns=kern.begin, end_ns=kern.end, device=k_dev,
        stream=_stream(kern), correlation=kern.correlation, name=pool.encode(kern.names()),
        pid=_ints([a.get("pid") for a in kern.args]),
        grid_x=dims["numBlocks"][:, 0], grid_y=dims["numBlocks"][:, 1], grid_z=dims["numBlocks"][:, 2],
        block_x=dims["dimBlocks"][:, 0], block_y=dims["dimBlocks"][:, 1], block_z=dims["dimBlocks"][:, 2],
        shared_mem_bytes=shared)

    # memops
    c_names = copy.names()
    c_text = linked_text(copy)
    call_name = {int(c): api_names[i] for i, c in enumerate(api.correlation.tolist()) if c >= 0}
    kinds, nbytes, labels = [], [], []
    for name, text, corr in zip(c_names, c_text, copy.correlation.tolist()):
        kind = next((MEMOP_KINDS.index(k) for word, k in _NAME_KIND if word in name), MEMOP_KINDS.index("memcpy_other"))
        size = -1
        if text is not None:
            m = _SIZE.search(text)
            size = int(m.group(1)) if m else -1
            if "Memset" in call_name.get(corr, ""):
                kind = MEMSET
            else:
                m = _CALL_KIND.search(text)
                kind = _KIND.get(int(m.group(1)), kind) if m else kind
        kinds.append(kind)
        nbytes.append(size)
        labels.append(_label(kind, name))
    memops = make_table(
        "memops", start_ns=copy.begin, end_ns=copy.end, device=_ints([a.get("dev-id") for a in copy.args]),
        stream=_stream(copy), correlation=copy.correlation, name=pool.encode(labels),
        pid=_ints([a.get("pid") for a in copy.args]), kind=np.array(kinds, dtype=np.int32),
        bytes=np.array(nbytes, dtype=np.int64))

    api_pid = _ints([a.get("pid") for a in api.args])
    api_table = make_table(
        "api", start_ns=api.begin, end_ns=api.end, name=pool.encode(api_names), correlation=api.correlation,
        pid=api_pid, tid=api_tid, kind=np.full(len(api), API_RUNTIME, dtype=np.int32))

    used = sorted(set(k_dev.tolist()) | {int(d) for d in memops["device"].tolist() if d >= 0})
    agents = _agents(other)
    devices = tuple(_device(n, agents[n] if n < len(agents) else None) for n in used)
    main_pid = None
    if len(api_pid) and (api_pid >= 0).any():
        pids, counts = np.unique(api_pid[api_pid >= 0], return_counts=True)
        main_pid = int(pids[np.argmax(counts)])
    extra = {"event_count": len(events), "profiler": "rocprof (v1)"}
    if "HSASystemAttributes.RuntimeVersion" in other:
        extra["hsa_runtime_version"] = str(other["HSASystemAttributes.RuntimeVersion"])
    meta = TraceMeta(
        source_path=str(path), source_format="rocprof-json", devices=devices, process_id=main_pid,
        extra=extra, warnings=tuple(f"{count:,} {what}" for what, count in warnings.items()))
    trace = build_trace(meta, pool, kernels=kernels, memops=memops, api=api_table)
    state(path, trace.meta.warnings)
    return trace


_SHORT = {"memcpy_htod": "HtoD", "memcpy_dtoh": "DtoH", "memcpy_dtod": "DtoD", "memcpy_htoh": "HtoH",
          "memcpy_peer": "PtoP"}


def _label(kind: int, name: str) -> str:
    """A copy named as Kineto names memops (the kernel rules' ``^memcpy``/``^memset``), with
    rocprof's own name in parentheses: ``Memcpy HtoD (CopyHostToDevice)``."""
    if kind == MEMSET:
        return f"Memset ({name})"
    short = _SHORT.get(MEMOP_KINDS[kind])
    return f"Memcpy {short} ({name})" if short else f"Memcpy ({name})"


def _stream(rows: _Rows) -> np.ndarray:
    """``args.stream-id``, else the event's tid (rocprof's lane per stream)."""
    return _ints([a.get("stream-id", e.get("tid")) for e, a in zip(rows.events, rows.args)])
