"""Kineto (PyTorch profiler) Chrome traces -> :class:`~tracestory.trace.Trace`.

Model
-----
A Kineto trace is one JSON object whose ``traceEvents`` array holds complete events (``ph``
"X") with ``ts``/``dur`` in microseconds (floats with a nanosecond fraction), instant events
(``[memory]`` samples), flows and metadata. Events are routed by ``cat``:

===================================  =======================================
``kernel``                           ``kernels``
``gpu_memcpy`` / ``gpu_memset``      ``memops`` (kind from the name)
``cuda_runtime`` / ``cuda_driver``   ``api`` (runtime / driver)
``cpu_op``                           ``ops`` (shapes and flops when recorded; an attention
                                     op's causal flag from "Concrete Inputs",
                                     :mod:`.kineto_attention`)
``user_annotation``                  ``ranges``, CPU side (``record_function``, ProfilerStep#N)
``gpu_user_annotation``              ``ranges``, GPU side
``[memory]`` instants                ``memory`` (allocated / reserved samples)
``cuda_profiler_range``              ``kernels``: a CUPTI range-profiler run (one range per
                                     kernel, counters in args); with no ``kernel`` event the
                                     trace has no timeline (``has_timeline`` False)
===================================  =======================================

Collectives: a kernel that carries "Collective name" (and the sizes, dtype, process group and
"Seq" args) gets a ``collectives`` row; in recent torch (2.11 seen) the args sit on the ``record_param_comms``
CPU op instead, and its NCCL kernel is found through the launch call (the launch's External id
is the op's, its correlation the kernel's).

The 2021 (PyTorch 1.9) capitalised categories (Kernel, Memcpy, Runtime, Operator) map the same
way. Flows, python_function, overhead and the Trace span are not kept: the launch -> kernel
link is the ``correlation`` arg, which both sides carry.

How it stays fast and small on multi-GB traces
-----------------------------------------------
:mod:`.kineto_text` streams the text (inflated in a background thread, by ISA-L when the ``isal``
package is installed) and cuts the ``traceEvents`` array into ~32 MB chunks at event boundaries
(``},{``); the whole document is never in memory. Each chunk is read by one of two paths, which
give the same tables (:class:`_Builder` reads both through one interface, ``_StructChunk`` and
:class:`.kineto_native.NativeChunk`):

* **the compiled scanner** (:mod:`.kineto_native`, C, built by ``pip install`` where a compiler
  is at hand): one pass over the text writes the kept fields of every event straight into
  columns, with no Python object per event; flows of other categories are only counted. It is
  stricter than msgspec and declines (``None``) any chunk it cannot read exactly as msgspec would.
* **msgspec's typed decode**, for the chunks the scanner declines and where it is not built
  (``TRACESTORY_KINETO_NATIVE=0`` forces it): structs that keep only the fields we use (the
  collective fields only for chunks whose text holds "Collective name"), one struct type per
  ``ph`` (a tagged union: flow events are decoded with their ``cat`` alone), columns pulled out
  with C-level ``map``/``attrgetter``/``np.fromiter``.

Names are dictionary-encoded (:class:`~tracestory.trace.StringPool`); peak memory is one chunk of
text and its columns plus the kept columns. A cut that lands inside a string makes that chunk
invalid JSON; the chunk is then extended to the next boundary. With ``TRACESTORY_KINETO_WORKERS=2``
the chunks of a large trace are decoded in worker processes (:mod:`.kineto_workers`; off by
default, see there).

Damaged input
-------------
What cannot be read is refused in one line (:class:`~tracestory.errors.TraceFormatError`):
corrupt gzip, text that is not JSON, a cut file with no complete event (or, with
``require_gpu``, none on the GPU) before the cut, nesting deeper than the interpreter's recursion limit, more decompressed text than
``TRACESTORY_MAX_DECOMPRESSED`` (see :mod:`.kineto_text`). Events that cannot be placed are
dropped or repaired and counted in ``TraceMeta.warnings``: events of a known category whose
``ph`` is not "X", complete events without ``cat``, a ``ts`` or ``dur`` that is not a number,
``ts`` beyond +-2**62 ns, a negative ``dur`` or one over 2**62 ns (int64 ns would overflow),
names that are numbers (kept as their text), args of the wrong type (that arg ignored).
Events without ``dur`` are kept at 0 ns and counted ("'kernel' events without 'dur'"): their
time is unknown, not zero; a trace whose kernels all lack ``dur`` is refused (no GPU time to
tell). An
integer id beyond int64 or a grid/block size beyond int32 refuses the file (one line).

Truncated traces
----------------
A file cut short (a JSON text that ends inside ``traceEvents``, a gzip stream that ends early)
is read up to the last complete event before the cut (:mod:`.kineto_text`) and reported as
partial: the first warning says "truncated at byte N: M events read; what is after the cut is
missing" (N in bytes of JSON text, decompressed for gzip; M every event decoded), and
``meta.extra["truncated"]`` holds the numbers. A Kineto file writes the CPU events first and the
GPU events after them in launch order, so a cut removes the GPU side of the run's end while its
CPU side was read: the trace is kept up to the start of the last GPU op read (CPU calls, ops and
memory samples that start later are dropped, and ranges that end later, so that the step the
cut fell into is not told as a short step), and the warning says so. A cut after the events
array closed loses no event (only the keys after it, such as ``baseTimeNanoseconds``).

Limits
------
Timestamps become integer ns as ``rint(ts_us * 1000)``; float64 keeps that exact for
timestamps below 2**53 ns (about 104 days of a relative clock). Traces with absolute epoch
microsecond timestamps lose sub-microsecond precision in the JSON float itself.
"""

from __future__ import annotations

import gc
import math
import os
import re
import types
from collections import Counter, deque
from contextlib import closing
from itertools import chain, compress, repeat
from operator import attrgetter
from pathlib import Path
from typing import Callable, ClassVar, Union

import msgspec
import numpy as np

from ..errors import TraceFormatError
from ..trace import (
    API_DRIVER,
    API_RUNTIME,
    CPU_SIDE,
    GPU_SIDE,
    MEMOP_KINDS,
    DeviceInfo,
    StringPool,
    Table,
    Trace,
    TraceMeta,
    build_trace,
    make_table,
)
from ..units import fmt_ns
from . import kineto_native
from .files import state
from .hip_grids import grids_in_workgroups
from .kineto_attention import causal_column
from .kineto_text import NESTING_EXPECTED, Document, stream_document
from .kineto_workers import ChunkPool, Ready, decode_workers

