"""``tracestory analyze``: terminal tables of the breakdown, timeline and phases, one named table
(``--table``) as CSV/JSON/Markdown, or all results as JSON (``--json``). Parses, reads the inputs
(``load_inputs``), computes the results once (``analyze_inputs``) and renders with the terminal,
table and JSON renderers only (the report's Markdown, HTML and plots are not imported); every
output is checked against every input first and written through :mod:`tracestory.outputs`.
"""

from __future__ import annotations

import io
import json
import sys

from ..errors import UsageError
from ..ingest import load_inputs
from ..outputs import OutputPlan, is_stdout
from .common import add_analysis_options, options_from, progress_factory, side_inputs
from ..render.window import window_lines
from ..analysis.table_names import TABLES
from ..render import jsonout, terminal
from ..render.tables_out import FORMATS, table_renderable, table_text
from ..analysis.results import analyze_inputs


def cmd_analyze(args) -> int:
    """Terminal tables (default), one named table (``--table``) as table/CSV/JSON/Markdown, or
    the whole JSON document; ``-o`` and ``--json`` take ``-`` for stdout. Outputs are checked
    against the inputs before anything is read."""
    from rich.console import Console

    plan = OutputPlan(inputs=[*args.inputs, *side_inputs(args)])
    fmt, name, out = args.format, args.table, args.output
    if fmt == "csv" and name is None:
        raise UsageError(f"--format csv writes one table: add --table {'|'.join(TABLES)}")
    if args.json is not None and is_stdout(args.json) and is_stdout(out) and fmt != "table":
        raise UsageError(f"--json - and the --format {fmt} output both want stdout: give one of them a file (-o FILE)")
    if args.json is not None:
        plan.check(args.json, "JSON")
    if not (fmt == "table" and is_stdout(out) and args.json is not None and is_stdout(args.json)):
        plan.check(out, f"--format {fmt} output")   # (terminal tables with --json -: to stderr)
    options = options_from(args)
    results = analyze_inputs(load_inputs(args.inputs, progress_factory=progress_factory()), options)
    if not results.runs and not results.hardware:
        raise UsageError(f"{results.inputs.paths[0]}: analyze prints trace and kernel-metric tables; a scheduler "
                         "event log alone is told by `tracestory report`")
    if (name is not None or fmt == "markdown") and not results.runs:
        what = f"--table {name}" if name else "--format markdown"
        raise UsageError(f"{results.inputs.paths[0]}: {what} needs a trace (Kineto or Nsight Systems); "
                         "these inputs hold only kernel metrics")
    json_on_stdout = args.json is not None and is_stdout(args.json)
    data_on_stdout = json_on_stdout or (is_stdout(out) and fmt != "table")
    status = sys.stderr if data_on_stdout else sys.stdout   # "wrote FILE" lines never mix with data

    if fmt == "table":
        # rich tables: to stdout, to stderr when stdout carries the JSON, or to a file
        buf = io.StringIO() if not is_stdout(out) else None
        console = Console(file=buf, width=120, color_system=None) if buf is not None else \
            Console(stderr=json_on_stdout, width=None if sys.stdout.isatty() else 120)
        if results.inputs.window is not None:   # which part of the traces the tables describe
            from rich.text import Text
            console.print(Text(window_lines(results.inputs.window)[0].replace("**", "").replace("`", "")))
        if name is None:
            for a in results.analyses:
                for renderable in terminal.analysis_renderables(a):
                    console.print(renderable)
            if results.hardware:
                console.print(terminal.hardware_table(jsonout.kernel_rows(results.hardware)))
        else:
            for i, run in enumerate(results.runs):
                console.print(table_renderable(results.table(name, i), f"{name} — {run.trace.label}", console.width))
        if buf is not None:
            plan.write_text(out, buf.getvalue(), f"--format {fmt} output")
    elif fmt == "json" and name is None:
        plan.write_text(out, json.dumps(jsonout.document(results), indent=1) + "\n", f"--format {fmt} output")
    elif name is None:   # markdown: every table of every trace
        parts = []
        for i, run in enumerate(results.runs):
            for t in TABLES:
                parts += [f"## {t} — {run.trace.label}", "", table_text(results.table(t, i), "markdown")]
        plan.write_text(out, "\n".join(parts), f"--format {fmt} output")
    else:
        tab = results.table(name, None if len(results.runs) > 1 else 0)
        if tab.missing is not None and fmt in ("csv", "json"):
            raise UsageError(f"{results.inputs.paths[0]}: --table {name}: {tab.missing}")
        plan.write_text(out, table_text(tab, fmt), f"--format {fmt} output")
    if not is_stdout(out):
        print(f"wrote {out}", file=status)
    if args.json is not None:
        plan.write_text(args.json, json.dumps(jsonout.document(results), indent=1) + "\n", "JSON")
        if not json_on_stdout:
            print(f"wrote {args.json}", file=status)
    return 0


# --------------------------------------------------------------------------- parser
def register(sub) -> None:
    """Add ``analyze`` to the top-level subparsers."""
    p = sub.add_parser("analyze", help="tables of the breakdown, timeline and phases; one named table as "
                                       "CSV/JSON/Markdown (--table, --format); all results as JSON (--json)")
    add_analysis_options(p)
    p.add_argument("--table", choices=TABLES, metavar="NAME",
                   help=f"print one named table: {', '.join(TABLES)} (base units, unit in the column name; "
                        "several traces: a trace column first)")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table (terminal, default), csv (needs --table), json (without --table: all results), "
                        "markdown (without --table: every table)")
    p.add_argument("-o", "--output", default="-", metavar="FILE", help="where the --format output goes (default: - for stdout)")
    p.add_argument("--json", metavar="OUT", help="also write all results as JSON (schema: docs/JSON.md); - for stdout, "
                                                 "the terminal tables then go to stderr")
    p.set_defaults(func=cmd_analyze)
