"""Reproduction Guide: the capture manifest's steps, else the commands that regenerate this report."""

from __future__ import annotations

from ..manifest_sections import render_reproduction
from ..md import fence
from . import Context


def _reproduction(inputs, command) -> list[str]:
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
        "To re-capture: run the workload under `torch.profiler.profile(activities=[CPU, CUDA], "
        "record_shapes=True, profile_memory=True)` with `record_function` ranges around each "
        "phase (or a `schedule` so each iteration is a `ProfilerStep`), then "
        "`prof.export_chrome_trace(...)`.",
        "",
    ]


def render(c: Context) -> list[str]:
    m = c.results.manifest
    if m:
        return [render_reproduction(m).strip(), ""]
    return [c.no_trace, ""] if c.no_trace else _reproduction(list(c.inputs), c.command)
