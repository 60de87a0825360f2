"""The workload a capture runs: ``python script.py ARGS`` or ``python -m module ARGS``.

A workload is parsed once from the words after ``--`` and then rendered three ways: as a
plain command (warm-up run, nsys/ncu child), wrapped in ``torchrun --nproc_per_node=N``, or
run in this very process with :mod:`runpy` (the torch capture, so the capture controller sees
the workload's :func:`tracestory.region` calls).

In-process runs set ``sys.argv`` and ``sys.path[0]`` as ``python script.py`` would and restore
them afterwards; the interpreter named in the command is then the current one.

:func:`check_startable` refuses, before anything starts, a workload that cannot start: an
interpreter that is not on PATH, a script that is not a file, a module ``python -m`` would
not find. Modules are looked up without importing anything: the top-level name through
every finder (editable installs included), submodules in their parent's search locations,
``__main__`` for a package. Limits: the lookup uses this interpreter's path (``-m`` with
another interpreter is checked only when it resolves to this one); a package that extends its
``__path__`` at import time can hide a submodule from the lookup.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import runpy
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import ToolNotFound, UsageError

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class Workload:
    python: str | None          # interpreter word as given ("python", "python3", a path) or None
    script: str | None          # path of the script, as given
    module: str | None          # module name for -m
    args: tuple[str, ...]

    @property
    def target(self) -> list[str]:
        """``[script]`` or ``["-m", module]``."""
        return [self.script] if self.script is not None else ["-m", self.module or ""]

    def argv(self) -> list[str]:
        """The plain command, with the interpreter as the user named it."""
        return [self.python or sys.executable, *self.target, *self.args]

    def torchrun_argv(self, nproc: int) -> list[str]:
        """``torchrun --nproc_per_node=N script.py ARGS`` (or ``-m module``)."""
        return ["torchrun", f"--nproc_per_node={nproc}", *self.target, *self.args]

    @property
    def path(self) -> Path:
        """Where the workload lives (for the git commit): the script, or the current folder."""
        return Path(self.script).resolve() if self.script else Path.cwd()

    @property
    def stem(self) -> str:
        if self.script:
            return Path(self.script).stem
        if self.module == "tracestory.cli" and self.args:
            return self.args[0]           # `tracestory serve ...` -> "serve"
        return (self.module or "workload").rsplit(".", 1)[-1]


def parse_workload(words: Sequence[str]) -> Workload:
    """Parse ``[python] (script.py | -m module) ARGS`` (a leading ``--`` is dropped);
    ``tracestory CMD ARGS`` is ``-m tracestory.cli CMD ARGS`` with this interpreter."""
    words = list(words)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError("capture: expected a workload after --, e.g. "
                         "`-- python script.py ARGS` or `-- python -m module ARGS`, found nothing")
    if Path(words[0]).name == "tracestory":   # `tracestory serve ...`: our own CLI, run by module
        return Workload(None, None, "tracestory.cli", tuple(words[1:]))
    python = None
    if _PYTHON.match(Path(words[0]).name) or os.path.realpath(words[0]) == os.path.realpath(sys.executable):
        python, words = words[0], words[1:]
    if not words:
        raise UsageError(f"capture: expected a script or -m module after {python!r}, found nothing")
    if words[0] == "-m":
        if len(words) < 2:
            raise UsageError("capture: expected a module name after -m, found nothing")
        return Workload(python, None, words[1], tuple(words[2:]))
    if words[0].startswith("-"):
        raise UsageError(f"capture: expected a script or -m module, found option {words[0]!r} "
                         "(interpreter options are not supported)")
    return Workload(python, words[0], None, tuple(words[1:]))


def _same_interpreter(word: str | None) -> bool:
    if word is None:
        return True
    exe = shutil.which(word)
    return exe is not None and os.path.realpath(exe) == os.path.realpath(sys.executable)


def module_found(name: str, search: Sequence[str] | None = None) -> bool:
    """Whether ``python -m name`` would find something to run, importing nothing."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return False
    try:
        if search is None:
            spec = importlib.util.find_spec(parts[0])     # top level: no import happens
        else:
            spec = importlib.machinery.PathFinder.find_spec(parts[0], list(search))
            if spec is None:
                spec = importlib.util.find_spec(parts[0])
        for part in parts[1:]:
            locations = spec.submodule_search_locations if spec is not None else None
            if not locations:
                return False
            spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if spec.submodule_search_locations:        # a package runs its __main__
        return importlib.machinery.PathFinder.find_spec("__main__", list(spec.submodule_search_locations)) is not None
    return True


def check_startable(w: Workload, *, interpreter: str | None = None) -> None:
    """Raise (one line) when the workload cannot start: see the module docstring.

    ``interpreter`` is the word that will run it (default: the one the user named)."""
    word = w.python if interpreter is None else interpreter
    if word is not None and shutil.which(word) is None:
        raise ToolNotFound(word, "the workload's interpreter is not on PATH (or not executable)")
    if w.script is not None:
        if not Path(w.script).is_file():
            what = "a folder" if Path(w.script).is_dir() else "no such file"
            raise UsageError(f"{w.script}: expected a Python script (`-- python script.py ARGS`, or "
                             f"`-- python -m module ARGS`), found {what}")
    elif w.module and _same_interpreter(word):
        if not module_found(w.module, [os.getcwd(), *sys.path]):
            raise UsageError(f"{w.module}: expected a module that `python -m` can run, found none on "
                             f"the path of {sys.executable} (current folder included)")


def run_in_process(w: Workload) -> int:
    """Run the workload in this process as ``__main__``; its exit code (0 when it returns).

    Exceptions from the workload propagate (the caller records them); ``SystemExit`` is
    turned into its code.
    """
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    try:
        if w.script is not None:
            script = str(Path(w.script))
            if not Path(script).is_file():
                raise UsageError(f"{script}: expected a Python script, found no such file")
            sys.argv = [script, *w.args]
            sys.path.insert(0, str(Path(script).resolve().parent))
            runpy.run_path(script, run_name="__main__")
        else:
            sys.argv = [w.module or "", *w.args]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(w.module or "", run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] != saved_path0:
            sys.path.pop(0)
