"""The commands that tell traces as a report: ``report`` (the Markdown story, with its JSON, HTML
page and plots), ``demo`` (the report of the bundled H200 trace) and ``categories`` (the
kernel-category table); ``analyze`` lives in :mod:`.analyze`, so that it does not import the
report's renderers. Each parses, reads the inputs (``load_inputs``), computes the results once
(``analyze_inputs``) and renders; every output is checked against every input first and written
through :mod:`tracestory.outputs`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import outputs
from ..errors import UsageError
from ..ingest import load_inputs
from ..outputs import OutputPlan
from .common import (add_analysis_options, add_taxonomy, load_and_analyze, progress_factory,
                     refuse_overwrite, side_inputs, taxonomy_from)
from ..render.build import write_report
from ..render.html import write_html
from ..analysis.results import AnalysisOptions, analyze_inputs
from ..analysis.category_totals import category_totals
from ..render.category_table import category_table, category_table_text


HTML_BESIDE = "beside"   # --html with no value: the .md's name with .html


def cmd_report(args) -> int:
    """The Markdown report (``-o``), and when asked its JSON (``--json``), HTML page (``--html``)
    and PNG plots: checked against every input and each other first, written all or nothing
    (:func:`~tracestory.outputs.all_or_nothing`); the paths written are printed afterwards, on
    stderr when an output is ``-``."""
    if args.html and outputs.is_stdout(args.output):
        raise UsageError("--html renders the written Markdown report: give -o a file, not -")
    if args.html is None:                  # --html "" is asked for, and refused with the other outputs
        html = None
    elif args.html == HTML_BESIDE:
        html = Path(args.output).with_suffix(".html") if args.output else None
    else:
        html = args.html
    results = load_and_analyze(args, ("-o", args.output), ("--json", args.json), ("--html", html),
                               goal=args.goal, questions=tuple(args.question or ()),
                               command="tracestory " + " ".join(sys.argv[1:]))
    written: list = []
    with outputs.all_or_nothing():
        out = write_report(results, args.output, plots=args.plots, json_path=args.json, written=written)
        if html is not None:
            write_html(outputs.staged(out), html, results)
            if not outputs.is_stdout(html):
                written.append(Path(html))
    status = outputs.status_stream(args.output, args.json, html)
    for path in written:   # every file written, the report first
        print(path, file=status)
    return 0


DEMO_TRACE = "llama2layer_eager_decode.trace.json.gz"
DEMO_GOAL = "Understand where GPU time goes in Llama prefill and decode on the H200, and what to optimize first."


def cmd_demo(args) -> int:
    """Report on the bundled H200 Llama trace into ``DIR/report.md`` (+ analysis.json and report.html)."""
    from importlib import resources


    trace = Path(str(resources.files("tracestory") / "data" / "demo" / DEMO_TRACE))
    if not args.output_dir:                # Path("") is the current folder: not what "" asked for
        raise UsageError("--output-dir: expected a folder path, found an empty name")
    out_dir = Path(args.output_dir)
    names = ("report.md", "analysis.json", "report.html")
    plan = OutputPlan([trace])
    plan.check_folder(out_dir)
    for n in names:
        plan.check(out_dir / n, n)
    outputs.ensure_folder(out_dir)   # a file or /proc/...: one line
    results = analyze_inputs(load_inputs([trace]), AnalysisOptions(goal=DEMO_GOAL, command="tracestory demo"))
    with outputs.all_or_nothing():
        out = write_report(results, out_dir / names[0], json_path=out_dir / names[1])
        write_html(outputs.staged(out), out_dir / names[2], results)
    for path in (out, out_dir / names[1], out_dir / names[2]):   # every file written, the report first
        print(path)
    return 0


def cmd_categories(args) -> int:
    source = args.input or args.input_flag
    if not source:
        raise UsageError("categories: give the input trace (tracestory categories INPUT [-o OUT])")
    plan = refuse_overwrite([source, *side_inputs(args)], ("-o", args.output))
    inputs = load_inputs([source], progress_factory=progress_factory())
    if not inputs.traces:
        raise UsageError(f"{source}: no GPU trace in this input")
    result = category_table(category_totals(inputs.traces, taxonomy_from(args)))
    to_stdout = outputs.is_stdout(args.output)
    print(category_table_text(result), file=sys.stderr if to_stdout else sys.stdout)
    if args.output:
        plan.write_text(args.output, json.dumps(result, indent=1) + "\n", "-o")
        if not to_stdout:
            print(f"wrote {args.output}")
    return 0



# --------------------------------------------------------------------------- parsers
def register(sub) -> None:
    """Add ``report``, ``demo`` and ``categories`` to the top-level subparsers."""
    p = sub.add_parser("report", help="write the Markdown story report")
    add_analysis_options(p)
    p.add_argument("-o", "--output", default="report.md", help="report path (default: report.md)")
    p.add_argument("--goal", help="what the user wants to learn (Goal Interpretation)")
    p.add_argument("--question", action="append", help="a question the report must answer (repeatable)")
    p.add_argument("--plots", action="store_true", help="also write PNG plots next to the report (matplotlib)")
    p.add_argument("--json", metavar="OUT", help="also write all results as JSON")
    p.add_argument("--html", nargs="?", const=HTML_BESIDE, metavar="OUT",
                   help="also write the report as one self-contained HTML page (no value: next to the .md; "
                        "- for standard output)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="report on the bundled H200 Llama trace; prints the files it wrote "
                                    "(report.md, analysis.json, report.html)")
    p.add_argument("--output-dir", default="tracestory-demo", help="folder to write (default: tracestory-demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("categories", help="kernel-category table: GPU time per category and the Amdahl ceiling of "
                                          "the expert GEMMs (and --output JSON)")
    p.add_argument("input", nargs="?", metavar="INPUT", help=".nsys-rep, .sqlite, nsys CSV or Kineto trace")
    p.add_argument("--input", dest="input_flag", metavar="INPUT", help=argparse.SUPPRESS)  # older spelling
    p.add_argument("-o", "--output", help="JSON output path (- for standard output; the table then goes to stderr)")
    add_taxonomy(p)
    p.set_defaults(func=cmd_categories)
