"""Markdown building blocks every part of the report shares (a leaf: it imports no renderer).

Tables escape pipes; fences default to ``text``; :func:`demote` pushes headings down to embed one
document in another (outside code fences); :func:`fmt_evidence` prints a finding's evidence by
its unit (``tracestory.units`` chooses the unit).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..analysis.findings.base import Evidence
from ..units import clip_text, fmt_bytes, fmt_ns, fmt_pct, short_name  # noqa: F401  (short_name re-exported)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> list[str]:
    """A pipe table; ``align`` is one char per column (``l`` or ``r``). Pipes in cells escaped."""
    align = align or "l" * len(headers)

    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join(" ---: " if a == "r" else " --- " for a in align) + "|",
    ]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return out


def fence(lines: Sequence[str], lang: str = "text") -> list[str]:
    return [f"```{lang}", *lines, "```"]


def demote(markdown: str, levels: int) -> str:
    """Headings one or more levels deeper (outside code fences), to embed a document."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,5} ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def fmt_evidence(e: Evidence) -> str:
    v = e.value
    if v is None:
        return "n/a"
    if isinstance(v, str):  # a name or a sentence: no unit applies
        return f"`{short_name(v, 70)}`" if e.unit == "text" else v
    if e.unit == "ns":
        return fmt_ns(v)
    if e.unit == "ns_per_step":
        return f"{fmt_ns(v)} per step"
    if e.unit == "fraction":
        return fmt_pct(v)
    if e.unit == "x":
        return f"{v:.2f}x"
    if e.unit == "per_ms":
        return f"{v:.2f} per ms"
    if e.unit == "bytes":
        return fmt_bytes(v)
    if e.unit == "ratio":
        return f"{v:.2f}"
    if e.unit == "count":
        return f"{int(v)}"
    return f"`{short_name(str(v), 70)}`" if e.unit == "text" else str(v)


def label(a) -> str:
    """The trace's label, of an Analysis or a RunResults."""
    return a.trace.label
