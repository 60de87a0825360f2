"""Each command imports its own code only: ``tracestory --version`` imports no analysis, and
``analyze`` imports no serve, bench, capture or load-generator module (nor asyncio, which only
those use). Run in fresh interpreters; the modules loaded are read from ``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import H100_BERT

OTHER_COMMANDS = ("tracestory.serve", "tracestory.bench", "tracestory.capture", "tracestory.loadgen",
                  "tracestory.cli.serve", "tracestory.cli.bench", "tracestory.cli.capture", "tracestory.cli.loadgen")


def _modules_after(argv: list[str]) -> tuple[int, list[str], str]:
    code = ("import json, sys\n"
            "from tracestory.cli import main\n"
            f"sys.argv = ['tracestory', *{argv!r}]\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "sys.stdout.flush()\n"
            "print('\\nMODULES', json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
            "sys.exit(rc)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    modules = json.loads(p.stderr.rsplit("MODULES ", 1)[1])
    return p.returncode, modules, p.stdout


def test_version_imports_no_command():
    rc, modules, out = _modules_after(["--version"])
    assert rc == 0 and out.startswith("tracestory ")
    ours = [m for m in modules if m.startswith("tracestory")]
    assert ours == ["tracestory", "tracestory.cli", "tracestory.errors", "tracestory.version"], ours
    assert "numpy" not in modules and "asyncio" not in modules


def test_analyze_imports_no_serve_bench_capture_or_loadgen(tmp_path):
    out = tmp_path / "a.json"
    rc, modules, _ = _modules_after(["analyze", str(H100_BERT), "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["traces"]
    loaded = [m for m in modules if m.startswith(OTHER_COMMANDS)]
    assert loaded == [] and "asyncio" not in modules, loaded


def test_help_lists_every_command_with_its_own_help():
    """The one-line help in cli.COMMANDS (shown without importing the commands) is each module's own."""
    from tracestory.cli import COMMANDS, build_parser

    def helps(parser):
        sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
        return [(a.dest, a.help) for a in sub._choices_actions]

    full = helps(build_parser())            # every module imported, its register() used
    light = helps(build_parser(""))         # names and help only
    assert full == light == [(name, help_) for name, _, help_ in COMMANDS]