CHUNK_BYTES = 32 << 20
WORKER_CHUNK_BYTES = 16 << 20  # chunks handed to worker processes: smaller, so that both start early

Progress = Callable[[int, int], None]


# --------------------------------------------------------------------------- typed events
class _Args(msgspec.Struct, gc=False):
    """The args we keep, for chunks without collectives (most traces: no field to fill in)."""

    external_id: int = msgspec.field(default=-1, name="External id")
    correlation: int = -1
    device: int = -1
    stream: int = -1
    bytes: int = -1
    registers: int = msgspec.field(default=-1, name="registers per thread")
    shared_memory: int = msgspec.field(default=-1, name="shared memory")
    grid: list[int] | None = None
    block: list[int] | None = None
    flops: float = math.nan
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_dims_2021: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input dims")  # early-2021 key
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")
    total_allocated: int = msgspec.field(default=-1, name="Total Allocated")
    total_reserved: int = msgspec.field(default=-1, name="Total Reserved")
    delta_bytes: int = msgspec.field(default=0, name="Bytes")
    device_id: int = msgspec.field(default=-1, name="Device Id")
    device_type: int = msgspec.field(default=-1, name="Device Type")
    name: str = ""  # metadata events: process_name / thread_name


class _CollArgs(_Args, gc=False):
    """:class:`_Args` and the collective's arguments that collective kernels (and their
    ``record_param_comms`` op) carry: decoded only for chunks whose text holds "Collective name"."""

    coll_name: str = msgspec.field(default="", name="Collective name")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    group_size: int = msgspec.field(default=-1, name="Group size")
    dtype: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="dtype")
    pg_name: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Process Group Name")
    pg_ranks: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Process Group Ranks")
    seq: int = msgspec.field(default=-1, name="Seq")
    seq_lower: int = msgspec.field(default=-1, name="seq")


class _Event(msgspec.Struct, gc=False, tag_field="ph"):
    """An event of any phase but a flow, as kept: decoded as one of the per-phase subclasses
    below (a union tagged by ``ph``), whose ``ph`` is a class attribute, not a decoded field."""

    ph: ClassVar[str] = ""
    cat: str = ""
    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = math.nan
    dur: float = math.nan   # missing: told apart from a measured 0 (see _common)
    args: _Args | None = None  # None, not a default instance: flows carry no args (10% of decoding)


class _Flow(msgspec.Struct, gc=False, tag_field="ph"):
    """A flow event (``ph`` "s", "t", "f": Kineto's launch -> kernel and forward -> backward
    arrows, a third of a trace's events): only its ``cat`` is decoded (for the "without ph 'X'"
    count), the rest of its text is skipped, which is most of the reason for the tagged union."""

    ph: ClassVar[str] = ""
    name: ClassVar[str] = ""
    cat: str = ""


# Chrome trace-event phases (the format's document); "" stands for a missing or unknown ``ph``
# in the lenient path (the typed decode refuses those and sends the chunk there).
_FLOW_PHASES = ("s", "t", "f")
_OTHER_PHASES = ("", "B", "E", "i", "I", "C", "b", "n", "e", "S", "T", "p", "F", "P", "O", "N", "D", "M", "V",
                 "v", "R", "c", "(", ")")


def _phase_class(base: type, ph: str, name: str) -> type:
    return types.new_class(name, (base,), {"tag": ph, "gc": False}, lambda ns: ns.update(ph=ph))


class _X(_Event, tag="X"):
    ph: ClassVar[str] = "X"


class _CollX(_X, tag="X"):
    """A complete event of a chunk that may hold collectives (see :class:`_CollArgs`)."""

    args: _CollArgs | None = None  # type: ignore[assignment]


_PHASE_CLASSES = tuple(_phase_class(_Event, ph, f"_Phase{i}") for i, ph in enumerate(_OTHER_PHASES)) + tuple(
    _phase_class(_Flow, ph, f"_Flow{i}") for i, ph in enumerate(_FLOW_PHASES))
_LEAN = Union[(_X, *_PHASE_CLASSES)]  # type: ignore[valid-type]
_FULL = Union[(_CollX, *_PHASE_CLASSES)]  # type: ignore[valid-type]
_PHASES = frozenset(("X", *_OTHER_PHASES, *_FLOW_PHASES))
_NATIVE_PHASES = "".join(p for p in _PHASES if len(p) == 1)  # "" (missing or unknown) is msgspec's


_NO_ARGS = _CollArgs()


class _Doc(msgspec.Struct):
    deviceProperties: list[dict] | None = None
    distributedInfo: dict | None = None
    schemaVersion: int | None = None
    traceName: str | None = None
    baseTimeNanoseconds: int | None = None
    displayTimeUnit: str | None = None
    cupti_version: int | None = None
    cuda_runtime_version: int | None = None
    cuda_driver_version: int | None = None
    record_shapes: int | bool | None = None
    profile_memory: int | bool | None = None
    with_stack: int | bool | None = None
    with_flops: int | bool | None = None
    with_modules: int | bool | None = None


_RANGE_PROFILER_CAT = "cuda_profiler_range"
# Event routing: cat -> table kind.
_K_KERNEL, _K_MEMCPY, _K_MEMSET, _K_RUNTIME, _K_DRIVER, _K_OP, _K_RANGE_CPU, _K_RANGE_GPU = range(8)
_K_NO_CAT = -2
_KIND_CAT = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation",
             "gpu_user_annotation")
_CAT_KIND = {
    "kernel": _K_KERNEL, "Kernel": _K_KERNEL,
    # CUPTI range profiler (torch.profiler with experimental_config profiler_metrics): one range per
    # kernel, replayed alone for its counters; the kernels of that run, read as kernels
    _RANGE_PROFILER_CAT: _K_KERNEL,
    "gpu_memcpy": _K_MEMCPY, "Memcpy": _K_MEMCPY,
    "gpu_memset": _K_MEMSET, "Memset": _K_MEMSET,
    "cuda_runtime": _K_RUNTIME, "Runtime": _K_RUNTIME,
    "cuda_driver": _K_DRIVER,
    "cpu_op": _K_OP, "Operator": _K_OP,
    "user_annotation": _K_RANGE_CPU,
    "gpu_user_annotation": _K_RANGE_GPU,
    "": _K_NO_CAT,
}
# Times kept as int64 ns: |ts| and dur below 2**62 ns, so that ts + dur cannot overflow.
_MAX_US = float(1 << 62) / 1000.0
_MEMORY_NAME = "[memory]"

