"""Options and steps every command that reads traces shares: the inputs, the taxonomy, the
guard against writing over an input, the load progress bar, and load -> analyze."""

from __future__ import annotations

import argparse
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..analysis.categories import Taxonomy
from ..analysis.results import AnalysisOptions, Results, analyze_inputs
from ..errors import UsageError
from ..outputs import OutputPlan
from ..ingest import Inputs, load_inputs
from ..lazy import entry

if TYPE_CHECKING:
    from ..analysis.window import WindowSpec

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
    add_window_options(p)


def add_window_options(p: argparse.ArgumentParser) -> None:
    """``--window``, ``--steps`` and ``--steady-state`` (one of them): the part of each trace analysed
    (:mod:`tracestory.analysis.window` has the rule)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--window", metavar="START:END",
                   help="analyse only START..END ms from each trace's first event (either side may be empty): "
                        "GPU ops starting inside, CPU ops/ranges/API calls overlapping it")
    g.add_argument("--steps", metavar="A:B",
                   help="analyse only steps A..B (inclusive; the numbers in ProfilerStep#N or the step family's "
                        "names)")
    g.add_argument("--steady-state", action="store_true",
                   help="analyse the steady state: drop the first step, a last step cut by the trace end, and "
                        "leading steps >= 1.5x the median step time")


def window_spec(args) -> WindowSpec | None:
    """The window the command line asks for, or None (the whole trace)."""
    window, steps = getattr(args, "window", None), getattr(args, "steps", None)
    steady = getattr(args, "steady_state", False)
    if window is None and steps is None and not steady:
        return None   # the whole trace: the window module is imported only when a window is asked for
    return entry("tracestory.analysis.window", "WindowSpec").from_flags(window, steps, steady)


def taxonomy_from(args) -> Taxonomy:
    return Taxonomy.named(args.taxonomy, getattr(args, "rules", None))


SIDE_FILE_BYTES = 16 << 20


def side_inputs(args) -> list[str]:
    """The files a command reads besides its inputs (``--rules``, ``--peaks``), each checked to
    be a readable regular file of at most 16 MiB first: a missing one is one line, not a
    traceback later."""
    files = []
    for flag in ("rules", "peaks"):
        path = getattr(args, flag, None)
        if not path:
            continue
        try:
            st = os.stat(path)
        except OSError as e:
            raise UsageError(f"{path}: expected a readable --{flag} file, found {(e.strerror or str(e)).lower()}") from None
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path}: expected a --{flag} file, found "
                             f"{'a folder' if stat.S_ISDIR(st.st_mode) else 'a special file'}")
        if not os.access(path, os.R_OK):
            raise UsageError(f"{path}: expected a readable --{flag} file, found permission denied")
        if st.st_size > SIDE_FILE_BYTES:   # a few KB of TOML/JSON: never decode a huge file by mistake
            raise UsageError(f"{path}: expected a --{flag} file of at most {SIDE_FILE_BYTES >> 20} MiB, "
                             f"found {st.st_size:,} bytes")
        files.append(path)
    return files


def refuse_overwrite(inputs, *outputs) -> OutputPlan:
    """Every output checked against every input before anything is read (files, members of
    input folders, hardlinks and symlinks: :class:`~tracestory.outputs.OutputPlan`) and against
    every other output (two flags naming one file, or two ``-``); returns the plan, whose
    writers are atomic and take ``-`` for standard output. An output is a path or a
    ``(flag, path)`` pair; the flag names it in the refusal."""
    plan = OutputPlan(inputs)
    for i, out in enumerate(outputs):
        flag, path = out if isinstance(out, tuple) else (f"output {i + 1}", out)
        if path is not None:       # "" is asked for and refused, not taken as "no output"
            plan.check(path, flag)
    return plan


class _Progress:
    """A per-file progress bar that appears once a load has taken over a second, and a status line
    while the analysis runs; both are cleared when done (transient), and nothing is drawn when
    standard error is not a terminal."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.bars: list = []

    def __call__(self, path: Path):
        t0 = time.monotonic()
        state = {"bar": None, "task": None}

        def update(done: int, total: int):
            if state["bar"] is None:
                if time.monotonic() - t0 < 1.0 or not self.console.is_terminal:
                    return
                # imported only when a bar is drawn (~4 ms a tiny `analyze` does not pay)
                from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

                bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                               TimeRemainingColumn(), console=self.console, transient=True)
                bar.start()
                self.bars.append(bar)
                state["bar"], state["task"] = bar, bar.add_task(f"reading {path.name}", total=total)
            state["bar"].update(state["task"], completed=min(done, total))

        return update

    def close(self) -> None:
        for bar in self.bars:
            bar.stop()
        self.bars.clear()

    def status(self, text: str):
        """A transient spinner line for a step without a byte count (the analysis)."""
        import contextlib

        return self.console.status(text) if self.console.is_terminal else contextlib.nullcontext()


def progress_factory(console=None) -> _Progress:
    """The load progress of one command (see :class:`_Progress`)."""
    return _Progress(console)


def read_inputs(args, *outputs) -> Inputs:
    """``args.inputs`` read, after refusing outputs that name an input (``--rules`` and
    ``--peaks`` files included) or each other."""
    refuse_overwrite([*args.inputs, *side_inputs(args)], *outputs)
    progress = progress_factory()
    try:
        return load_inputs(args.inputs, progress_factory=progress)
    finally:
        progress.close()


def options_from(args, **extra) -> AnalysisOptions:
    """What the command line asks the analysis for. A malformed ``--window``/``--steps`` or a bad
    ``--rules`` file is refused here, before any input is read."""
    return AnalysisOptions(taxonomy=taxonomy_from(args), k=getattr(args, "speedup", 2.0),
                           peaks_path=getattr(args, "peaks", None), window=window_spec(args), **extra)


def load_and_analyze(args, *outputs, **extra) -> Results:
    """Read the inputs and compute every result once (on the part of each trace that
    ``--window``/``--steps``/``--steady-state`` select)."""
    refuse_overwrite([*args.inputs, *side_inputs(args)], *outputs)
    options = options_from(args, **extra)   # flags and the rules file, before the inputs are read
    inputs = read_inputs(args)
    with progress_factory().status("analyzing"):
        return analyze_inputs(inputs, options)
