"""The one door of the library: what the command line asks for (window, taxonomy, rules) travels
in ``AnalysisOptions`` and is applied by ``analyze_inputs``, not wired between the calls."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import TEST_DATA

from tracestory.analysis.categories import Taxonomy
from tracestory.analysis.results import AnalysisOptions, analyze_inputs
from tracestory.analysis.window import WindowSpec
from tracestory.errors import UsageError
from tracestory.ingest import load_inputs

TP2 = TEST_DATA / "multigpu" / "tp2_even" / "torch" / "rank0.trace.json.gz"


def _kernels_in_steps(path, first: int, last: int) -> int:
    """The window rule read from the JSON itself: the GPU ops (kernels, memsets) launched inside
    ProfilerStep#first..#last (a runtime or driver call in the step's CPU span, joined by
    correlation id) span a GPU interval; the kernels that start inside it are kept."""
    events = json.loads(gzip.open(path).read())["traceEvents"]
    steps = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("name", "").startswith("ProfilerStep#") and first <= int(e["name"].split("#")[1]) <= last
    ]
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memset")]
    mine = [k for k in gpu if any(lo <= launches.get(k["args"].get("correlation"), -1) <= hi for lo, hi in steps)]
    lo, hi = min(k["ts"] for k in mine), max(k["ts"] + k["dur"] for k in mine)
    return sum(1 for k in gpu if k["cat"] == "kernel" and lo <= k["ts"] < hi)


def test_steps_in_the_options_restrict_the_analysis():
    spec = WindowSpec.from_flags(steps="5:6")
    res = analyze_inputs(load_inputs([TP2]), AnalysisOptions(window=spec))
    (w,) = res.inputs.window.traces
    assert res.inputs.window.request == "--steps 5:6"
    assert w.steps_kept == ("ProfilerStep#5", "ProfilerStep#6")
    assert w.kernels_kept == _kernels_in_steps(TP2, 5, 6)
    assert len(res.runs[0].analysis.trace.kernels) == w.kernels_kept


def test_no_window_is_the_whole_trace():
    res = analyze_inputs(load_inputs([TP2]), AnalysisOptions(window=WindowSpec.from_flags()))
    assert res.inputs.window is None


def test_a_malformed_flag_is_refused_before_reading():
    with pytest.raises(UsageError, match="--window"):
        WindowSpec.from_flags(window="9:3")


def test_taxonomy_named_reads_the_rules_file(tmp_path):
    rules = tmp_path / "r.toml"
    rules.write_text('[[rule]]\ncategory = "attention"\nkernel = "zzz_probe_kernel"\n')
    tax = Taxonomy.named("llm", str(rules))
    assert tax.name == "llm+r"
    assert Taxonomy.named("moe").name == "moe"
