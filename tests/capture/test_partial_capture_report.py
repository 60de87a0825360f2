"""A failed capture is reported as partial: ``tracestory report`` on the capture folder (or on its
``failed-torch/`` folder) reads the files the capture kept and says in its Limitations what is
missing. Built from the CPU TP=2 capture fixture (``tests/data/tp_serve_cpu``): its manifest
with the torch capture marked failed, and its files moved to ``failed-torch/`` without rank 1's
trace (as a capture whose rank 1 was killed leaves it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracestory.analysis.limitations import capture_limitations
from tracestory.ingest import load_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "tp_serve_cpu"
ERROR = "step torch-profile failed: the workload was killed by SIGKILL"


@pytest.fixture()
def failed_capture(tmp_path):
    folder = tmp_path / "serve_tp2"
    kept = folder / "failed-torch"
    kept.mkdir(parents=True)
    for f in (DATA / "torch").iterdir():
        if f.name != "rank1.trace.json.gz":
            shutil.copy(f, kept / f.name)
    m = json.loads((DATA / "manifest.json").read_text())
    m["captures"][0].update(status="failed", error=ERROR, kept=str(kept))
    (folder / "manifest.json").write_text(json.dumps(m))
    return folder


@pytest.mark.parametrize("which", ["folder", "failed-torch"])
def test_failed_capture_is_read_from_what_it_kept(failed_capture, which):
    path = failed_capture if which == "folder" else failed_capture / "failed-torch"
    inputs = load_inputs([path])
    assert len(inputs.traces) == 1                                  # rank 0's trace
    assert inputs.scheduler_log is not None and inputs.load_summary is not None
    (lim,) = capture_limitations(inputs)
    assert lim.analysis == "partial capture"
    assert ERROR in lim.reason and "failed-torch/" in lim.reason
    # the fixture's capture ran with --torchrun 2 and --load: rank 1's trace is what is missing
    assert lim.reason.endswith("missing: rank1.trace.json.gz.")


def test_a_complete_capture_has_no_partial_limitation():
    inputs = load_inputs([DATA])
    assert len(inputs.traces) == 2 and capture_limitations(inputs) == ()


def test_report_on_a_failed_capture_tells_the_batch_story_and_what_is_missing(failed_capture, tmp_path):
    out = tmp_path / "report.md"
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "report", str(failed_capture), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "missing: rank1.trace.json.gz" in text
    assert "Batch" in text                                          # the scheduler log was read