_MEMCPY_KIND = {
    "HtoD": MEMOP_KINDS.index("memcpy_htod"),
    "DtoH": MEMOP_KINDS.index("memcpy_dtoh"),
    "DtoD": MEMOP_KINDS.index("memcpy_dtod"),
    "HtoH": MEMOP_KINDS.index("memcpy_htoh"),
    "PtoP": MEMOP_KINDS.index("memcpy_peer"),
}
_MEMCPY_OTHER = MEMOP_KINDS.index("memcpy_other")


def _memcpy_kind(name: str) -> int:
    # "Memcpy HtoD (Pageable -> Device)"
    parts = name.split()
    return _MEMCPY_KIND.get(parts[1], _MEMCPY_OTHER) if len(parts) > 1 else _MEMCPY_OTHER


# --------------------------------------------------------------------------- chunked decode
class _ChunkDecoder:
    """Decode of one chunk of events (:func:`~.kineto_text.stream_document` cuts them) into a chunk
    for :meth:`_Builder.add_chunk`: by the compiled scanner (:mod:`.kineto_native`) when it reads
    the chunk exactly, else by msgspec's typed decode.

    ``None`` means the text is not valid JSON (a cut inside a string: the caller retries with a
    longer chunk). Valid JSON whose values do not fit the typed schema goes through
    :func:`_lenient_events`, which keeps what it can and counts what it drops in ``warnings``."""

    def __init__(self, path: Path, warnings: Counter):
        self.path = path
        self.warnings = warnings
        self.lean = msgspec.json.Decoder(list[_LEAN])
        self.full = msgspec.json.Decoder(list[_FULL])
        self.native = kineto_native.Scanner(_CAT_KIND, _NATIVE_PHASES, "".join(_FLOW_PHASES)) \
            if kineto_native.enabled() else None
        self.collectives = False  # whether the last chunk decoded may hold collective args

    def __call__(self, text: memoryview):
        if self.native is not None:
            chunk = self.native(text)
            if chunk is not None:
                self.collectives = True  # the scanner reads the collective args wherever they are
                return chunk
        # msgspec decodes the collective fields only where the text has them (a search of the
        # whole chunk: 13 ms per 32 MiB, which the scanner's chunks do without)
        self.collectives = text.obj.find(b'"Collective name"', 0, len(text)) >= 0
        events = self.structs(text)
        return None if events is None else _StructChunk(events)

    def structs(self, text: memoryview) -> list | None:
        try:
            try:
                return (self.full if self.collectives else self.lean).decode(text)
            except msgspec.ValidationError:
                pass  # valid JSON whose values do not fit the typed schema, or a bad cut further on
            except msgspec.DecodeError:
                return None
            try:
                items = msgspec.json.decode(text)
            except msgspec.DecodeError:
                return None
        except RecursionError:
            raise TraceFormatError(self.path, NESTING_EXPECTED, "deeper nesting in traceEvents") from None
        except UnicodeDecodeError as e:
            raise TraceFormatError(self.path, "JSON text in UTF-8", f"a string that is not UTF-8 in traceEvents "
                                   f"({e.reason})") from None
        return _lenient_events(items, self.warnings)


def _lenient_events(items: list, warnings: Counter) -> list[_Event]:
    """Slow path for chunks whose events do not match the typed schema: convert event by event,
    keep what converts, and count in ``warnings`` what was dropped or repaired."""
    out = []
    for item in items:
        if not isinstance(item, dict):
            warnings["trace events that are not JSON objects ignored"] += 1
            continue
        ev = {}
        for k in _EVENT_FIELDS:
            v = item.get(k)
            if v is None:
                continue
            if k in _TEXT_FIELDS and not isinstance(v, str):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    warnings[f"events with a number as '{k}' (read as its text)"] += 1
                    v = str(v)
                else:
                    warnings[f"events with a '{k}' that is not text (ignored)"] += 1
                    continue
            elif k in _NUMBER_FIELDS and (isinstance(v, bool) or not isinstance(v, (int, float))):
                v = _number_or_none(v)
                if v is None:
                    ev = None
                    warnings[f"events dropped: '{k}' is not a number"] += 1
                    break
                warnings[f"events with '{k}' as text (read as a number)"] += 1
            elif k in ("pid", "tid") and (isinstance(v, bool) or not isinstance(v, (int, str))):
                continue
            ev[k] = v
        if ev is None:
            continue
        if ev.get("ph") not in _PHASES:
            ev["ph"] = ""
        args = item.get("args")
        clean_args = {k: msgspec.Raw(msgspec.json.encode(v)) if k in _RAW_ARGS else v
                      for k, v in args.items() if v is not None} if isinstance(args, dict) else {}
        try:
            out.append(msgspec.convert({**ev, "args": clean_args}, _FULL, strict=False))
            continue
        except msgspec.ValidationError:
            pass
        # keep the event without the args that do not convert
        fixed = {}
        for k, v in clean_args.items():
            try:
                msgspec.convert({k: v}, _CollArgs, strict=False)
                fixed[k] = v
            except msgspec.ValidationError:
                warnings[f"event args '{k}' of the wrong type (ignored)"] += 1
        try:
            out.append(msgspec.convert({**ev, "args": fixed}, _FULL, strict=False))
        except msgspec.ValidationError:
            warnings["events that do not convert (ignored)"] += 1
    return out


def _number_or_none(v) -> float | None:
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


_RAW_ARGS = frozenset(f.encode_name for f in msgspec.structs.fields(_CollArgs) if f.type is msgspec.Raw)
_EVENT_FIELDS = ("ph", *(f for f in _Event.__struct_fields__ if f != "args"))
_TEXT_FIELDS = frozenset(("ph", "cat", "name"))
_NUMBER_FIELDS = frozenset(("ts", "dur"))


# --------------------------------------------------------------------------- columns
def _col(events, getter) -> list:
    return list(map(getter, events))


def _args(events: list[_Event]) -> list[_Args]:
    """The args of each event; an event without args gets the defaults (all missing)."""
    a = _col(events, attrgetter("args"))
    if None in a:
        a = [x if x is not None else _NO_ARGS for x in a]
    return a


def _int_col(objs: list, getter) -> np.ndarray:
    """An integer field of every object as int64 (no intermediate list when all are ints)."""
    try:
        return np.fromiter(map(getter, objs), dtype=np.int64, count=len(objs))
    except (TypeError, ValueError, OverflowError):
        return _ints(_col(objs, getter))


