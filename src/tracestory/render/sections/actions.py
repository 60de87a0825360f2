"""Actions Log: the capture manifest's commands, else the command that made this report."""

from __future__ import annotations

from ..manifest_sections import render_actions_log
from ..md import fence
from . import Context


def render(c: Context) -> list[str] | None:
    m = c.results.manifest
    if m:
        return [render_actions_log(m).strip(), ""]
    if c.serving_only:
        return None
    if c.no_trace:
        return [c.no_trace, ""]
    return [
        f"tracestory read the input {'trace' if len(c.inputs) == 1 else 'traces'} and ran no capture of its own; "
        "the capture's own actions log is n/a (no capture manifest given).",
        "",
        *fence([c.command or "n/a (not given)"], "bash"),
        "",
    ]
