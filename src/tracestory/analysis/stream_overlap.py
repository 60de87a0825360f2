"""Kernels that start before the kernel ahead of them on their own stream has ended.

On one stream, kernels run in launch order: a kernel starts once the kernel ahead of it has
ended, unless its launch lets it start early. CUDA's programmatic dependent launch (PDL, Hopper
and later) does that: the kernel ahead signals that its dependents may start, the new kernel
runs its prologue and then waits (``griddepcontrol.wait``) until the kernel ahead has finished.
A profiler records such a kernel from its early start. Its time then includes that wait, and a
sum of kernel times counts the overlap twice.

Model: per (device, stream), the kernels in start order. A kernel's overlap is the part of it
before the latest end among the kernels ahead of it on that stream, clipped to its own length.
Memory operations are left out (a copy on a stream does not start early).

Limits: the profiler's timestamps are the only input; whether a kernel actually waited or ran
useful work during its overlap is not in a trace. Overlaps of a few nanoseconds (clock
rounding) are real in the arithmetic, so :func:`tells` speaks only above
:data:`SHARE_FLOOR` of the summed kernel time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from . import derived

SHARE_FLOOR = 0.01  # overlap below this share of the summed kernel time is not told
NAMED = 3  # kernels named as the ones whose times are most overstated


@dataclass(frozen=True)
class StreamOverlap:
    kernels: int  # kernels with a start and an end
    early: int  # kernels starting before the kernel ahead of them on their stream ended
    overlap_ns: int  # summed overlap of those kernels (each clipped to its own length)
    kernel_ns: int  # summed kernel time
    most: tuple[tuple[str, int], ...]  # (name, overlap ns) of the kernels overlapping most, most first

    @property
    def share(self) -> float:
        return self.overlap_ns / self.kernel_ns if self.kernel_ns else 0.0


def serial_starts(start: np.ndarray, end: np.ndarray, device: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """Each op's start moved to the latest end among the ops ahead of it on its (device, stream),
    where that is later (at most to its own end): when it runs after what it waits for. Ops in
    any order; the result is aligned with the input."""
    n = len(start)
    if n == 0:
        return start.astype(np.int64)
    t0 = int(start.min())  # times relative to the first start: the per-stream offsets stay in int64
    order = np.lexsort((start, stream, device))
    s, e = start[order].astype(np.int64) - t0, end[order].astype(np.int64) - t0
    dev, st = device[order], stream[order]
    first = np.ones(n, dtype=bool)
    first[1:] = (dev[1:] != dev[:-1]) | (st[1:] != st[:-1])
    # the latest end among the ops ahead on the same stream: a running maximum restarted at each
    # stream's first op (ends offset per stream so one accumulate serves all streams)
    group = np.cumsum(first) - 1
    span = int(e.max()) + 1
    latest = np.maximum.accumulate(e + group * span) - group * span
    ahead = np.empty(n, dtype=np.int64)
    ahead[0] = 0
    ahead[1:] = latest[:-1]
    moved = np.where(first, s, np.clip(ahead, s, e))
    out = np.empty(n, dtype=np.int64)
    out[order] = moved + t0
    return out


def kernel_serial_starts(trace: Trace) -> np.ndarray:
    """:func:`serial_starts` of ``trace``'s kernels, aligned with ``trace.kernels``; a kernel
    without a start or with its end before its start keeps its start. Read-only; computed once
    per trace."""
    def compute() -> np.ndarray:
        k = trace.kernels
        start, end = k["start_ns"].astype(np.int64), k["end_ns"].astype(np.int64)
        ok = (start >= 0) & (end >= start)
        out = start.copy()
        out[ok] = serial_starts(start[ok], end[ok], k["device"][ok].astype(np.int64), k["stream"][ok].astype(np.int64))
        return out

    return derived.memo(trace, "kernel_serial_starts", compute)


def stream_overlap(trace: Trace) -> StreamOverlap:
    """The same-stream overlap of ``trace``'s kernels (module docstring)."""
    k = trace.kernels
    start, end = k["start_ns"].astype(np.int64), k["end_ns"].astype(np.int64)
    ok = (start >= 0) & (end >= start)
    if not ok.any():
        return StreamOverlap(0, 0, 0, 0, ())
    over = (kernel_serial_starts(trace) - start)[ok]
    name = k["name"][ok]
    early = over > 0
    per_name: dict[int, int] = {}
    for code, ns in zip(name[early].tolist(), over[early].tolist(), strict=True):
        per_name[code] = per_name.get(code, 0) + ns
    most = sorted(per_name.items(), key=lambda x: (-x[1], trace.name(x[0])))[:NAMED]
    return StreamOverlap(int(ok.sum()), int(early.sum()), int(over.sum()), int((end - start)[ok].sum()),
                         tuple((trace.name(c), ns) for c, ns in most))


def tells(o: StreamOverlap) -> bool:
    """Whether the overlap is large enough to state (at least SHARE_FLOOR of kernel time)."""
    return o.early > 0 and o.share >= SHARE_FLOOR
