"""Reproduction Guide: the capture manifest's steps, else the commands that regenerate this report."""

from __future__ import annotations

from ..manifest_sections import render_reproduction
from ..md import fence
from . import Context


def _reproduction(inputs, command, recapture) -> list[str]:
    ins = " ".join(inputs) if inputs else "TRACE.json.gz"
    return [
        f"To regenerate this report from the same {'trace' if len(inputs) <= 1 else 'traces'}:",
        "",
        *fence([command or f"tracestory report {ins} -o report.md"], "bash"),
        "",
        "To get the numbers behind it as JSON:",
        "",
        *fence([f"tracestory analyze {ins} --json results.json"], "bash"),
        "",
        *([f"To re-capture: {recapture}", ""] if recapture else []),
    ]


def _serving_reproduction(inputs, command) -> list[str]:
    ins = " ".join(inputs)
    return [
        "To regenerate this report (add `--plots` for the PNGs, `--html` for one page):",
        "",
        *fence([command or f"tracestory report {ins} -o report.md"], "bash"),
        "",
        "To capture the same kind of run with a trace of some iterations (the sections left out here need one):",
        "",
        *fence(
            [
                'tracestory capture torch --name serve --load "--model MODEL --request-rate 12 --duration 15" \\',
                "  --range iteration --skip 200 --count 8 -- tracestory serve --port 8000",
            ],
            "bash",
        ),
        "",
    ]


def render(c: Context) -> list[str] | None:
    m = c.results.manifest
    if m:
        return [render_reproduction(m).strip(), ""]
    if c.serving_only:
        return _serving_reproduction(list(c.inputs), c.command)
    if c.no_trace:
        return [c.no_trace, ""]
    runs = c.results.runs
    return _reproduction(list(c.inputs), c.command, runs[0].recapture if runs else None)
