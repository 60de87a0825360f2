"""One module per heading of the report, in the report's order; each has ``render(ctx) ->
list[str]`` (the section's body lines, no heading). :class:`Context` is what every section reads.
The registry that orders them is ``render.markdown.SECTIONS``; no section imports it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...analysis.results import Results, RunResults


@dataclass(frozen=True)
class Context:
    """What every section reads: the results, the inputs as the report lists them, and the
    PNG plots written beside the report (empty without ``--plots``)."""

    results: Results
    inputs: tuple[str, ...]
    plots: tuple[Path, ...] = ()

    @property
    def shown(self) -> tuple[RunResults, ...]:
        """The runs the per-trace sections tell: all of them, or for many traces the median one
        and the ones that differ (``Results.selection``); the rest are in the Appendix table."""
        r = self.results
        sel = r.selection
        return tuple(r.runs) if sel is None else tuple(r.runs[i] for i in sel.shown)

    @property
    def command(self) -> str | None:
        return self.results.options.command

    @property
    def serving_only(self) -> bool:
        """The inputs hold a serving run's scheduler log (and load summary) but no trace and no
        kernel metrics: the sections a trace feeds have nothing to say and are left out."""
        r = self.results
        return not r.runs and r.batching is not None and not r.hardware

    @property
    def no_trace(self) -> str | None:
        """The n/a line of a section that needs a timeline trace, when the inputs hold none
        (Nsight Compute metrics alone, or a scheduler event log alone); else None."""
        if self.results.runs:
            return None
        if self.results.batching is not None:
            return "n/a: the inputs hold a scheduler event log but no timeline trace (Kineto or Nsight Systems)."
        return "n/a: the inputs hold no timeline trace (Kineto or Nsight Systems), only per-kernel metrics."
