"""Trace -> results. Every analysis is a plain function of a Trace returning frozen dataclasses.

:func:`analyze` runs the standard set (classification, breakdown, timeline, phases) on one
trace; the report and the CLI render its :class:`Analysis`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace import Trace
from .breakdown import Breakdown, breakdown
from .categories import Classification, Taxonomy, classify
from .categories import taxonomy as builtin
from .phases import Phases, phases
from .timeline import Timeline, timeline


@dataclass(frozen=True)
class Analysis:
    """The standard results for one trace."""

    trace: "Trace"
    classification: "Classification"
    breakdown: "Breakdown"
    timeline: "Timeline | None"
    phases: "Phases"

    def __repr__(self) -> str:
        return (f"Analysis({self.trace.label!r}, kernels={self.breakdown.kernel_count}, "
                f"phases={len(self.phases.phases)}, taxonomy={self.breakdown.taxonomy!r})")


def analyze(trace: "Trace", taxonomy: "Taxonomy | None" = None, k: float = 2.0) -> Analysis:
    """Classify kernels (``llm`` taxonomy unless given), break GPU time down by category with
    Amdahl ceilings for a ``k``-times faster category, and compute the timeline and phases."""
    tax = taxonomy or builtin("llm")
    cls = classify(trace, tax)
    return Analysis(
        trace=trace,
        classification=cls,
        breakdown=breakdown(trace, cls, k=k),
        timeline=timeline(trace),
        phases=phases(trace),
    )
