"""The ``tracestory`` command: parse, call the library, render. No analysis logic lives here.

Library errors (:class:`~tracestory.errors.TracestoryError`) become one line on stderr and
exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..errors import TracestoryError, UsageError


# --------------------------------------------------------------------------- shared helpers
def _progress_factory(console):
    """A per-file progress callback that shows a bar only once a load has taken over a second."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    def factory(path: Path):
        t0 = time.monotonic()
        state = {"bar": None, "task": None}

        def update(done: int, total: int):
            if state["bar"] is None:
                if time.monotonic() - t0 < 1.0:
                    return
                bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                               TimeRemainingColumn(), console=console, transient=True)
                bar.start()
                state["bar"], state["task"] = bar, bar.add_task(f"reading {path.name}", total=total)
            state["bar"].update(state["task"], completed=done)
            if done >= total:
                state["bar"].stop()

        return update

    return factory


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _taxonomy(args):
    from ..analysis.categories import load_rules, taxonomy

    base = taxonomy(args.taxonomy)
    return load_rules(args.rules, base) if args.rules else base


def _refuse_overwriting_inputs(args, *outputs) -> None:
    """An output path that names an input file would destroy it: refuse before reading."""
    inputs = {Path(p).resolve() for p in args.inputs if Path(p).is_file()}
    for out in outputs:
        if out and Path(out).resolve() in inputs:
            raise UsageError(f"{out}: is one of the inputs; refusing to overwrite it with output")


def _split_serving_files(paths):
    """Scheduler event logs (``tracestory serve``'s JSONL, or any engine writing that format)
    and ``tracestory load --json`` summaries are read by the batch story, not the trace loaders."""
    from ..analysis.batching import is_scheduler_log
    from ..loadgen.stats import is_summary_file

    logs = [p for p in paths if Path(p).is_file() and is_scheduler_log(p)]
    summaries = [p for p in paths if p not in logs and Path(p).is_file() and is_summary_file(p)]
    return [p for p in paths if p not in logs and p not in summaries], logs, summaries


def _load_and_analyze(args, *, allow_logs: bool = False):
    from ..analysis import analyze
    from ..ingest import Inputs, load_inputs

    _refuse_overwriting_inputs(args, getattr(args, "json", None), getattr(args, "output", None))
    paths, logs, summaries = _split_serving_files(args.inputs) if allow_logs else (args.inputs, [], [])
    inputs = (load_inputs(paths, progress_factory=_progress_factory(_stderr_console())) if paths
              else Inputs())
    logs += inputs.scheduler_logs
    summaries += inputs.load_summaries
    for what, found in (("scheduler event log", logs), ("load summary", summaries)):
        if len(found) > 1:
            raise UsageError(f"{found[1]}: one {what} per report (found {len(found)}: {', '.join(found)})")
    if summaries and not logs:
        raise UsageError(f"{summaries[0]}: a load summary is reported with the scheduler event log of the same "
                         "run (`tracestory serve --event-log`), found none")
    if not inputs.traces and not inputs.kernel_metrics and not logs:
        raise UsageError("no trace or kernel metrics found in the inputs")
    tax = _taxonomy(args)
    analyses = [analyze(t, tax, k=args.speedup) for t in inputs.traces]
    if allow_logs:
        return inputs, analyses, logs, summaries
    return inputs, analyses


def _add_analysis_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="Kineto .json(.gz), nsys .sqlite/.nsys-rep/CSV, ncu .ncu-rep/CSV, or a folder")
    p.add_argument("--taxonomy", default="llm", choices=("llm", "moe"), help="kernel categories (default: llm)")
    p.add_argument("--rules", metavar="FILE", help="TOML file of category rules to add or replace")
    p.add_argument("-k", "--speedup", type=float, default=2.0, metavar="K",
                   help="what-if: speedup of one category for the Amdahl column (default: 2)")
    p.add_argument("--peaks", metavar="FILE", help="measured peak FLOP/s and bandwidth (TOML/JSON)")


def _hardware(inputs, analyses, args):
    """ncu inputs -> (JSON rows, markdown section body) or (None, None)."""
    if not inputs.kernel_metrics:
        return None, None
    from ..render.hardware_glue import hardware_results

    return hardware_results(inputs, analyses, peaks_path=args.peaks)


