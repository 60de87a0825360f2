"""Every GPU op of a trace (kernels, then memops) with its category and launch, built once.

Model: one row per GPU op in the row order of every GPU-op array (all kernels in table order,
then all memops): name code, device, stream, start/end, category (index into the taxonomy) and
the launch call (``links.launch_index``: the row of ``trace.api`` with the op's correlation id;
-1 when the trace has none), with that call's start and end (-1 when unknown). ``order`` sorts
the rows by start time (stable), the order the Execution Story tells them in.

:class:`IdleGaps` holds every gap between the merged busy periods of these ops (the timeline's
model, :func:`intervals.gaps`), the op before and after each gap and the gap's launch wait
(:func:`timeline.gap_attribution`). Renderers and exporters read these arrays; they never
rebuild them from the trace.

Limits: ops without a launch call (graph replays under one graph launch, unlinked nsys rows)
keep -1 launch times; a trace without timestamps still gets its rows (times are then 0).
The arrays are shared with the other analyses of the trace (:mod:`.derived`) and read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from .categories import Classification
from .links import gpu_busy, gpu_ops_column, gpu_ops_launch_index, gpu_ops_launch_times, gpu_ops_order, gpu_ops_times
from .timeline import gap_attribution, idle_gap_attribution


@dataclass(frozen=True, eq=False)
class GpuOps:
    """The GPU ops of one trace, kernels then memops (see the module docstring)."""

    kernel_count: int
    name: np.ndarray  # name code (``trace.name(code)``)
    device: np.ndarray
    stream: np.ndarray
    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64
    category: np.ndarray  # index into ``categories``
    categories: tuple[str, ...]  # the taxonomy's categories, in index order
    launch_row: np.ndarray  # row of ``trace.api`` that launched the op, -1 when unknown
    launch_start_ns: np.ndarray  # that call's start, -1 when unknown
    launch_end_ns: np.ndarray  # that call's end, -1 when unknown
    order: np.ndarray  # rows by start time (stable)
    busy_start_ns: np.ndarray  # the merged busy periods (intervals.union of every op), in time order
    busy_end_ns: np.ndarray

    def __len__(self) -> int:
        return int(self.start_ns.size)

    def __repr__(self) -> str:
        return f"GpuOps(kernels={self.kernel_count}, memops={len(self) - self.kernel_count})"


@dataclass(frozen=True, eq=False)
class IdleGaps:
    """Every idle gap between merged busy periods of the GPU ops, in time order."""

    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64
    before: np.ndarray  # GpuOps row ending at the gap's start
    after: np.ndarray  # GpuOps row starting at the gap's end (launch returned first)
    launch_wait_ns: np.ndarray  # part of the gap before the next op's launch call returned

    def __len__(self) -> int:
        return int(self.start_ns.size)

    def __repr__(self) -> str:
        return f"IdleGaps({len(self)})"


def gpu_ops(trace: Trace, classification: Classification) -> GpuOps:
    """The :class:`GpuOps` of ``trace`` with the categories of ``classification``."""
    start, end = gpu_ops_times(trace)
    busy_start, busy_end = gpu_busy(trace)
    launch = gpu_ops_launch_index(trace)
    launch_start, launch_end = gpu_ops_launch_times(trace)
    return GpuOps(
        kernel_count=len(trace.kernels),
        name=gpu_ops_column(trace, "name"),
        device=gpu_ops_column(trace, "device"),
        stream=gpu_ops_column(trace, "stream"),
        start_ns=start,
        end_ns=end,
        category=np.concatenate([classification.kernel_category, classification.memop_category]),
        categories=tuple(classification.taxonomy.categories),
        launch_row=launch,
        launch_start_ns=launch_start,
        launch_end_ns=launch_end,
        order=gpu_ops_order(trace),
        busy_start_ns=busy_start,
        busy_end_ns=busy_end,
    )


def idle_gaps(ops: GpuOps, trace: Trace | None = None) -> IdleGaps:
    """The :class:`IdleGaps` between the busy periods of ``ops``; ``trace``: the trace ``ops``
    were built from, whose gap attribution is then the timeline's (computed once per trace)."""
    if trace is not None:
        g0, g1, before, after, wait = idle_gap_attribution(trace)
        if g0.size:
            return IdleGaps(g0, g1, before, after, wait)
    g0, g1 = ops.busy_end_ns[:-1], ops.busy_start_ns[1:]  # intervals.gaps of every op
    if g0.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return IdleGaps(g0, g1, empty, empty, empty)
    before, after, wait = gap_attribution(g0, g1, ops.start_ns, ops.end_ns, ops.launch_end_ns)
    return IdleGaps(g0, g1, before, after, wait)


__all__ = ["GpuOps", "IdleGaps", "gpu_ops", "idle_gaps"]
