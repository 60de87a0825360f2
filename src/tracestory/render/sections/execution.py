"""Execution Story: the serving run's continuous-batching story (when a scheduler log was
given), then each trace's phase-by-phase story."""

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
        out += [demote(render_batch_story(r.batching).strip(), 1) + ("\n\n### Kernel timeline" if r.runs else ""), ""]
    shown = c.shown
    for run in shown:
        if len(r.runs) > 1:
            out += [f"### {label(run)}", ""]
        out += fence(execution_story(run.story)) + [""]
        subs = run.analysis.phases.subphases
        if subs:
            out += ["Inside the phases (the outermost nested ranges, kernels launched in them on the same thread):", ""]
            out += [
                f"- `{s.name}` x{s.count}: {s.kernel_count} kernels, {fmt_ns(s.kernel_time_ns)} of kernel time"
                for s in subs[:8]
            ] + [""]
    return out
