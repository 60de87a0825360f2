"""Graph replays: which kernels came from a CUDA/HIP graph launch, and which were launched one by
one.

Model
-----
CUPTI (and roctracer) give a kernel replayed from a graph the correlation id of the
``cudaGraphLaunch`` / ``hipGraphLaunch`` call that replayed it, so the launch call found through
the correlation id (:func:`~tracestory.analysis.links.launch_index`) tells each kernel's origin:

* **graph**: launched by a graph-launch call; one call replays many kernels, so host launch cost
  is paid once per graph, and a gap between two kernels of one replay is a device-side dependency
  or a wait inside the graph, not launch overhead;
* **direct**: launched by a kernel-launch call (``cudaLaunchKernel``, ``cuLaunchKernel``,
  ``hipLaunchKernel``, ``hipExtModuleLaunchKernel``, ...); the only kernels whose
  launch-to-start latency measures launch overhead;
* **unlinked**: no launch call in the trace (work queued before the capture began, or a source
  without API calls).

Which call names launch a kernel or a graph is :mod:`.launch_apis`'s list (CUDA runtime and
driver, HIP, with nsys's version suffixes removed).

Launch latency, one definition (:func:`launched_directly`, used by the timeline's distribution
in the Appendix and by the idle/launch-bound finding alike): launch call START -> GPU start of
every GPU op launched directly, i.e. a kernel whose call is a kernel launch and a memcpy/memset
whose call is a copy call (``cudaMemcpyAsync``, ...). Ops replayed from a graph (their latency
would be the time since the graph launch), unlinked ops and ops of an unrecognised call are
left out.

Limits: a trace without API calls has only unlinked kernels, and then nothing can be said about
graphs; a graph captured by hand and replayed through a driver API with another name is counted
as direct only when its launch name is a kernel-launch name, else as unlinked-by-name ("other").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from .launch_apis import copy_mask, launch_masks
from .links import launch_index

GRAPH, DIRECT, UNLINKED, OTHER = 0, 1, 2, 3
ORIGINS = ("graph", "direct", "unlinked", "other")


@dataclass(frozen=True)
class GraphReplays:
    """Kernel origins of one trace; times are summed kernel durations."""

    kernel_count: int
    graph_launches: int            # graph-launch calls in the trace
    graph_kernels: int             # kernels replayed by them
    graph_kernel_time_ns: int
    direct_kernels: int
    direct_kernel_time_ns: int
    unlinked_kernels: int          # no launch call in the trace
    unlinked_kernel_time_ns: int
    other_kernels: int             # launched by a call that is neither (unrecognised API name)
    kernel_time_ns: int
    max_kernels_per_graph_launch: int

    @property
    def graph_time_fraction(self) -> float | None:
        return None if self.kernel_time_ns == 0 else self.graph_kernel_time_ns / self.kernel_time_ns

    @property
    def replays_graphs(self) -> bool:
        """True when graph replays carry most of the linked kernel time."""
        linked = self.graph_kernel_time_ns + self.direct_kernel_time_ns
        return self.graph_kernels > 0 and self.graph_kernel_time_ns * 2 >= linked


def kernel_origins(trace: Trace) -> np.ndarray:
    """Per kernel row: GRAPH, DIRECT, UNLINKED or OTHER (indices into :data:`ORIGINS`)."""
    rows = launch_index(trace, trace.kernels)
    out = np.full(len(rows), UNLINKED, dtype=np.int8)
    linked = rows >= 0
    if linked.any():
        kernel_call, graph_call = launch_masks(trace)
        r = rows[linked]
        out[linked] = np.where(graph_call[r], GRAPH, np.where(kernel_call[r], DIRECT, OTHER))
    return out


def memop_origins(trace: Trace) -> np.ndarray:
    """Per memop row: GRAPH (a copy node of a replayed graph), DIRECT (submitted by a copy call),
    UNLINKED or OTHER."""
    rows = launch_index(trace, trace.memops)
    out = np.full(len(rows), UNLINKED, dtype=np.int8)
    linked = rows >= 0
    if linked.any():
        graph_call, copy_call = launch_masks(trace)[1], copy_mask(trace)
        r = rows[linked]
        out[linked] = np.where(graph_call[r], GRAPH, np.where(copy_call[r], DIRECT, OTHER))
    return out


def launched_directly(trace: Trace) -> np.ndarray:
    """Boolean mask over every GPU op, kernels then memops (the order of
    :func:`~tracestory.analysis.links.gpu_ops_column`): launched one by one, so that launch call
    start -> GPU start is a launch latency (see the module docstring)."""
    return np.concatenate([kernel_origins(trace) == DIRECT, memop_origins(trace) == DIRECT])


def graph_replays(trace: Trace) -> GraphReplays:
    """Count kernels and kernel time by origin (see the module docstring)."""
    k = trace.kernels
    dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    origin = kernel_origins(trace)
    graph_calls = int(launch_masks(trace)[1].sum())
    per_launch = 0
    if (origin == GRAPH).any():
        rows = launch_index(trace, k)[origin == GRAPH]
        per_launch = int(np.unique(rows, return_counts=True)[1].max())

    def part(o):
        m = origin == o
        return int(m.sum()), int(dur[m].sum())

    g, d, u, o = part(GRAPH), part(DIRECT), part(UNLINKED), part(OTHER)
    return GraphReplays(len(k), graph_calls, g[0], g[1], d[0], d[1], u[0], u[1], o[0], int(dur.sum()), per_launch)
