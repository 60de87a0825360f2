"""Named result tables (:class:`~tracestory.analysis.tables.Table`) as text: CSV, Markdown, JSON
records, or a rich table for the terminal.

A table the input cannot give (``Table.missing``: ``osrt_sum`` of an export captured without
``--trace=osrt``) is one line saying why in the terminal and in Markdown; CSV and JSON of it
are refused by the command (one line, exit 2), never an empty table that reads as zero.

CSV, Markdown and JSON keep base units (``total_ns`` in ns, ``share`` 0..1) and full precision,
for a program to read; JSON is a list of one object per row, missing values ``null``. The
terminal view picks units per column by its name: ``*_ns`` through ``fmt_ns``, ``share``
through ``fmt_pct``, ``*_bytes_per_s`` in GB/s, other floats with 4 significant digits. When the columns do not fit the
terminal's width, the least important ones are left out and the caption names them: the first
column (the row's name), ``total_ns``, ``share`` and the bandwidths are kept first, then the others from the
left; ``--format csv`` or ``json`` has every column.
"""

from __future__ import annotations

import io
import json
import math

from rich.table import Table as RichTable
from rich.text import Text

from ..units import clip_text, fmt_gbps, fmt_ns, fmt_pct, fmt_si, sig

FORMATS = ("table", "csv", "json", "markdown")
TEXT_WIDTH = 32  # terminal columns of a text cell (names, shapes); the other formats keep it whole


def _value(v):
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


def table_records(table) -> list[dict]:
    """One dict per row, the column names as keys (None where missing)."""
    cols = list(table.columns)
    return [{c: _value(v) for c, v in zip(cols, row, strict=False)} for row in table.rows()]


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
    if column.endswith("_bytes_per_s"):
        return fmt_gbps(v)
    if column.endswith("flops_per_s"):
        return fmt_si(v, "FLOP/s")
    if column == "fraction_of_roof":
        return fmt_pct(v)
    if isinstance(v, float):
        return sig(v, 4)
    if isinstance(v, int):
        return f"{v:,}"
    return clip_text(str(v), 60)


# after the first column, the columns a narrow terminal keeps
KEEP_FIRST = ("total_ns", "share", "algbw_bytes_per_s", "busbw_bytes_per_s", "fraction_of_roof", "bound")
BORDER = 3  # a rich column's padding and rule, in terminal columns


def _fitting_columns(cols: list[str], widths: list[int], width: int | None) -> list[int]:
    """Indices of the columns to show in ``width`` terminal columns (all when ``width`` is None):
    the first column, then :data:`KEEP_FIRST`, then the rest from the left, while they fit."""
    if width is None:
        return list(range(len(cols)))
    order = [0] + [i for i, c in enumerate(cols) if c in KEEP_FIRST and i]
    order += [i for i in range(1, len(cols)) if i not in order]
    shown: list[int] = []
    used = 1
    for i in order:
        if shown and used + widths[i] + BORDER > width:
            continue
        shown.append(i)
        used += widths[i] + BORDER
    return sorted(shown)


def table_renderable(table, title: str | None = None, width: int | None = None) -> RichTable | Text:
    """A rich table of ``table`` with units chosen per column, fitted to ``width`` terminal
    columns when given (module docstring); a table the input cannot give is one line saying why."""
    if table.missing is not None:
        return Text(f"{title or table.name}: {table.missing}")
    cols = list(table.columns)
    rows = table.rows()
    cells = [[_cell(c, v) for c, v in zip(cols, row, strict=False)] for row in rows]
    is_text = [any(isinstance(r[i], str) for r in rows[:50]) for i in range(len(cols))]
    widths = [
        max([len(c)] + [min(len(r[i]), TEXT_WIDTH if is_text[i] else 10**6) for r in cells]) for i, c in enumerate(cols)
    ]
    shown = _fitting_columns(cols, widths, width)
    left_out = [cols[i] for i in range(len(cols)) if i not in shown]
    caption = f"left out for width: {', '.join(left_out)} (--format csv or json has every column)" if left_out else None
    if table.note:
        caption = f"{table.note}\n{caption}" if caption else table.note
    tab = RichTable(title=title or table.name, title_justify="left", caption=caption, caption_justify="left")
    for i in shown:
        tab.add_column(
            cols[i],
            justify="left" if is_text[i] else "right",
            no_wrap=True,
            overflow="ellipsis",
            max_width=TEXT_WIDTH if is_text[i] else None,
            min_width=min(len(cols[i]), TEXT_WIDTH),
        )
    for r in cells:
        tab.add_row(*(r[i] for i in shown))
    return tab
