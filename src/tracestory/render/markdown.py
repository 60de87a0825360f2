"""The story report as Markdown: the report format's headings, in order, one module per heading.

:data:`SECTIONS` is the registry: each :class:`Section` names a heading and the function of
``render/sections/`` that writes its body from a :class:`~tracestory.render.sections.Context`
(the :class:`~tracestory.analysis.results.Results`, the inputs as given, the PNG plots).
:func:`render_report` is the one assembly loop; ``tracestory check`` reads the same registry.
Output is deterministic (same input, same bytes: no clock, no absolute paths, sorted
everything); every chart is in a code fence and <= 100 columns; every number in prose is
formatted from a result; a missing value prints ``n/a`` with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .md import label
from .sections import (
    Context,
    actions,
    appendix,
    codebase,
    environment,
    execution,
    goal,
    hardware,
    observations,
    reproduction,
    summary,
    telemetry,
    visualizations,
)

TITLE_PREFIX = "Hands-On Learning Report:"


@dataclass(frozen=True)
class Section:
    """One heading of the report and the function that writes its body (a list of lines)."""

    title: str
    render: Callable[[Context], list[str] | None]
    optional: bool = False  # not in every report (a section whose render returns None is left out)


SECTIONS: tuple[Section, ...] = (
    Section("Executive Summary", summary.render),
    Section("Environment", environment.render),
    Section("Codebase Analysis Summary", codebase.render),
    Section("Goal Interpretation", goal.render),
    Section("Actions Log", actions.render),
    Section("Execution Story", execution.render),
    Section("Visualizations", visualizations.render),
    Section("Hardware Behavior Analysis", hardware.render),
    Section("GPU Telemetry", telemetry.render, optional=True),
    Section("Observations and Insights", observations.render),
    Section("Reproduction Guide", reproduction.render),
    Section("Appendix", appendix.render),
)
SECTION_TITLES = tuple(s.title for s in SECTIONS if not s.optional)  # the headings every report has


def report_inputs(results) -> tuple[str, ...]:
    """The inputs as the report lists them (as given on the command line)."""
    return tuple(str(p) for p in results.inputs.paths)


def report_title(c: Context) -> str:
    """The report's title line: the trace's label, the number of traces, or the inputs' names."""
    runs = c.results.runs
    if runs:
        name = label(runs[0]) if len(runs) == 1 else f"{len(runs)} traces"
    else:
        name = ", ".join(p.rstrip("/").split("/")[-1] for p in c.inputs) or "inputs"
    return f"# {TITLE_PREFIX} {name}"


LEFT_OUT = "Sections left out"  # the line `tracestory check` reads (render.checklist)


def _declare_left_out(lines: list[str], titles: list[str]) -> list[str]:
    """The Executive Summary's ``lines`` ending with the line that names the sections left out of
    this report: a reader (and ``tracestory check``) then knows they are absent on purpose."""
    while lines and not lines[-1].strip():
        lines.pop()
    return lines + ["", f"**{LEFT_OUT}** (nothing in these inputs for them): {', '.join(titles)}.", ""]


def render_report(results, *, plots: Sequence[Path] = ()) -> str:
    """The whole report of ``results`` (:class:`~tracestory.analysis.results.Results`) as
    Markdown text (ends with one newline). ``plots``: PNG files written beside the report,
    linked from Visualizations. Without a timeline trace, each section says what it lacks."""
    ctx = Context(results, report_inputs(results), tuple(plots))
    bodies = [(sec, sec.render(ctx)) for sec in SECTIONS]
    # a section every report has, left out: nothing in these inputs for it (an optional one is just absent)
    left_out = [sec.title for sec, body in bodies if body is None and not sec.optional]
    out = [report_title(ctx), ""]
    for sec, body in bodies:
        if body is None:
            continue
        if sec is SECTIONS[0] and left_out:  # the Executive Summary
            body = _declare_left_out(list(body), left_out)
        out += [f"## {sec.title}", ""] + body
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