# --------------------------------------------------------------------------- commands
def cmd_analyze(args) -> int:
    from rich.console import Console

    from ..render import jsonout, terminal

    inputs, analyses = _load_and_analyze(args)
    hw_json, _ = _hardware(inputs, analyses, args)
    # Piped output gets a fixed width wide enough for the tables (rich would pick 80).
    console = Console(width=None if sys.stdout.isatty() else 120)
    for a in analyses:
        for renderable in terminal.analysis_renderables(a):
            console.print(renderable)
    if hw_json is not None:
        console.print(terminal.hardware_table(hw_json))
    if args.json:
        doc = jsonout.document(analyses, hardware=hw_json, kernel_metrics=inputs.kernel_metrics or None)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def cmd_report(args) -> int:
    from ..render.build import write_report

    inputs, analyses, logs, summaries = _load_and_analyze(args, allow_logs=True)
    batch = None
    if logs:
        from ..analysis.batching import analyze_batching, read_scheduler_log
        from ..loadgen.stats import read_summary

        batch = analyze_batching(read_scheduler_log(logs[0]), trace=inputs.traces[0] if inputs.traces else None,
                                 client=read_summary(summaries[0]) if summaries else None)
    out = write_report(inputs, analyses, output=Path(args.output), goal=args.goal, questions=tuple(args.question or ()),
                       plots=args.plots, json_path=args.json, peaks_path=args.peaks,
                       command="tracestory " + " ".join(sys.argv[1:]), batch=batch,
                       extra_inputs=tuple(p for p in (*logs, *summaries) if p in args.inputs))
    print(out)
    if args.html:
        from ..render.html import write_html

        print(write_html(out, Path(args.html) if args.html != "-" else out.with_suffix(".html")))
    return 0


def cmd_demo(args) -> int:
    from ..render.build import demo

    print(demo(Path(args.output_dir)))
    return 0


def cmd_categories(args) -> int:
    from ..analysis.category_table import seed002_categories, seed002_table
    from ..ingest import load_inputs

    inputs = load_inputs([args.input], progress_factory=_progress_factory(_stderr_console()))
    if not inputs.traces:
        raise UsageError(f"{args.input}: no GPU trace in this input")
    result = seed002_categories(inputs.traces, _taxonomy(args))
    print(seed002_table(result))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracestory", description="GPU traces in, the story of the execution out.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("analyze", help="tables of the breakdown, timeline and phases (and --json)")
    _add_analysis_options(p)
    p.add_argument("--json", metavar="OUT", help="write all results as JSON (schema: docs/JSON.md)")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("report", help="write the Markdown story report")
    _add_analysis_options(p)
    p.add_argument("-o", "--output", default="report.md", help="report path (default: report.md)")
    p.add_argument("--goal", help="what the user wants to learn (Goal Interpretation)")
    p.add_argument("--question", action="append", help="a question the report must answer (repeatable)")
    p.add_argument("--plots", action="store_true", help="also write PNG plots next to the report (matplotlib)")
    p.add_argument("--json", metavar="OUT", help="also write all results as JSON")
    p.add_argument("--html", nargs="?", const="-", metavar="OUT",
                   help="also write the report as one self-contained HTML page (default: next to the .md)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="report on the bundled H200 Llama trace; prints the report path")
    p.add_argument("--output-dir", default="tracestory-demo", help="folder to write (default: tracestory-demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("categories", help="seed 002's kernel-category table and JSON, for any input")
    p.add_argument("--input", required=True, help=".nsys-rep, .sqlite, nsys CSV or Kineto trace")
    p.add_argument("--output", help="JSON output path")
    p.add_argument("--taxonomy", default="moe", choices=("llm", "moe"), help="(default: moe)")
    p.add_argument("--rules", metavar="FILE", help="TOML category rules")
    p.set_defaults(func=cmd_categories)

    for module in _command_modules():
        module.register(sub)
    return parser


def _command_modules():
    """Subcommands that live in their own modules of this package, in help order."""
    from . import bench, capture, check, compare, eval, export, loadgen, ranks, serve

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