def _float_col(objs: list, getter) -> np.ndarray:
    return np.fromiter(map(getter, objs), dtype=np.float64, count=len(objs))


def _ints(values: list) -> np.ndarray:
    arr = np.array(values)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    # mixed ids (a string pid such as "Spans", or "stream 7" tids from 2021 traces)
    return np.array([_to_int(v) for v in values], dtype=np.int64)


def _to_int(v) -> int:
    if isinstance(v, int):
        return v
    digits = re.search(r"-?\d+", str(v))
    return int(digits.group()) if digits else -1


def _ns(values: list) -> np.ndarray:
    return np.rint(np.asarray(values, dtype=np.float64) * 1000.0).astype(np.int64)


def _dims3(values: list) -> np.ndarray:
    """grid/block lists -> (n, 3) int32; missing -> -1."""
    if not values:
        return np.full((0, 3), -1, dtype=np.int32)
    try:  # the usual case, every value a list of 3: flattened at C speed
        if np.all(np.fromiter(map(len, values), dtype=np.int64, count=len(values)) == 3):
            return np.fromiter(chain.from_iterable(values), dtype=np.int32, count=3 * len(values)).reshape(-1, 3)
    except TypeError:  # a missing value (None)
        pass
    try:
        arr = np.array(values, dtype=np.int32)
        if arr.ndim == 2 and arr.shape[1] == 3:
            return arr
    except (TypeError, ValueError):
        pass
    fixed = [(list(v) + [1, 1, 1])[:3] if v else [-1, -1, -1] for v in values]
    return np.array(fixed, dtype=np.int32)


class _StructChunk:
    """One chunk decoded by msgspec (a list of per-phase structs), read by :class:`_Builder`
    through the interface :class:`.kineto_native.NativeChunk` offers for the compiled path."""

    def __init__(self, events: list):
        self.events = events
        self.cats = _col(events, attrgetter("cat"))
        self.event_count = len(events)

    def kinds(self) -> np.ndarray:
        n = len(self.cats)
        return np.fromiter(map(_CAT_KIND.get, self.cats, repeat(-1, n)), dtype=np.int8, count=n)

    def is_x(self) -> np.ndarray:
        n = len(self.events)
        return np.fromiter(map(isinstance, self.events, repeat(_X, n)), dtype=bool, count=n)

    def cat_counts(self, mask: np.ndarray) -> Counter:
        return Counter(compress(self.cats, mask)) if mask.any() else Counter()  # first-seen order

    def count_cat(self, text: str) -> int:
        return self.cats.count(text)

    def _events(self, idx: np.ndarray) -> list:
        return list(map(self.events.__getitem__, idx.tolist()))

    def named(self, idx: np.ndarray, text: str) -> np.ndarray:
        return np.fromiter(map(text.__eq__, _col(self._events(idx), attrgetter("name"))), dtype=bool, count=len(idx))

    def process_names(self, idx: np.ndarray) -> list[tuple[int, str]]:
        return [(ev.pid, ev.args.name) for ev in self._events(idx)
                if ev.ph == "M" and ev.name == "process_name" and isinstance(ev.pid, int) and ev.args is not None
                and ev.args.name]

    def rows(self, idx: np.ndarray) -> _StructRows:
        return _StructRows(self._events(idx))


class _StructRows:
    """Events of one table kind from a :class:`_StructChunk`: their columns, as the builder asks."""

    def __init__(self, events: list):
        self.events = events
        self._a: list | None = None

    @property
    def args(self) -> list:
        if self._a is None:
            self._a = _args(self.events)
        return self._a

    def __len__(self) -> int:
        return len(self.events)

    def take(self, mask: np.ndarray) -> _StructRows:
        return _StructRows(list(compress(self.events, mask)))

    def floats(self, field: str) -> np.ndarray:
        return _float_col(self.args if field == "flops" else self.events, attrgetter(field))

    def ints(self, field: str) -> np.ndarray:
        return _int_col(self.events if field in ("pid", "tid") else self.args, attrgetter(field))

    def dims(self, field: str) -> np.ndarray:
        return _dims3(_col(self.args, attrgetter(field)))

    def name_codes(self, pool: StringPool) -> np.ndarray:
        return pool.encode(_col(self.events, attrgetter("name")))

    def raws(self, field: str) -> np.ndarray:
        return _raw_column(_col(self.args, attrgetter(field)))

    def raw_at(self, field: str) -> Callable[[int], bytes]:
        args = self.args
        return lambda i: bytes(getattr(args[i], field))

    def collectives(self) -> tuple[np.ndarray, list[str]]:
        """(positions, names) of the rows whose "Collective name" is not empty; only for chunks
        decoded with the collective fields (``_CollArgs``)."""
        names = _col(self.args, attrgetter("coll_name"))
        has = np.fromiter(map(bool, names), dtype=bool, count=len(names))
        return np.flatnonzero(has), list(compress(names, has))


