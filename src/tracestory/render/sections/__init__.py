"""One module per heading of the report, in the report's order; each has ``render(ctx) ->
list[str]`` (the section's body lines, no heading). :class:`Context` is what every section reads.
The registry that orders them is ``render.markdown.SECTIONS``; no section imports it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Context:
    """What every section reads: the results, the inputs as the report lists them, and the
    PNG plots written beside the report (empty without ``--plots``)."""

    results: object                      # analysis.results.Results
    inputs: tuple[str, ...]
    plots: tuple[Path, ...] = ()

    @property
    def command(self) -> str | None:
        return self.results.options.command
