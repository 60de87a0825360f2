"""Pyflakes-level errors (undefined names, unused imports and variables, syntax errors) fail the
suite: ``ruff check --select F,E9`` over every Python file of the project (not the scripts kept
verbatim beside the fixtures in tests/data)."""

from __future__ import annotations

import shutil
import subprocess

from conftest import REPO


def test_no_pyflakes_errors():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is a test dependency (pip install -e '.[test]')"
    r = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "F,E9", "--output-format", "concise",
                        "--extend-exclude", "tests/data", "src", "tests", "benchmarks", "examples"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
