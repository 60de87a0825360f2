"""compare's gates (analysis.compare.check_gates) on the real eager / compiled decode pair: the
formula of the module docstring, with A's and B's values taken from plain JSON sums."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from conftest import TEST_DATA
from tracestory.analysis import analyze
from tracestory.analysis.compare import GATE_METRICS, check_gates, compare
from tracestory.errors import UsageError
from tracestory.ingest import load_inputs

EAGER = TEST_DATA / "compare" / "decode_default_a.trace.json.gz"
COMPILED = TEST_DATA / "compare" / "decode_default_b.trace.json.gz"


def _plain(path):
    with gzip.open(path) as f:
        ev = json.load(f)["traceEvents"]
    gpu = [round(e["dur"] * 1000) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sum(gpu), sum(1 for e in ev if e.get("cat") == "kernel")


@pytest.fixture(scope="module")
def pair():
    (a,), (b,) = load_inputs([COMPILED]).traces, load_inputs([EAGER]).traces
    return compare(analyze(a), analyze(b))   # A = compiled (faster), B = eager


def test_time_gate_is_percent_of_a(pair):
    (ta, ka), (tb, kb) = _plain(COMPILED), _plain(EAGER)
    change = 100 * (tb - ta) / ta
    (g,) = check_gates(pair, per_metric={"gpu_time": change - 0.01})
    assert (g.a, g.b, g.regressed) == (ta, tb, True) and g.change == pytest.approx(change)
    (g,) = check_gates(pair, per_metric={"gpu_time": change + 0.01})
    assert not g.regressed
    (g,) = check_gates(pair, per_metric={"kernels": 0})
    assert (g.a, g.b, g.unit) == (ka, kb, "count") and g.change == pytest.approx(100 * (kb - ka) / ka)


def test_gate_applies_to_every_time_metric_both_sides_have(pair):
    names = [g.name for g in check_gates(pair, 5)]
    have = {s.metric for s in pair.speedups}
    assert names == [n for n in ("iteration", "iteration_mean", "wall", "busy", "gpu_time")
                     if GATE_METRICS[n][0] in have]
    assert names == ["wall", "busy", "gpu_time"]   # one iteration per file: no iteration family


def test_idle_gate_is_in_points(pair):
    (g,) = check_gates(pair, per_metric={"idle": 0})
    assert g.unit == "points" and g.change == pytest.approx(100 * (pair.b.idle_fraction - pair.a.idle_fraction))


def test_a_zero_baseline_regresses_on_any_increase(pair):
    c = dataclasses.replace(pair, a=dataclasses.replace(pair.a, launch_count=0))
    (g,) = check_gates(c, per_metric={"launches": 1000})
    assert g.change is None and g.regressed == (pair.b.launch_count > 0)


def test_identical_sides_never_regress():
    (t,) = load_inputs([EAGER]).traces
    c = compare(analyze(t), analyze(t), identical="x" * 64)
    gates = check_gates(c, 0, {"kernels": 0, "idle": 0, "launches": 0})
    assert gates and all(g.change == 0 and not g.regressed for g in gates)
    assert c.findings[0].title == "The two inputs are identical (same SHA-256)"


@pytest.mark.parametrize("gate, per, match", [
    (-1, None, "--gate -1: expected a limit >= 0"),
    (None, {"speed": 1}, "--gate-metric speed: expected one of"),
    (None, {"wall": -2}, "--gate-metric wall=-2: expected a limit >= 0"),
])
def test_bad_gates(pair, gate, per, match):
    with pytest.raises(UsageError, match=match):
        check_gates(pair, gate, per)
