"""The window line of the Executive Summary is held to the report contract (every number in
prose is a value of the JSON written with it), with the checker of test_report_contract."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import A100_NCCL, TEST_DATA
from tracestory.analysis.results import AnalysisOptions, analyze_inputs
from tracestory.analysis.window import WindowSpec, parse_steps, parse_window, window_inputs
from tracestory.ingest import load_inputs
from tracestory.render.build import write_report

_spec = importlib.util.spec_from_file_location("report_contract", Path(__file__).with_name("test_report_contract.py"))
contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(contract)

TP2 = TEST_DATA / "multigpu" / "tp2_even" / "torch" / "rank0.trace.json.gz"


@pytest.mark.parametrize("path, spec", [
    (TP2, WindowSpec("steady-state")),
    (TP2, parse_steps("5:6")),
    (A100_NCCL, parse_window("100:400")),
], ids=["steady", "steps", "window"])
def test_window_line_numbers_are_in_the_json(tmp_path, path, spec):
    results = analyze_inputs(window_inputs(load_inputs([path]), spec), AnalysisOptions())
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    write_report(results, md, json_path=js)
    text, doc = md.read_text(), json.loads(js.read_text())
    line = next(l for l in text.splitlines() if l.startswith("**Part of the trace described**"))
    assert f"`{spec.request}`" in line
    nums, strings = contract._pool(doc)
    found = list(contract._prose_numbers([line]))
    assert found   # the line does print numbers
    miss = [(tok, unit) for tok, unit, cu, _ in found if not contract._matches(tok, unit, nums, strings, cu)]
    assert not miss, miss


def test_many_traces_are_told_in_the_json_not_the_line(tmp_path, monkeypatch):
    import tracestory.render.window as rw

    monkeypatch.setattr(rw, "MAX_TRACES", 3)   # 4 ranks: more than the line tells
    folder = TEST_DATA / "multigpu" / "tp4_uneven" / "torch"
    paths = sorted(folder.glob("rank*.trace.json.gz"))
    assert len(paths) == 4
    inputs = window_inputs(load_inputs(paths), parse_steps("5:6"))
    results = analyze_inputs(inputs, AnalysisOptions())
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    write_report(results, md, json_path=js)
    line = next(l for l in md.read_text().splitlines() if l.startswith("**Part of the trace described**"))
    assert "and 2 more traces" in line and line.count("steps kept") == 2
    assert len(json.loads(js.read_text())["window"]["traces"]) == 4