class _Builder:
    """Accumulates per-chunk column arrays for every table."""

    def __init__(self):
        self.pool = StringPool()
        self.parts: dict[str, list[dict]] = {k: [] for k in ("kernels", "memops", "api", "ops", "ranges", "memory",
                                                              "collectives")}
        self.process_names: dict[int, str] = {}
        self.event_count = 0
        self.kernel_count = 0  # kernels added so far: the row offset of the next chunk's kernels
        self.comm_ops: list[dict] = []  # collective args found on CPU ops, by External id
        self.warnings: Counter = Counter()  # what was dropped or repaired, and how often
        self.no_dur: Counter = Counter()    # events without 'dur' per kind (kept at 0 ns)
        self.collectives = True  # whether the chunk being added may hold collective args
        self.profiler_ranges = 0  # cuda_profiler_range events read as kernels

    def add_chunk(self, chunk, collectives: bool = True) -> None:
        """One chunk, as a :class:`_StructChunk` (msgspec) or a :class:`.kineto_native.NativeChunk`
        (the compiled scanner): both offer the same rows and columns."""
        self.event_count += chunk.event_count
        self.collectives = collectives
        kinds = chunk.kinds()
        self.profiler_ranges += chunk.count_cat(_RANGE_PROFILER_CAT)
        is_x = chunk.is_x()
        routed = kinds >= 0
        kinds_x = np.where(is_x, kinds, -1)
        for kind in np.unique(kinds_x[kinds_x >= 0]):
            self._add_kind(int(kind), chunk.rows(np.flatnonzero(kinds_x == kind)))
        self._count_unrouted(chunk, kinds, is_x, routed)
        if is_x.all():
            return
        others = np.flatnonzero(~is_x)  # instants ([memory]), metadata, flows
        is_mem = chunk.named(others, _MEMORY_NAME)
        if is_mem.any():
            self._add_memory(chunk.rows(others[is_mem]))
        for pid, name in chunk.process_names(others):  # a handful per trace
            self.process_names[pid] = name

    def merge(self, part: _Builder) -> None:
        """Append what ``part`` (a builder that read the next chunk on its own, in a worker)
        holds, as if this builder had read that chunk: its string codes are re-encoded in this
        pool (in ``part``'s first-seen order, so codes come out as in a one-process read),
        its kernel indices shifted past the kernels read so far, its counts added."""
        remap = self.pool.encode(part.pool.strings)
        for kind, parts in part.parts.items():
            for cols in parts:
                for c in _POOL_COLUMNS[kind]:
                    cols[c] = remap[cols[c]]
                if kind == "collectives":
                    cols["kernel_index"] = cols["kernel_index"] + self.kernel_count
                self.parts[kind].append(cols)
        for cols in part.comm_ops:
            for c in _POOL_COLUMNS["collectives"]:
                cols[c] = remap[cols[c]]
            self.comm_ops.append(cols)
        self.process_names.update(part.process_names)
        self.event_count += part.event_count
        self.kernel_count += part.kernel_count
        self.profiler_ranges += part.profiler_ranges
        self.warnings.update(part.warnings)
        self.no_dur.update(part.no_dur)

    def _count_unrouted(self, chunk, kinds: np.ndarray, is_x: np.ndarray, routed: np.ndarray) -> None:
        """Events that look like ours but cannot be placed: counted in ``warnings``."""
        no_x = routed & ~is_x
        for cat, count in chunk.cat_counts(no_x).items():
            self.warnings[f"'{cat}' events without ph 'X' ignored"] += count
        no_cat = int(np.count_nonzero(is_x & (kinds == _K_NO_CAT)))
        if no_cat:
            self.warnings["complete events (ph 'X') without a 'cat' ignored"] += no_cat

    def _common(self, kind: int, rows):
        """(rows, start_ns, end_ns, name codes): rows whose times cannot be integer ns are
        dropped and counted."""
        ts = rows.floats("ts")
        dur = rows.floats("dur")
        no_dur = np.isnan(dur)
        if no_dur.any():   # kept at 0 ns, and said: their time is unknown, not zero
            self.no_dur[kind] += int(np.count_nonzero(no_dur & (np.abs(ts) < _MAX_US)))
            dur = np.where(no_dur, 0.0, dur)
        ok = (np.abs(ts) < _MAX_US) & (dur >= 0) & (dur < _MAX_US)  # NaN compares False
        if not ok.all():
            bad_ts = ~(np.abs(ts) < _MAX_US)
            cat = _KIND_CAT[kind]
            if bad_ts.any():
                self.warnings[f"'{cat}' events dropped: 'ts' missing or out of range"] += int(bad_ts.sum())
            bad_dur = int(np.count_nonzero(~ok & ~bad_ts))
            if bad_dur:
                self.warnings[f"'{cat}' events dropped: 'dur' negative or over 2**62 ns"] += bad_dur
            rows = rows.take(ok)
            ts, dur = ts[ok], dur[ok]
        start = np.rint(ts * 1000.0).astype(np.int64)
        return rows, start, start + np.rint(dur * 1000.0).astype(np.int64), rows.name_codes(self.pool)

    def _add_kind(self, kind: int, rows) -> None:
        rows, start, end, name = self._common(kind, rows)
        if not len(rows):
            return
        ext = rows.ints("external_id")
        if kind in (_K_KERNEL, _K_MEMCPY, _K_MEMSET):
            device = rows.ints("device")
            stream = rows.ints("stream")
            # Events without args (old formats): the GPU lane is pid = device, tid = stream.
            no_dev = device < 0
            if no_dev.any():
                device = np.where(no_dev, rows.ints("pid"), device)
            no_stream = stream < 0
            if no_stream.any():
                stream = np.where(no_stream, rows.ints("tid"), stream)
            common = dict(start_ns=start, end_ns=end, name=name, device=device, stream=stream,
                          correlation=rows.ints("correlation"), external_id=ext)
            if kind == _K_KERNEL:
                grid = rows.dims("grid")
                block = rows.dims("block")
                self.parts["kernels"].append(dict(
                    common,
                    grid_x=grid[:, 0], grid_y=grid[:, 1], grid_z=grid[:, 2],
                    block_x=block[:, 0], block_y=block[:, 1], block_z=block[:, 2],
                    registers_per_thread=rows.ints("registers"),
                    shared_mem_bytes=rows.ints("shared_memory"),
                ))
                self._add_collectives(rows, common)
                self.kernel_count += len(rows)
            else:
                if kind == _K_MEMSET:
                    mkind = np.zeros(len(rows), dtype=np.int32)
                else:
                    codes, at = np.unique(name, return_inverse=True)  # a few names: one split each
                    mkind = np.array([_memcpy_kind(self.pool.strings[c]) for c in codes.tolist()], dtype=np.int32)[at]
                self.parts["memops"].append(dict(common, kind=mkind, bytes=rows.ints("bytes")))
        elif kind in (_K_RUNTIME, _K_DRIVER):
            self.parts["api"].append(dict(
                start_ns=start, end_ns=end, name=name, external_id=ext,
                correlation=rows.ints("correlation"),
                pid=rows.ints("pid"), tid=rows.ints("tid"),
                kind=np.full(len(rows), API_RUNTIME if kind == _K_RUNTIME else API_DRIVER, dtype=np.int32),
            ))
        elif kind == _K_OP:
            self.parts["ops"].append(dict(
                start_ns=start, end_ns=end, name=name, external_id=ext,
                pid=rows.ints("pid"), tid=rows.ints("tid"),
                flops=rows.floats("flops"),
                input_dims=_input_dims(rows),
                input_types=rows.raws("input_types"),
                causal=causal_column(name, self.pool, rows.raw_at("concrete_inputs")),
            ))
            self._add_comm_ops(rows, ext)
        else:
            gpu = kind == _K_RANGE_GPU
            if gpu:
                device = rows.ints("device")
                device = np.where(device >= 0, device, rows.ints("pid"))
            else:
                device = np.full(len(rows), -1, dtype=np.int64)
            self.parts["ranges"].append(dict(
                start_ns=start, end_ns=end, name=name, external_id=ext,
                side=np.full(len(rows), GPU_SIDE if gpu else CPU_SIDE, dtype=np.int32),
                pid=rows.ints("pid"), tid=rows.ints("tid"),
                device=device, domain=np.zeros(len(rows), dtype=np.int32),
            ))

    def _coll_args(self, rows) -> tuple[np.ndarray, dict] | None:
        """Rows that carry "Collective name", and their collectives columns."""
        if not self.collectives:
            return None
        at, names = rows.collectives()
        if not at.size:
            return None
        has = np.zeros(len(rows), dtype=bool)
        has[at] = True
        cr = rows.take(has)  # collectives are few: per-row Python below is cheap
        seq = cr.ints("seq")
        enc = self.pool.encode
        return at, dict(
            name=enc(names),
            in_nelems=cr.ints("in_nelems"),
            out_nelems=cr.ints("out_nelems"),
            group_size=cr.ints("group_size"),
            dtype=enc([_raw_text(x) for x in cr.raws("dtype")]),
            pg_name=enc([_raw_text(x) for x in cr.raws("pg_name")]),
            pg_ranks=enc([_ranks_text(x) for x in cr.raws("pg_ranks")]),
            seq=np.where(seq >= 0, seq, cr.ints("seq_lower")),
        )

    def _add_collectives(self, rows, common: dict) -> None:
        """Rows of ``collectives`` for the kernels (of one chunk) that carry "Collective name"."""
        found = self._coll_args(rows)
        if found is None:
            return
        rows, cols = found
        self.parts["collectives"].append(dict(
            cols, kernel_index=rows + self.kernel_count,
            start_ns=common["start_ns"][rows], end_ns=common["end_ns"][rows],
            device=common["device"][rows], stream=common["stream"][rows],
        ))

    def _add_comm_ops(self, rows, ext: np.ndarray) -> None:
        """CPU ops that carry the collective args (``record_param_comms``): since torch 2.x
        they, not the NCCL kernels, hold them; :func:`_link_comm_ops` finds their kernels."""
        found = self._coll_args(rows)
        if found is not None:
            rows, cols = found
            self.comm_ops.append(dict(cols, external_id=ext[rows]))

    def _add_memory(self, rows) -> None:
        ts = rows.floats("ts")
        ok = np.abs(ts) < _MAX_US
        if not ok.all():
            self.warnings["'[memory]' samples dropped: 'ts' missing or out of range"] += int(np.count_nonzero(~ok))
            rows, ts = rows.take(ok), ts[ok]
        dev_type = rows.ints("device_type")
        dev_id = rows.ints("device_id")
        self.parts["memory"].append(dict(
            ts_ns=_ns(ts),
            device=np.where(dev_type == 1, dev_id, -1),
            allocated_bytes=rows.ints("total_allocated"),
            reserved_bytes=rows.ints("total_reserved"),
            delta_bytes=rows.ints("delta_bytes"),
            pid=rows.ints("pid"),
        ))

    def table(self, kind: str):
        parts = self.parts[kind]
        if not parts:
            return None
        cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return make_table(kind, **cols)


