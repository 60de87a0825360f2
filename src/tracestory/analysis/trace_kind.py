"""The kind of trace: a timeline of GPU work, a summary without start times, or no GPU work.

Signals: a source without kernel start times (``meta.has_timeline`` false: ``nsys stats``
summaries) is ``summary_only``; no kernel and no memory op is ``empty``; else ``timeline``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace import Trace

KINDS = ("timeline", "stream_capture", "range_profiler", "summary_only", "empty")


@dataclass(frozen=True)
class TraceKind:
    kind: str                      # one of KINDS
    evidence: tuple[str, ...]


def trace_kind(trace: Trace) -> TraceKind:
    n = len(trace.kernels) + len(trace.memops)
    if not trace.meta.has_timeline:
        return TraceKind("summary_only", ("kernels carry no start times (a summary export)",))
    if n == 0:
        return TraceKind("empty", ("no kernel and no memory op",))
    return TraceKind("timeline", (f"{n} GPU ops with start and end times",))
