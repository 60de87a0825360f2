"""The ``tracestory`` command: parse, call the library, render. No analysis logic lives here.

Library errors (:class:`~tracestory.errors.TracestoryError`) become one line on stderr and
exit code 2.

Start-up: each command lives in a module of this package (``analyze``; ``story`` holds report,
demo and categories) and only the module of the command being run is imported
(:data:`COMMANDS`; ``importlib`` by name; below the command line, :mod:`tracestory.lazy` does
the same for readers and passes that only some inputs need): ``tracestory --version`` imports no analysis, and ``analyze`` no serve, bench,
capture or load generator code. The other commands appear in ``--help`` with their one-line
help from :data:`COMMANDS` (a test keeps it equal to the modules' own).
"""

from __future__ import annotations

import argparse
import atexit
import errno
import gc
import importlib
import logging
import os
import sys

from ..errors import TracestoryError
from ..version import __version__

# (command, module of this package whose register(subparsers) adds it, one-line help), help order
COMMANDS = (
    ("analyze", "analyze", "tables of the breakdown, timeline and phases; one named table as CSV/JSON/"
                           "Markdown (--table, --format); all results as JSON (--json)"),
    ("report", "story", "write the Markdown story report"),
    ("demo", "story", "report on the bundled H200 Llama trace; prints the files it wrote "
                      "(report.md, analysis.json, report.html)"),
    ("categories", "story", "kernel-category table: GPU time per category and the Amdahl ceiling of the expert "
                            "GEMMs (and --output JSON)"),
    ("check", "check", "self-check a written report against tracestory's report format "
                       "(every section present and filled; not a verdict on the program)"),
    ("compare", "compare", "two runs side by side: time, categories, kernels, speedup"),
    ("export", "export", "export the analyzed timeline to other tools (perfetto)"),
    ("ranks", "ranks", "multi-GPU analysis of many rank traces (process pool or dask)"),
    ("capture", "capture", "capture traces of a workload into artifacts/<name>/"),
    ("bench", "bench", "built-in GPU workloads with roofline numbers"),
    ("eval", "eval", "model quality: perplexity per precision"),
    ("serve", "serve", "OpenAI-compatible continuous-batching server over the Llama testbench"),
    ("load", "loadgen", "load generator for OpenAI-compatible servers (vllm bench serve's flags)"),
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser (``only=None``), or one whose command ``only`` has its full arguments and
    every other command only its name and help (``only=""``: none, for ``--help``/``--version``)."""
    parser = argparse.ArgumentParser(prog="tracestory", description="GPU traces in, the story of the execution out.")
    parser.add_argument("--version", action="version", version=f"tracestory {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    registered: set[str] = set()
    for name, module, help_ in COMMANDS:
        if only is None or only in {n for n, m, _ in COMMANDS if m == module}:
            if module not in registered:
                registered.add(module)
                importlib.import_module(f"{__name__}.{module}").register(sub)
        else:
            sub.add_parser(name, help=help_)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The command named in ``argv`` ("" when there is none before an option such as --help,
    None when the word is not a command: the whole parser then says what is wrong)."""
    for word in argv:
        if word.startswith("-"):
            if word in ("-h", "--help", "--version"):
                return ""
            continue
        return word if word in {n for n, _, _ in COMMANDS} else None
    return None


class _StderrLines(logging.Handler):
    """The readers' damage lines (``FILE: warning: ...``, logger ``tracestory.ingest``) on the
    stderr of the moment: every command states them on the terminal, not only in its JSON and
    the report's Limitations."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(record.getMessage(), file=sys.stderr)
        except (OSError, ValueError):
            pass


def _state_damage_on_stderr() -> None:
    logger = logging.getLogger("tracestory.ingest")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        handler = _StderrLines(logging.WARNING)
        logger.addHandler(handler)


# The commands whose work is numpy without its matrix products (no BLAS call: they read traces,
# sort, search and sum): their process loads OpenBLAS with one thread (see _one_blas_thread).
ONE_BLAS_THREAD = frozenset({"analyze", "report", "demo", "categories", "check", "compare", "export"})
# What OpenBLAS reads for its thread count, in its own order of precedence: one set by the user wins.
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def _one_blas_thread() -> None:
    """Import numpy with OpenBLAS limited to one thread, unless numpy is already loaded or the
    user chose a thread count. numpy's OpenBLAS starts its worker threads when it is loaded (one
    per CPU beyond the first) and each spins for a while before it sleeps: on the 2-CPU machine of
    docs/PERFORMANCE.md ("Tiny-trace analyze") that was ~0.06 s of CPU and ~0.05 s of wall per
    ``analyze`` of a small trace, taken from the command's own thread, for matrix products these
    commands never make. OpenBLAS reads the variable once, when numpy loads it; the variable is
    removed again at once, so a process this one starts (a capture's workload) sees the
    environment it was given."""
    if "numpy" in sys.modules or any(v in os.environ for v in _BLAS_THREAD_VARS):
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def main(argv: list[str] | None = None) -> int:
    """The ``tracestory`` command (``argv`` None: the process's own command line, ``sys.argv``).

    Run as the process's command (``argv`` None: the ``tracestory`` script, ``python -m
    tracestory.cli``), the objects that exist at exit are frozen out of the garbage collector
    (``atexit``): the interpreter's shutdown then skips its full collections of the ~30,000
    objects of numpy, rich and the analysis (~0.02 s of a small ``analyze``); it frees memory the
    exiting process does not need. A caller that passes ``argv`` (tests, a program embedding the
    command) keeps its collector as it was."""
    if argv is None:
        atexit.register(gc.freeze)
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_of(argv)
    if command in ONE_BLAS_THREAD:
        _one_blas_thread()
    parser = build_parser(command)
    args = parser.parse_args(argv)
    _state_damage_on_stderr()
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()   # a full or closed stdout (> /dev/full, | head) fails here, not at exit
        return code
    except TracestoryError as e:
        print(f"tracestory: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tracestory: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if not _stdout_failed(e):
            raise
        print(f"tracestory: error: <stdout>: expected a writable standard output, found "
              f"{(e.strerror or str(e)).lower()}", file=sys.stderr)
        return 2


def _stdout_failed(e: OSError) -> bool:
    """Whether ``e`` came from writing stdout (a full device, a closed pipe: a write error with no
    file name; every named output goes through :mod:`tracestory.outputs`); stdout is then
    pointed at /dev/null so that the interpreter's own flush at exit does not fail again."""
    if e.errno not in (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT) or e.filename is not None:
        return False     # a named file's error, or another kind: not stdout (files go through outputs)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no real file descriptor (a test's capture)
        pass
    return True


if __name__ == "__main__":
    sys.exit(main())
