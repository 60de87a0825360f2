"""Named result tables (:class:`~tracestory.analysis.tables.Table`) as text: CSV, Markdown, JSON
records, or a rich table for the terminal.

CSV, Markdown and JSON keep base units (``total_ns`` in ns, ``share`` 0..1) and full precision,
for a program to read; JSON is a list of one object per row, missing values ``null``. The
terminal view picks units per column by its name: ``*_ns`` through ``fmt_ns``, ``share``
through ``fmt_pct``, other floats with 4 significant digits.
"""

from __future__ import annotations

import io
import json
import math

from rich.table import Table as RichTable

from ..units import clip_text, fmt_ns, fmt_pct, sig

FORMATS = ("table", "csv", "json", "markdown")
TEXT_WIDTH = 32   # terminal columns of a text cell (names, shapes); the other formats keep it whole


def _value(v):
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


def table_records(table) -> list[dict]:
    """One dict per row, the column names as keys (None where missing)."""
    cols = list(table.columns)
    return [{c: _value(v) for c, v in zip(cols, row)} for row in table.rows()]


def table_text(table, fmt: str) -> str:
    """``table`` as ``csv``, ``markdown`` or ``json`` text."""
    if fmt == "csv":
        buf = io.StringIO()
        table.to_csv(buf)
        return buf.getvalue()
    if fmt == "markdown":
        return table.to_markdown()
    if fmt == "json":
        return json.dumps(table_records(table), indent=1) + "\n"
    raise ValueError(f"no text format {fmt!r}")


def _cell(column: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if column.endswith("_ns"):
        return fmt_ns(v)
    if column == "share":
        return fmt_pct(v)
    if isinstance(v, float):
        return sig(v, 4)
    if isinstance(v, int):
        return f"{v:,}"
    return clip_text(str(v), 60)


def table_renderable(table, title: str | None = None) -> RichTable:
    """A rich table of ``table`` with units chosen per column (module docstring)."""
    tab = RichTable(title=title or table.name, title_justify="left")
    cols = list(table.columns)
    rows = table.rows()
    for i, c in enumerate(cols):
        text = any(isinstance(r[i], str) for r in rows[:50])
        tab.add_column(c, justify="left" if text else "right", no_wrap=True, overflow="ellipsis",
                       max_width=TEXT_WIDTH if text else None, min_width=min(len(c), TEXT_WIDTH))
    for row in rows:
        tab.add_row(*(_cell(c, v) for c, v in zip(cols, row)))
    return tab
