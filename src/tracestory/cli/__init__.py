"""The ``tracestory`` command: parse, call the library, render. No analysis logic lives here.

Library errors (:class:`~tracestory.errors.TracestoryError`) become one line on stderr and
exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import outputs
from ..version import __version__
from ..errors import TracestoryError, UsageError
from ..ingest import load_inputs
from .common import (add_analysis_options, add_taxonomy, load_and_analyze, progress_factory, refuse_overwrite,
                     taxonomy_from)
from ..render import jsonout, terminal
from ..render.build import write_report
from ..render.html import write_html
from ..analysis.results import AnalysisOptions, analyze_inputs
from ..analysis.breakdown import breakdown
from ..analysis.categories import classify
from ..render.category_table import category_table, category_table_text
from . import bench, capture, check, compare, eval, export, loadgen, ranks, serve


HTML_BESIDE = "beside"   # --html with no value: the .md's name with .html


# --------------------------------------------------------------------------- commands
def cmd_analyze(args) -> int:
    from rich.console import Console


    results = load_and_analyze(args, args.json)
    if not results.runs and not results.hardware:
        raise UsageError(f"{results.inputs.paths[0]}: analyze prints trace and kernel-metric tables; a scheduler "
                         "event log alone is told by `tracestory report`")
    # Piped output gets a fixed width wide enough for the tables (rich would pick 80).
    console = Console(width=None if sys.stdout.isatty() else 120)
    for a in results.analyses:
        for renderable in terminal.analysis_renderables(a):
            console.print(renderable)
    if results.hardware:
        console.print(terminal.hardware_table(jsonout.kernel_rows(results.hardware)))
    if args.json:
        Path(args.json).write_text(json.dumps(jsonout.document(results), indent=1) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def cmd_report(args) -> int:
    html = None if args.html in (None, HTML_BESIDE) else args.html
    results = load_and_analyze(args, args.json, args.output, html, goal=args.goal, questions=tuple(args.question or ()),
                               command="tracestory " + " ".join(sys.argv[1:]))
    written: list = []
    out = write_report(results, args.output, plots=args.plots, json_path=args.json, written=written)
    for path in written:   # every file written, the report first
        print(path)
    if args.html:
        if outputs.is_stdout(args.output):
            raise UsageError("--html renders the written Markdown report: give -o a file, not -")
        html = out.with_suffix(".html") if args.html == HTML_BESIDE else args.html
        written = write_html(out, html)
        if not outputs.is_stdout(html):
            print(written)
    return 0


DEMO_TRACE = "llama2layer_eager_decode.trace.json.gz"
DEMO_GOAL = "Understand where GPU time goes in Llama prefill and decode on the H200, and what to optimize first."


def cmd_demo(args) -> int:
    """Report on the bundled H200 Llama trace into ``DIR/report.md`` (+ analysis.json and report.html)."""
    from importlib import resources


    trace = Path(str(resources.files("tracestory") / "data" / "demo" / DEMO_TRACE))
    results = analyze_inputs(load_inputs([trace]), AnalysisOptions(goal=DEMO_GOAL, command="tracestory demo"))
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = write_report(results, out_dir / "report.md", json_path=out_dir / "analysis.json")
    write_html(out, out_dir / "report.html")
    print(out)
    return 0


def cmd_categories(args) -> int:
    source = args.input or args.input_flag
    if not source:
        raise UsageError("categories: give the input trace (tracestory categories INPUT [-o OUT])")
    plan = refuse_overwrite([source], args.output)
    inputs = load_inputs([source], progress_factory=progress_factory())
    if not inputs.traces:
        raise UsageError(f"{source}: no GPU trace in this input")
    tax = taxonomy_from(args)
    # every name of every category in each breakdown, so the sample names are ranked exactly
    bds = [breakdown(t, classify(t, tax), top=len(t.kernels) + len(t.memops)) for t in inputs.traces]
    result = category_table(bds, inputs.traces, tax)
    to_stdout = outputs.is_stdout(args.output)
    print(category_table_text(result), file=sys.stderr if to_stdout else sys.stdout)
    if args.output:
        plan.write_text(args.output, json.dumps(result, indent=1) + "\n")
        if not to_stdout:
            print(f"wrote {args.output}")
    return 0


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracestory", description="GPU traces in, the story of the execution out.")
    parser.add_argument("--version", action="version", version=f"tracestory {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("analyze", help="tables of the breakdown, timeline and phases (and --json)")
    add_analysis_options(p)
    p.add_argument("--json", metavar="OUT", help="write all results as JSON (schema: docs/JSON.md)")
    p.set_defaults(func=cmd_analyze)

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

    p = sub.add_parser("demo", help="report on the bundled H200 Llama trace; prints the report path")
    p.add_argument("--output-dir", default="tracestory-demo", help="folder to write (default: tracestory-demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("categories", help="kernel-category table: GPU time per category and the Amdahl ceiling of "
                                          "the expert GEMMs (and --output JSON)")
    p.add_argument("input", nargs="?", metavar="INPUT", help=".nsys-rep, .sqlite, nsys CSV or Kineto trace")
    p.add_argument("--input", dest="input_flag", metavar="INPUT", help=argparse.SUPPRESS)  # older spelling
    p.add_argument("-o", "--output", help="JSON output path (- for standard output; the table then goes to stderr)")
    add_taxonomy(p)
    p.set_defaults(func=cmd_categories)

    for module in _command_modules():
        module.register(sub)
    return parser


def _command_modules():
    """Subcommands that live in their own modules of this package, in help order."""

    return (check, compare, export, ranks, capture, bench, eval, serve, loadgen)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TracestoryError as e:
        print(f"tracestory: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tracestory: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
