"""Overlap-aware ceilings: how much of each category's GPU time is exposed, and what removing it
could buy.

Model
-----
Per device, each category's kernels and memops form a set of busy intervals (their union, so two
streams of the same category count once). A category's **exposed time** is the part of its busy
time when no other category is running on that device: the time the device would stop being
busy if that category's work vanished and nothing else moved. Its **overlapped time** is the rest
of its busy time. Devices are summed.

* ``busy_ns``: the device's busy time (union of all GPU ops), summed over devices.
* ``exposed_ceiling = busy / (busy - exposed)``: the speedup of the GPU's busy time if the
  category took no time at all. The summed-time Amdahl ceiling of :mod:`.breakdown` counts a
  category's time in full even when it runs under another stream's work; when most of it is
  overlapped the exposed ceiling is the one that holds (an all-to-all that is 48% of summed kernel
  time but 96% overlapped buys about 1.03x, not 1.9x).
* Communication overlap (as HTA's comm/comp overlap): the share of the communication category's
  busy time during which a compute op (any category but communication, memcpy and memset) runs on
  the same device.

Ops on one stream run one after another: an op that starts before the op ahead of it on its stream
has ended (CUDA's programmatic dependent launch starts a kernel early, to wait inside it) is taken
from that end (:func:`.stream_overlap.serial_starts`), so its wait is not counted as running under
the op it waits for.

Limits: removing a category can also remove the waits of work that depends on it, which busy
time does not see; and idle time between ops is outside both ceilings (the timeline analysis
covers it). Both ceilings bound the GPU busy time, not wall time.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from ..trace import Trace
from .categories import Classification
from .intervals import intersection_length, union_length
from .links import gpu_ops_column, gpu_ops_order, gpu_ops_times
from .stream_overlap import serial_starts


class CategoryExposure(msgspec.Struct, frozen=True):
    name: str
    busy_ns: int         # union of this category's GPU ops, summed over devices
    exposed_ns: int      # busy while no other category runs
    overlapped_ns: int   # busy_ns - exposed_ns
    exposed_ceiling: float | None  # busy / (busy - exposed); None when exposed == busy (unbounded)

    @property
    def overlapped_fraction(self) -> float | None:
        return None if self.busy_ns == 0 else self.overlapped_ns / self.busy_ns


@dataclass(frozen=True)
class Exposure:
    busy_ns: int
    categories: tuple[CategoryExposure, ...]   # largest exposed first
    comm_category: str | None                  # the taxonomy's communication category, if present
    comm_busy_ns: int
    comm_overlapped_ns: int                    # communication busy while compute runs

    @property
    def comm_overlap_fraction(self) -> float | None:
        return None if self.comm_busy_ns == 0 else self.comm_overlapped_ns / self.comm_busy_ns

    def get(self, name: str) -> CategoryExposure | None:
        return next((c for c in self.categories if c.name == name), None)


COMM_NAMES = ("communication", "comm", "nccl", "collective")
NOT_COMPUTE = ("memcpy", "memset")  # copies under communication are not compute overlap


def _gpu_ops(trace: Trace, cls: Classification):
    """Starts, ends, devices and categories of the GPU ops with a duration, in start order (so
    that no union below has to sort its subset); each start moved past the ops ahead of it on its
    stream (:func:`.stream_overlap.serial_starts`)."""
    starts, ends = gpu_ops_times(trace)
    order = gpu_ops_order(trace)
    rows = order[(ends > starts)[order]]
    device = gpu_ops_column(trace, "device")[rows].astype(np.int64)
    stream = gpu_ops_column(trace, "stream")[rows].astype(np.int64)
    s = serial_starts(starts[rows], ends[rows], device, stream)
    keep = s < ends[rows]
    resort = np.argsort(s[keep], kind="stable")
    cat = np.concatenate([cls.kernel_category, cls.memop_category])[rows].astype(np.int64)
    return s[keep][resort], ends[rows][keep][resort], device[keep][resort], cat[keep][resort]


def exposure(trace: Trace, cls: Classification) -> Exposure:
    """Exposed and overlapped time of every category with GPU ops (see the module docstring)."""
    names = cls.taxonomy.categories
    starts, ends, device, cat = _gpu_ops(trace, cls)
    comm = next((i for i, n in enumerate(names) if n.lower() in COMM_NAMES), None)
    not_compute = [i for i, n in enumerate(names) if n.lower() in NOT_COMPUTE]
    busy_total = 0
    busy = np.zeros(len(names), dtype=np.int64)
    exposed = np.zeros(len(names), dtype=np.int64)
    comm_busy = comm_overlap = 0
    devices = np.unique(device)
    for d in devices:
        if devices.size == 1:
            s, e, c = starts, ends, cat
        else:
            on = device == d
            s, e, c = starts[on], ends[on], cat[on]
        all_union = union_length(s, e)
        busy_total += all_union
        for ci in np.unique(c):
            mine = c == ci
            own = union_length(s[mine], e[mine])
            # Exposed = |all| - |others|: the busy time that disappears with this category.
            others = union_length(s[~mine], e[~mine]) if (~mine).any() else 0
            busy[ci] += own
            exposed[ci] += all_union - others
            if comm is not None and ci == comm:
                comm_busy += own
                compute = ~mine & ~np.isin(c, not_compute)
                if compute.any():
                    comm_overlap += intersection_length((s[mine], e[mine]), (s[compute], e[compute]))
    rows = []
    for ci in np.flatnonzero(busy):
        b, x = int(busy[ci]), int(exposed[ci])
        rows.append(CategoryExposure(names[ci], b, x, b - x,
                                     None if x >= busy_total else busy_total / (busy_total - x)))
    rows.sort(key=lambda r: (-r.exposed_ns, -r.busy_ns, r.name))
    return Exposure(int(busy_total), tuple(rows), names[comm] if comm is not None else None,
                    int(comm_busy), int(comm_overlap))

