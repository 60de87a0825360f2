"""PNG plots: each figure is written, is a real PNG of sensible size, and is deterministic."""

from __future__ import annotations

import pytest

from conftest import A100_NCCL, H200_LLAMA
from tracestory.analysis.results import analyze_inputs
from tracestory.ingest import load_inputs
from tracestory.render.plots import write_plots

@pytest.mark.parametrize("path, expected", [
    (H200_LLAMA, {"breakdown", "timeline", "phases", "memory"}),
    (A100_NCCL, {"breakdown", "timeline", "phases"}),  # no [memory] events in this trace
])
def test_plots_written(tmp_path, path, expected):
    runs = analyze_inputs(load_inputs([path])).runs
    paths = write_plots(runs, tmp_path, stem="r")
    assert {p.stem.split("_", 1)[1] for p in paths} == expected
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plots_deterministic(tmp_path):
    a = analyze_inputs(load_inputs([H200_LLAMA])).runs
    runs = []
    for name in ("1", "2"):
        (tmp_path / name).mkdir()
        runs.append([p.read_bytes() for p in write_plots(a, tmp_path / name)])
    assert len(runs[0]) == 4 and runs[0] == runs[1]
