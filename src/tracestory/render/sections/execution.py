"""Execution Story: the serving run's continuous-batching story (when a scheduler log was
given), then each trace's phase-by-phase story; none for an input without per-op times (a
summary table), whose op order would be an artefact of the reader."""

from __future__ import annotations

from ...units import fmt_ns
from ..batch_story import render_batch_story
from ..md import demote, fence, label
from ..story import execution_story
from . import Context


def render(c: Context) -> list[str]:
    r = c.results
    if c.no_trace and r.batching is None:
        return [c.no_trace, ""]
    out = []
    if r.batching is not None:
        out += [
            demote(render_batch_story(r.batching, c.plots).strip(), 1) + ("\n\n### Kernel timeline" if r.runs else ""),
            "",
        ]
    shown = c.shown
    for run in shown:
        if len(r.runs) > 1:
            out += [f"### {label(run)}", ""]
        if run.facts.kind.kind == "summary_only":  # per-name totals: any order of their ops would be made up
            out += [
                "n/a: the input holds totals per kernel name, not per-op start times, so there is no order of "
                "execution to tell; the totals are in the Visualizations and Observations.",
                "",
            ]
            continue
        out += fence(execution_story(run.story)) + [""]
        subs = run.analysis.phases.subphases
        if subs:
            out += ["Inside the phases (the outermost nested ranges, kernels launched in them on the same thread):", ""]
            out += [
                f"- `{s.name}` x{s.count}: {s.kernel_count} kernels, {fmt_ns(s.kernel_time_ns)} of kernel time"
                for s in subs[:8]
            ] + [""]
    return out
