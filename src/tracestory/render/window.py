"""The part of the trace a report describes (:class:`~tracestory.analysis.window.WindowSelection`):
one Executive Summary line and the JSON ``window`` key. Nothing here when the whole trace is
analysed."""

from __future__ import annotations

from ..units import fmt_ms, fmt_ns
from .jsonable import jsonable

MAX_TRACES = 4  # more traces (ranks): the first two are told, the rest are in the JSON


def _steps(tw) -> str:
    if not tw.steps_kept:
        return ""
    kept = tw.steps_kept
    text = f"; steps kept: {kept[0]}" + (f" .. {kept[-1]} ({len(kept)})" if len(kept) > 1 else "")
    if tw.steps_dropped:
        text += "; dropped: " + ", ".join(f"{name} ({why})" for name, why in tw.steps_dropped)
    return text


def window_lines(sel) -> list[str]:
    """One Markdown paragraph: the request, its rule, and per trace the span kept (ms from the
    trace start), the steps kept and dropped and the kernels kept."""
    if sel is None:
        return []
    parts = []
    shown = sel.traces if len(sel.traces) <= MAX_TRACES else sel.traces[:2]
    for tw in shown:
        parts.append(
            f"{tw.trace}: {fmt_ms(tw.start_offset_ns)} .. {fmt_ms(tw.end_offset_ns)} ms from the trace start "
            f"({fmt_ns(tw.span_ns)}), {tw.kernels_kept} of {tw.kernels_total} kernels" + _steps(tw)
        )
    if len(shown) < len(sel.traces):
        parts.append(
            f"and {len(sel.traces) - len(shown)} more traces (each one's window is in the JSON's `window` key)"
        )
    text = f"**Part of the trace described** (`{sel.request}`): {sel.rule}. " + "; ".join(parts) + "."
    if sel.not_restricted:
        text += f" Not restricted: the {', the '.join(sel.not_restricted)}."
    return [text, ""]


def window_json(sel) -> dict | None:
    """The ``window`` key: request, rule, per trace start/end ns (CPU and GPU intervals), steps kept
    and dropped (with why), kernels kept; None for the whole trace."""
    if sel is None:
        return None
    doc = jsonable(sel)
    for tw in doc["traces"]:
        tw["steps_dropped"] = [{"step": n, "why": w} for n, w in tw["steps_dropped"]]
    return doc
