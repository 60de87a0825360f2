"""The README's Python verbs: each works any number of times in one process, on a path and on a
loaded trace, after every subpackage has been imported (a subpackage named like a verb would
replace it on the package)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from conftest import A100_NCCL, H200_LLAMA, NCU_RAW, TEST_DATA

import tracestory
from tracestory.errors import UsageError


@pytest.fixture(scope="module", autouse=True)
def every_subpackage_imported():
    packages = [m.name for m in pkgutil.walk_packages(tracestory.__path__, "tracestory.") if m.ispkg]
    assert {"tracestory.analysis", "tracestory.ingest", "tracestory.render", "tracestory.loadgen"} <= set(packages)
    for name in packages:
        importlib.import_module(name)


def test_verbs_are_functions_after_every_import():
    for verb in ("load", "load_all", "load_inputs", "analyze", "report", "region"):
        assert callable(getattr(tracestory, verb)), verb


def test_load_twice():
    for _ in range(2):
        t = tracestory.load(H200_LLAMA)
        assert isinstance(t, tracestory.Trace) and len(t.kernels) > 0


def test_load_of_several_ranks_points_to_load_all(tmp_path):
    folder = TEST_DATA / "multigpu" / "tp2_even"   # a capture folder of two ranks
    traces = tracestory.load_all(folder)
    assert sorted(t.meta.rank for t in traces) == [0, 1]
    with pytest.raises(UsageError, match=r"load_all\(path\)"):
        tracestory.load(folder)


def test_analyze_twice_on_a_path_and_on_a_trace():
    trace = tracestory.load(H200_LLAMA)
    for _ in range(2):
        by_path = tracestory.analyze(H200_LLAMA)
        by_trace = tracestory.analyze(trace)
        assert len(by_path.runs) == len(by_trace.runs) == 1
        a, b = by_path.analyses[0], by_trace.analyses[0]
        assert a.breakdown.kernel_time_ns == b.breakdown.kernel_time_ns == int(trace.kernels.dur_ns.sum())
        assert len(repr(by_path)) < 300 and len(repr(by_trace)) < 300 and len(repr(a)) < 300


def test_report_twice_from_paths_trace_and_results(tmp_path):
    trace = tracestory.load(A100_NCCL)
    results = tracestory.analyze([H200_LLAMA, NCU_RAW], goal="why?")
    for i in range(2):
        for name, what in (("paths", [H200_LLAMA]), ("trace", trace), ("results", results)):
            out = tracestory.report(what, tmp_path / f"{name}{i}.md")
            text = out.read_text()
            assert text.startswith("# Hands-On Learning Report: ") and "## Appendix" in text
    assert "**Original Goal**: why?" in (tmp_path / "results1.md").read_text()


def test_load_inputs_twice():
    for _ in range(2):
        inputs = tracestory.load_inputs([H200_LLAMA, NCU_RAW])
        assert len(inputs.traces) == 1 and len(inputs.kernel_metrics) == 1 and len(repr(inputs)) < 300
