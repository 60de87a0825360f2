"""Options and steps every command that reads traces shares: the inputs, the taxonomy, the
guard against writing over an input, the load progress bar, and load -> analyze."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..analysis.categories import Taxonomy, load_rules, taxonomy
from ..analysis.results import AnalysisOptions, Results, analyze_inputs
from ..outputs import OutputPlan
from ..ingest import Inputs, load_inputs

INPUTS_HELP = ("Kineto .json(.gz), nsys .sqlite/.nsys-rep/CSV, ncu .ncu-rep/CSV, a scheduler event log, "
               "a `tracestory load --json` summary, or a folder")


def add_inputs(p: argparse.ArgumentParser, help: str = INPUTS_HELP) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=help)


def add_taxonomy(p: argparse.ArgumentParser, default: str = "llm") -> None:
    p.add_argument("--taxonomy", default=default, choices=("llm", "moe"),
                   help=f"kernel categories (default: {default})")
    p.add_argument("--rules", metavar="FILE", help="TOML file of category rules to add or replace")


def add_analysis_options(p: argparse.ArgumentParser) -> None:
    """Inputs, taxonomy, the Amdahl what-if factor and the peaks file."""
    add_inputs(p)
    add_taxonomy(p)
    p.add_argument("-k", "--speedup", type=float, default=2.0, metavar="K",
                   help="what-if: speedup of one category for the Amdahl column (default: 2)")
    p.add_argument("--peaks", metavar="FILE", help="measured peak FLOP/s and bandwidth (TOML/JSON)")


def taxonomy_from(args) -> Taxonomy:
    base = taxonomy(args.taxonomy)
    return load_rules(args.rules, base) if getattr(args, "rules", None) else base


def refuse_overwrite(inputs, *outputs) -> OutputPlan:
    """Every output checked against every input before anything is read (files, members of
    input folders, hardlinks and symlinks: :class:`~tracestory.outputs.OutputPlan`); returns the
    plan, whose writers are atomic and take ``-`` for standard output."""
    plan = OutputPlan(inputs)
    for out in outputs:
        if out:
            plan.check(out)
    return plan


def progress_factory(console=None):
    """A per-file progress callback that shows a bar only once a load has taken over a second."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    console = console or Console(stderr=True)

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


def read_inputs(args, *outputs) -> Inputs:
    """``args.inputs`` read, after refusing outputs that name an input."""
    refuse_overwrite(args.inputs, *outputs)
    return load_inputs(args.inputs, progress_factory=progress_factory())


def options_from(args, **extra) -> AnalysisOptions:
    return AnalysisOptions(taxonomy=taxonomy_from(args), k=getattr(args, "speedup", 2.0),
                           peaks_path=getattr(args, "peaks", None), **extra)


def load_and_analyze(args, *outputs, **extra) -> Results:
    """Read the inputs and compute every result once."""
    return analyze_inputs(read_inputs(args, *outputs), options_from(args, **extra))
