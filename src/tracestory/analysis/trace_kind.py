"""What kind of trace this is, decided before any story is told about it.

A report's sentences assume a timeline: kernels that ran, at the times they ran. Four other
kinds of input look like traces and are not that, and each makes some sentences false:

* ``empty``: no kernel, memcpy or memset at all (a CPU-only profile, a capture window that
  missed the GPU work), or no kernel and fewer than :data:`FEW_MEMOPS` memory ops (setup copies
  or sets only). Signal: the GPU tables are (nearly) empty.
* ``summary_only``: per-name totals without per-event times (``nsys stats`` summary CSVs such
  as ``cuda_gpu_kern_sum``). Signal: the reader set ``meta.has_timeline`` False and no
  range-profiler events were read.
* ``range_profiler``: a CUPTI range-profiler run (torch.profiler with profiler metrics): one
  ``cuda_profiler_range`` event per kernel with its counters; each kernel was replayed alone,
  so its time is a profiling pass and the gaps between kernels are the profiler's. Signal:
  ``meta.extra["cuda_profiler_ranges"]`` (the Kineto reader counts those events).
* ``stream_capture``: the profiled window captured work into a CUDA/HIP graph: kernel launch
  calls between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` (``hip*`` alike, any API
  version suffix) on one thread record the kernels into the graph and run nothing. Signal: the
  launch calls inside those windows outnumber the kernels that ran; the trace shows the
  capture, not the execution (a busy GPU, a dominant category, launch-bound verdicts would all be
  about the few kernels that happened to run beside it).
* ``timeline``: everything else; captures that are a minority of the launches are quoted in
  the evidence, since their launches ran no kernel there.

:func:`trace_kind` returns a :class:`TraceKind` with the kind and short evidence phrases that
quote the names and counts it rests on.

Limits: a capture window is paired begin -> next end on the same thread; a capture begun before
the trace starts (its begin call not recorded) is not seen. Launch calls are those
:mod:`.launch_apis` lists. A summary-only input from a reader that does not say so (a source
whose times are all zero, say) reads as a timeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from ..units import plural
from .launch_apis import base_name, is_kernel_launch

FEW_MEMOPS = 10  # without a kernel, this few copies/sets are setup, not a GPU workload
KINDS = ("timeline", "stream_capture", "range_profiler", "summary_only", "empty")

_BEGIN = re.compile(r"^(cuda|cu|hip)StreamBeginCapture")
_END = re.compile(r"^(cuda|cu|hip)StreamEndCapture")


@dataclass(frozen=True)
class TraceKind:
    kind: str  # one of KINDS
    evidence: tuple[str, ...]  # short phrases quoting names and counts

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} not among {KINDS}")


def captured_launches(trace: Trace) -> tuple[int, int, str | None]:
    """(kernel launch calls inside capture windows, capture windows, the begin call's name)."""
    api = trace.api
    if len(api) == 0:
        return 0, 0, None
    codes = np.unique(api["name"])
    names = {int(c): base_name(trace.name(int(c))) for c in codes}
    begin_codes = [c for c, n in names.items() if _BEGIN.search(n)]
    if not begin_codes:
        return 0, 0, None
    end_codes = [c for c, n in names.items() if _END.search(n)]
    launch_codes = [c for c, n in names.items() if is_kernel_launch(n)]
    name = api["name"].astype(np.int64)
    is_begin, is_end = np.isin(name, begin_codes), np.isin(name, end_codes)
    is_launch = np.isin(name, launch_codes)
    thread = api["pid"].astype(np.int64) * (1 << 32) + api["tid"].astype(np.int64)
    start, end = api["start_ns"].astype(np.int64), api["end_ns"].astype(np.int64)
    inside = np.zeros(len(api), dtype=bool)
    windows = 0
    for th in np.unique(thread[is_begin]).tolist():
        on = thread == th
        b = np.sort(start[on & is_begin])
        e = np.sort(end[on & is_end])
        for s in b.tolist():
            j = np.searchsorted(e, s, side="left")
            stop = int(e[j]) if j < e.size else int(end.max())  # no end recorded: to the trace's end
            windows += 1
            inside |= on & is_launch & (start >= s) & (start < stop)
    begin_name = names[begin_codes[0]]
    return int(np.count_nonzero(inside)), windows, begin_name


def trace_kind(trace: Trace) -> TraceKind:
    """The kind of ``trace`` and the evidence for it (see the module docstring)."""
    n_k, n_m = len(trace.kernels), len(trace.memops)
    ranges = int(trace.meta.extra.get("cuda_profiler_ranges", 0) or 0) if trace.meta.extra else 0
    if n_k + n_m == 0:
        return TraceKind(
            "empty",
            (f"no kernel, memcpy or memset; {plural(len(trace.ops), 'CPU op')}, {plural(len(trace.api), 'API call')}",),
        )
    if n_k == 0 and n_m < FEW_MEMOPS and not trace.meta.extra.get("cuda_profiler_ranges"):
        return TraceKind(
            "empty",
            (
                f"no kernel ran; {plural(n_m, 'memory op')} and "
                f"{plural(len(trace.api), 'API call')} (the capture missed the GPU work)",
            ),
        )
    if ranges:
        return TraceKind(
            "range_profiler",
            (
                f"{plural(ranges, 'kernel')} from cuda_profiler_range events (CUPTI range profiler): each "
                "replayed alone for its counters, no timeline",
            ),
        )
    if not trace.meta.has_timeline:
        reports = trace.meta.extra.get("reports") if trace.meta.extra else None
        what = f" ({', '.join(reports)})" if reports else ""
        return TraceKind(
            "summary_only",
            (
                f"{trace.meta.source_format} summary{what}: {plural(n_k, 'kernel')} as totals per name, no per-event "
                "times",
            ),
        )
    captured, windows, begin = captured_launches(trace)
    if captured and captured > n_k:
        return TraceKind(
            "stream_capture",
            (
                f"{plural(captured, 'kernel launch', 'kernel launches')} inside {plural(windows, 'stream capture')} "
                f"({begin}..EndCapture) record into a graph and run nothing",
                f"{plural(n_k, 'kernel')} and {plural(n_m, 'memory op')} ran",
            ),
        )
    evidence = [f"{plural(n_k, 'kernel')} and {plural(n_m, 'memory op')} with start and end times"]
    if captured:
        evidence.append(
            f"{plural(captured, 'kernel launch', 'kernel launches')} inside "
            f"{plural(windows, 'stream capture')} ran no kernel here"
        )
    return TraceKind("timeline", tuple(evidence))