# The columns that hold codes of the builder's string pool, per table.
_POOL_COLUMNS = {"kernels": ("name",), "memops": ("name",), "api": ("name",), "ops": ("name",),
                 "ranges": ("name",), "memory": (), "collectives": ("name", "dtype", "pg_name", "pg_ranks")}


def _decode_part(path: Path, text) -> _Builder | None:
    """One chunk decoded on its own (in a worker process, see :mod:`.kineto_workers`): a builder
    holding its columns, or ``None`` when the text is not one JSON array."""
    gc.disable()
    part = _Builder()
    decode = _ChunkDecoder(path, part.warnings)
    chunk = decode(memoryview(text))
    if chunk is None:
        return None
    part.add_chunk(chunk, decode.collectives)
    return part


def _raw_column(raws: list) -> np.ndarray:
    """Raw JSON slices -> object array of bytes (b"" when absent). Parse with :func:`parse_json_field`."""
    if raws.count(_NO_RAW) == len(raws):  # shapes not recorded: every value is the default
        return np.full(len(raws), b"", dtype=object)
    out = np.empty(len(raws), dtype=object)
    out[:] = list(map(bytes, raws))
    return out


_NO_RAW = _NO_ARGS.input_dims


def _input_dims(rows) -> np.ndarray:
    """Each op's input shapes, under "Input Dims", or "Input dims" in traces of early 2021."""
    dims = rows.raws("input_dims")
    old = rows.raws("input_dims_2021")
    missing = dims == b""
    if not missing.any() or (old == b"").all():
        return dims
    return np.where(missing, old, dims)


_NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl", re.IGNORECASE)


def _link_comm_ops(builder: _Builder, tables: dict):
    """``collectives`` rows for NCCL kernels whose args sit on the CPU op that launched them.

    kernel -> its launch call (same ``correlation``) -> the launch's External id -> the
    ``record_param_comms`` op with that External id. Kernels that already carry the args keep
    their own row; NCCL kernels launched before the trace began have no launch and stay
    without args."""
    have = tables["collectives"]
    k, api = tables["kernels"], tables["api"]
    if not builder.comm_ops or k is None or api is None:
        return have
    ops = {c: np.concatenate([p[c] for p in builder.comm_ops]) for c in builder.comm_ops[0]}
    codes = np.unique(k["name"])
    nccl = codes[[bool(_NCCL_KERNEL.match(builder.pool.strings[c])) for c in codes]]
    is_nccl = np.isin(k["name"], nccl)
    if have is not None:
        is_nccl[have["kernel_index"]] = False
    a_order = np.argsort(api["correlation"], kind="stable")
    a_corr = api["correlation"][a_order]
    pos = np.minimum(np.searchsorted(a_corr, k["correlation"]), len(a_corr) - 1)
    launch_ext = np.where((a_corr[pos] == k["correlation"]) & (k["correlation"] >= 0) & is_nccl,
                          api["external_id"][a_order[pos]], -1)
    o_order = np.argsort(ops["external_id"], kind="stable")
    o_ext = ops["external_id"][o_order]
    opos = np.minimum(np.searchsorted(o_ext, launch_ext), len(o_ext) - 1)
    rows = np.flatnonzero((launch_ext >= 0) & (o_ext[opos] == launch_ext))
    if rows.size == 0:
        return have
    src = o_order[opos[rows]]
    linked = make_table("collectives", kernel_index=rows, start_ns=k["start_ns"][rows], end_ns=k["end_ns"][rows],
                        device=k["device"][rows], stream=k["stream"][rows],
                        **{c: v[src] for c, v in ops.items() if c != "external_id"})
    return linked if have is None else Table.concat([have, linked])


