"""examples/notebook_tour.py runs as a script (as CI runs it) and prints what a notebook would
show: the trace, kernels as a DataFrame, named tables and GPU time per operator.

Expected values come from ``json.load`` of the trace it reads: the kernel count, the summed
duration of the largest kernel name (ns, ``round(dur_us * 1000)``), and, by hand reading of
the trace's ops, the largest top-level op group (``aten::linear`` on a [1, 1, 4096] input
against the [14336, 4096] weight: the decode steps' MLP up/gate projections).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter

from conftest import H200_LLAMA, REPO

TOUR = REPO / "examples" / "notebook_tour.py"


def test_notebook_tour_runs_as_a_script(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(TOUR)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    with gzip.open(H200_LLAMA, "rt") as f:
        kernels = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    per_name = Counter()
    for e in kernels:
        per_name[e["name"]] += int(round(e["dur"] * 1000))
    (top_name, top_ns), = per_name.most_common(1)
    assert f"kernels={len(kernels)}," in out.splitlines()[0]
    assert any(top_name in ln and str(top_ns) in ln for ln in out.splitlines()), top_name
    ops_lines = [ln for ln in out.splitlines() if "aten::linear" in ln and "[[1, 1, 4096], [14336, 4096], []]" in ln]
    assert ops_lines and ops_lines[0].split()[0] == "0"   # the first row of the per-op table
    assert "top-level op groups:" in out and "Traceback" not in r.stderr
