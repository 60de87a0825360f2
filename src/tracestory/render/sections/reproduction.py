"""Reproduction Guide: the capture manifest's steps, else the commands that regenerate this report."""

from __future__ import annotations

from ..manifest_sections import render_reproduction
from ..md import fence
from . import Context


def _reproduction(inputs, command, recapture) -> list[str]:
    ins = " ".join(inputs) if inputs else "TRACE.json.gz"
    return [
        "To regenerate this report from the same trace(s):",
        "",
        *fence([command or f"tracestory report {ins} -o report.md"], "bash"),
        "",
        "To get the numbers behind it as JSON:",
        "",
        *fence([f"tracestory analyze {ins} --json results.json"], "bash"),
        "",
        *([f"To re-capture: {recapture}", ""] if recapture else []),
    ]


def render(c: Context) -> list[str]:
    m = c.results.manifest
    if m:
        return [render_reproduction(m).strip(), ""]
    if c.no_trace:
        return [c.no_trace, ""]
    runs = c.results.runs
    return _reproduction(list(c.inputs), c.command, runs[0].recapture if runs else None)
