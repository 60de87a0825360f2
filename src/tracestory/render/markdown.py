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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .batch_story import render_batch_story
from .hardware import hardware_section
from .manifest_sections import render_actions_log, render_environment, render_reproduction
from .md import demote, fence, label
from .sections import (Context, actions, appendix, codebase, environment, execution, goal, hardware,
                       observations, reproduction, summary, visualizations)
from .sections.observations import _observations, _surprises
from .sections.summary import _batch_summary

TITLE_PREFIX = "Hands-On Learning Report:"


@dataclass(frozen=True)
class Section:
    """One heading of the report and the function that writes its body (a list of lines)."""

    title: str
    render: Callable[[Context], list[str]]


SECTIONS: tuple[Section, ...] = (
    Section("Executive Summary", summary.render),
    Section("Environment", environment.render),
    Section("Codebase Analysis Summary", codebase.render),
    Section("Goal Interpretation", goal.render),
    Section("Actions Log", actions.render),
    Section("Execution Story", execution.render),
    Section("Visualizations", visualizations.render),
    Section("Hardware Behavior Analysis", hardware.render),
    Section("Observations and Insights", observations.render),
    Section("Reproduction Guide", reproduction.render),
    Section("Appendix", appendix.render),
)
SECTION_TITLES = tuple(s.title for s in SECTIONS)


def report_inputs(results) -> tuple[str, ...]:
    """The inputs as the report lists them (as given on the command line)."""
    return tuple(str(p) for p in results.inputs.paths)


def render_report(results, *, plots: Sequence[Path] = ()) -> str:
    """The whole report of ``results`` (:class:`~tracestory.analysis.results.Results`) as
    Markdown text (ends with one newline). ``plots``: PNG files written beside the report,
    linked from Visualizations."""
    ctx = Context(results, report_inputs(results), tuple(plots))
    if not results.runs:
        return _render_without_traces(ctx)
    name = label(results.runs[0]) if len(results.runs) == 1 else f"{len(results.runs)} traces"
    out = [f"# {TITLE_PREFIX} {name}", ""]
    for sec in SECTIONS:
        out += [f"## {sec.title}", ""] + sec.render(ctx)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def _render_without_traces(c: Context) -> str:
    """A report for inputs that hold no timeline trace (an Nsight Compute capture alone, or a
    scheduler event log): the sections that need a trace say so; Observations hold the hardware
    findings of the kernel metrics."""
    r = c.results
    inputs = list(c.inputs)
    missing = "n/a: the inputs hold no timeline trace (Kineto or Nsight Systems), only per-kernel metrics."
    name = ", ".join(p.rstrip("/").split("/")[-1] for p in inputs) or "inputs"
    hw = hardware_section(r.hardware).strip() if r.hardware else ""
    fs = r.ncu_findings
    summary = ("Per-kernel hardware metrics only (no timeline); the key numbers are in Hardware Behavior "
               "Analysis. Add a torch.profiler or nsys capture of the same run for the execution story."
               if hw else missing)
    key = [f for f in fs if f.severity in ("high", "medium")][:2] or list(fs[:1])
    if key:
        summary += " Key insight: " + "; ".join(f.title for f in key) + f". Recommendation: {key[0].recommendation}"
    extra = {"Hardware Behavior Analysis": hw}
    if r.manifest:
        extra["Environment"] = render_environment(r.manifest)
        extra["Actions Log"] = render_actions_log(r.manifest)
        extra["Reproduction Guide"] = render_reproduction(r.manifest)
    if r.batching is not None:
        summary = _batch_summary(r.batching)
        missing = "n/a: the inputs hold a scheduler event log but no timeline trace (Kineto or Nsight Systems)."
        extra["Execution Story"] = demote(render_batch_story(r.batching).strip(), 1)
    out = [f"# {TITLE_PREFIX} {name}", ""]
    for title in SECTION_TITLES:
        out += [f"## {title}", ""]
        if title == "Executive Summary":
            out += [summary, ""]
        elif title == "Observations and Insights" and fs:
            out += _surprises([fs], None) + _observations([fs], [None])
        elif title == "Visualizations" and r.batching is not None:
            out += ["The charts of this serving run (KV cache blocks and device memory over time) are in the "
                    "Execution Story. Kernel timeline, breakdown and roofline: n/a (no trace; capture the "
                    "server with `tracestory capture ... --load` to add one).", "",
                    "Interactive exploration: add a Kineto or nsys trace of the run and open it with "
                    "`tracestory export perfetto` in https://ui.perfetto.dev.", ""]
        elif title == "Visualizations" and hw:
            out += [missing.replace("n/a:", "Timeline: n/a:"), "",
                    "Interactive exploration: open the .ncu-rep in the Nsight Compute UI (ncu-ui) for the "
                    "source-level and per-section views behind these numbers.", ""]
        elif extra.get(title, "").strip():
            out += [extra[title].strip(), ""]
        elif title == "Appendix":
            out += ["**Inputs**", "", *[f"- `{p}`" for p in inputs], "", "**Command**", "",
                    *fence([c.command or "n/a (not given)"], "bash"), ""]
        else:
            out += [missing, ""]
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
