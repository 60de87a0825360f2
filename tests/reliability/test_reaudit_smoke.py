"""The re-audit script (tests/reliability/reaudit.py) kept from rotting: a small sample of its
input, output and subcommand cases (every 40th; the server and load classes start
``tracestory serve``, left to the whole run), run and judged as the whole audit does. The
whole audit (about 1,500 cases, a few minutes) is run by hand; docs/RELIABILITY.md holds its table.

What is checked: the script runs, every class of the sample has cases, every case gets an outcome
of the judge, and none of the sampled cases fails (the failures the audit found are fixed; one
that comes back shows here with its command line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO as REPO_ROOT


def test_a_sample_of_the_reaudit_runs_and_finds_no_failure(tmp_path):
    out = tmp_path / "cases.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "src"))
    script = REPO_ROOT / "tests" / "reliability" / "reaudit.py"
    r = subprocess.run([sys.executable, str(script), "--sample", "40", "--class", "inputs", "--class", "outputs",
                        "--class", "subcommands", "--json", str(out), "--show-failures"],
                       capture_output=True, text=True, env=env, timeout=300)
    cases = json.loads(out.read_text())
    classes = {c["cls"] for c in cases}
    assert classes == {"inputs", "outputs", "subcommands"}, r.stdout[-2000:]
    assert len(cases) >= 25, len(cases)
    ok = {"refused", "done", "done-stated", "failed-1"}
    failed = [f"{c['outcome']} {c['name']}: {c['why']} (tracestory {' '.join(c.get('argv', []))})"
              for c in cases if c["outcome"] not in ok]
    assert not failed, "\n".join(failed)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "| inputs |" in r.stdout and "cases/s" in r.stdout