_ABSENT = object()


def _decoded(raw: msgspec.Raw | bytes):
    """A raw JSON value decoded, or ``_ABSENT`` when the field is missing or not valid JSON."""
    if len(raw) == 0:
        return _ABSENT
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return _ABSENT


def _raw_text(raw: msgspec.Raw | bytes) -> str:
    """A raw JSON scalar as text: a string unquoted, a number as written, absent as ""."""
    v = _decoded(raw)
    return v if isinstance(v, str) else "" if v is None or v is _ABSENT else str(v)


def _ranks_text(raw: msgspec.Raw | bytes) -> str:
    """"Process Group Ranks" (a list, or a string holding one) as the canonical "[0, 1]"; "" if absent."""
    v = _decoded(raw)
    if v is _ABSENT:
        return ""
    ints = [int(x) for x in v] if isinstance(v, list) else [int(x) for x in re.findall(r"-?\d+", str(v))]
    return "[" + ", ".join(map(str, ints)) + "]"


def parse_json_field(value) -> object | None:
    """Decode one raw ``input_dims`` / ``input_types`` cell of the ops table."""
    if value is None or len(value) == 0:
        return None
    return msgspec.json.decode(value)


# --------------------------------------------------------------------------- depth
def range_depth(start: np.ndarray, end: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """Nesting depth of each interval within its lane (thread or stream); 0 = outermost.

    Assumes properly nested ranges per lane (record_function / NVTX push-pop). Depth of i =
    number of intervals of the same lane that start before it (in start asc, end desc order)
    and have not ended by its start.
    """
    n = len(start)
    depth = np.zeros(n, dtype=np.int32)
    if n == 0:
        return depth
    for lane_id in np.unique(lane):
        idx = np.flatnonzero(lane == lane_id)
        order = idx[np.lexsort((-end[idx], start[idx]))]
        s, e = start[order], end[order]
        ended = np.searchsorted(np.sort(e), s, side="right")
        pos = np.arange(len(order))
        depth[order] = np.maximum(pos - ended, 0)
    return depth


# --------------------------------------------------------------------------- entry point
def _outer(document: Document, path: Path) -> _Doc:
    """The top-level keys other than traceEvents."""
    try:
        return msgspec.json.decode(document.outer_json(), type=_Doc)
    except msgspec.ValidationError as e:
        raise TraceFormatError(path, "a Kineto trace (a JSON object with traceEvents)", f"unexpected JSON layout ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceFormatError(path, "a Kineto trace (JSON)", f"invalid JSON around traceEvents ({e})") from None
    except RecursionError:
        raise TraceFormatError(path, NESTING_EXPECTED, "deeper nesting") from None


def _devices(props: list[dict] | None) -> tuple[DeviceInfo, ...]:
    out = []
    for p in props or ():
        if not isinstance(p, dict):
            continue
        out.append(DeviceInfo(
            id=int(p.get("id", len(out))),
            name=str(p.get("name", "unknown")),
            sm_count=p.get("numSms"),
            cc_major=p.get("computeMajor"),
            cc_minor=p.get("computeMinor"),
            total_memory_bytes=p.get("totalGlobalMem"),
        ))
    return tuple(out)


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def load_kineto(path: str | os.PathLike, *, require_gpu: bool = True, progress: Progress | None = None) -> Trace:
    """Read a Kineto Chrome trace (``.json`` or ``.json.gz``).

    ``require_gpu``: raise :class:`TraceFormatError` when the trace has no GPU activity (no
    kernel, memcpy or memset event), the usual sign of a profiler run without CUDA activities.
    ``progress(done_bytes, total_bytes)`` is called after each decoded chunk.
    """
    path = Path(path)
    # Decoding creates millions of short-lived objects and no reference cycles: the cyclic
    # garbage collector would only rescan them over and over.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        workers = decode_workers(path)
        trace = None
        if workers:
            try:
                trace = _load(path, require_gpu, progress, workers)
            except Exception:   # any surprise (damage included): the one-process read says it exactly
                trace = None
        if trace is None:
            trace = _load(path, require_gpu, progress)
        trace = grids_in_workgroups(trace)
    except OverflowError as e:   # an id beyond int64 (2**64 correlation ids), a grid beyond int32
        raise TraceFormatError(path, "integer ids within 64 bits and grid/block sizes within 32 bits",
                               f"a value out of range ({e})") from None
    finally:
        kineto_native.release()
        if gc_was_enabled:
            gc.enable()
    state(path, trace.meta.warnings)   # on the terminal too, not only in the JSON and Limitations
    return trace


class _Unreadable(Exception):
    """A worker could not decode its chunk as one JSON array: read again in one process."""


def _decode_with_workers(path: Path, document: Document, builder: _Builder, workers: int,
                         progress: Progress | None) -> None:
    """The events read by :mod:`.kineto_workers`: chunks decoded in ``workers`` processes and
    merged into ``builder`` in file order."""

    def done(part: _Builder | None) -> _Builder:
        if part is None:
            raise _Unreadable
        return part

    with ChunkPool(workers, _decode_part) as pool:
        def submit(text: memoryview):
            return pool.submit(path, bytes(text))   # the buffer is reused: the worker gets a copy

        def here(text: memoryview):
            part = _decode_part(path, text)
            return None if part is None else Ready(part)

        pending: deque = deque()
        with closing(stream_document(path, document, WORKER_CHUNK_BYTES, submit, progress, here)) as chunks:
            for handle in chunks:
                pending.append(handle)
                if len(pending) > workers:
                    builder.merge(done(pending.popleft().get()))
        while pending:
            builder.merge(done(pending.popleft().get()))


def _load(path: Path, require_gpu: bool, progress: Progress | None, workers: int = 0) -> Trace:
    builder = _Builder()
    document = Document()
    if workers:
        _decode_with_workers(path, document, builder, workers, progress)
    else:
        decode = _ChunkDecoder(path, builder.warnings)
        for chunk in stream_document(path, document, CHUNK_BYTES, decode, progress):
            builder.add_chunk(chunk, decode.collectives)
            del chunk  # its views of the text must go before the text can grow
    if document.truncated_at is not None and builder.event_count == 0:
        raise TraceFormatError(path, "trace events", f"no complete event before the cut at byte "
                               f"{document.truncated_at:,}{_gz(document)} (a truncated file)")
    doc = _outer(document, path)
    if builder.event_count == 0:
        raise TraceFormatError(path, "trace events", "an empty traceEvents list")

    tables = {k: builder.table(k) for k in builder.parts}
    tables["collectives"] = _link_comm_ops(builder, tables)
    cut = None
    if document.truncated_at is not None:
        cut = _read_to_the_cut(path, document, builder.event_count, tables, require_gpu)
    if require_gpu and tables["kernels"] is None and tables["memops"] is None:
        raise TraceFormatError(
            path, "GPU activity (kernel, gpu_memcpy or gpu_memset events)",
            f"{builder.event_count} events and none on the GPU (was ProfilerActivity.CUDA enabled?)",
        )
    n_kernels = len(tables["kernels"]) if tables["kernels"] is not None else 0
    if n_kernels and builder.no_dur[_K_KERNEL] >= n_kernels:
        raise TraceFormatError(path, "kernel events with a 'dur' (their GPU time)",
                               f"{n_kernels:,} kernels, none with a 'dur'")
    for kind, count in sorted(builder.no_dur.items()):
        builder.warnings[f"'{_KIND_CAT[kind]}' events without 'dur' (kept as 0 ns: their time is unknown, "
                         "not zero)"] += count
    r = tables["ranges"]
    if r is not None:
        lane = r["side"].astype(np.int64) * (1 << 40) + np.where(r["side"] == GPU_SIDE, r["device"].astype(np.int64) * (1 << 20) + r["tid"], r["tid"])
        tables["ranges"] = r.with_columns(depth=range_depth(r["start_ns"], r["end_ns"], lane))

    dist = doc.distributedInfo or None
    rank = _int_or_none(dist.get("rank")) if dist else None
    if rank is None:
        m = _RANK_IN_NAME.search(path.name)
        rank = int(m.group(1)) if m else None
    main_pid = None
    if tables["api"] is not None and len(tables["api"]):
        pids, counts = np.unique(tables["api"]["pid"], return_counts=True)
        main_pid = int(pids[np.argmax(counts)])
    elif builder.process_names:
        main_pid = min(p for p in builder.process_names if p >= 0) if any(p >= 0 for p in builder.process_names) else None
    extra = {
        k: getattr(doc, k)
        for k in ("schemaVersion", "traceName", "baseTimeNanoseconds", "cupti_version", "cuda_runtime_version",
                  "cuda_driver_version", "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
        if getattr(doc, k) is not None
    }
    extra["event_count"] = builder.event_count
    if cut is not None:
        extra["truncated"] = cut[1]
    # A CUPTI range-profiler trace: its kernels ran one at a time, replayed for their counters, so
    # their times are profiling passes, not a timeline (read as a summary: has_timeline False).
    range_profiler = builder.profiler_ranges > 0 and builder.kernel_count <= builder.profiler_ranges
    if builder.profiler_ranges:
        extra["cuda_profiler_ranges"] = builder.profiler_ranges
    meta = TraceMeta(
        source_path=str(path),
        source_format="kineto",
        format_version=str(doc.schemaVersion) if doc.schemaVersion is not None else None,
        devices=_devices(doc.deviceProperties),
        rank=rank,
        world_size=_int_or_none(dist.get("world_size")) if dist else None,
        process_id=main_pid,
        process_name=builder.process_names.get(main_pid) if main_pid is not None else None,
        distributed=dist,
        has_timeline=not range_profiler,
        extra=extra,
        warnings=((cut[0],) if cut is not None else ())
        + tuple(f"{count:,} {what}" for what, count in builder.warnings.items()),
    )
    return build_trace(meta, builder.pool, **{k: v for k, v in tables.items() if v is not None})


def _gz(document: Document) -> str:
    return " of the decompressed text (the gzip stream ends early)" if document.gzip_cut else ""


def _read_to_the_cut(path: Path, document: Document, events: int, tables: dict,
                     require_gpu: bool) -> tuple[str, dict]:
    """A cut document (see "Truncated traces" in the module docstring): the warning that states
    it and ``meta.extra["truncated"]``; ``tables`` are clipped in place to the complete part."""
    at, gz = int(document.truncated_at or 0), _gz(document)
    info: dict = {"at_byte": at, "events_read": events, "gzip_stream_cut": document.gzip_cut,
                  "after_events": document.cut_after_events, "complete_through_ns": None,
                  "dropped_events": 0, "dropped_ranges": 0}
    if document.cut_after_events:
        return (f"truncated at byte {at:,}{gz}, after the events: all {events:,} events read; the keys after "
                "traceEvents (traceName, baseTimeNanoseconds) are missing", info)
    gpu = [t["start_ns"] for k in ("kernels", "memops") if (t := tables.get(k)) is not None and len(t)]
    if not gpu:
        if require_gpu:
            raise TraceFormatError(path, "GPU activity before the cut (kernel, gpu_memcpy or gpu_memset events)",
                                   f"truncated at byte {at:,}{gz}: {events:,} events read, none on the GPU (a "
                                   "Kineto file writes the GPU events after the CPU ones)")
        return f"truncated at byte {at:,}{gz}: {events:,} events read; what is after the cut is missing", info
    through = max(int(a.max()) for a in gpu)
    first = min(int(t["ts_ns" if k == "memory" else "start_ns"].min()) for k, t in tables.items()
                if t is not None and len(t) and k != "collectives")
    dropped = 0
    for kind in ("api", "ops", "memory"):
        t = tables.get(kind)
        if t is not None and len(t):
            keep = t["ts_ns" if kind == "memory" else "start_ns"] <= through
            dropped += int(len(t) - keep.sum())
            tables[kind] = t.take(keep)
    ranges = 0
    r = tables.get("ranges")
    if r is not None and len(r):
        keep = r["end_ns"] <= through   # a range (a step) the cut ends early would tell a partial story
        ranges = int(len(r) - keep.sum())
        tables["ranges"] = r.take(keep)
    info.update(complete_through_ns=through, dropped_events=dropped, dropped_ranges=ranges)
    return (f"truncated at byte {at:,}{gz}: {events:,} events read; what is after the cut is missing. The "
            f"last GPU op read starts {fmt_ns(through - first)} into the trace: the report tells the trace up to "
            f"there ({dropped:,} CPU-side events and {ranges:,} ranges or steps that start or end later dropped)",
            info)


def _int_or_none(v) -> int | None:
    """distributedInfo's rank / world_size: a number, or a string holding one (on-demand traces)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    try:
        return int(str(v).strip().strip('"'))
    except ValueError:
        return None
