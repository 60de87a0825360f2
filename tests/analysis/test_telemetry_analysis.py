"""Telemetry over the traced window, on the handwritten fixture (tests/data/telemetry/README.md
lists its rows). Expected values are worked out by hand below, from those rows."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from conftest import TEST_DATA
from tracestory.analysis.results import analyze_inputs
from tracestory.analysis.telemetry import analyze_telemetry
from tracestory.ingest import load_inputs
from tracestory.ingest.telemetry import read_telemetry

FOLDER = TEST_DATA / "telemetry" / "capture_throttled"
BASE = 1790000000000000000
MS = 1_000_000


@pytest.fixture(scope="module")
def result():
    return analyze_inputs(load_inputs([FOLDER])).telemetry


def test_window_is_the_traced_kernels_on_the_epoch_clock(result):
    # kernels at ts 1,000,000 us + 200,000 us and 1,300,000 us + 200,000 us after baseTimeNanoseconds
    assert result.window_unix_ns == (BASE + 1000 * MS, BASE + 1500 * MS)
    assert result.span_unix_ns == (BASE + 800 * MS, BASE + 1700 * MS)
    assert result.overlaps and result.window_ns == 500 * MS


def test_window_statistics_by_hand(result):
    (g,) = result.gpus
    # samples whose hold interval [t_k, t_k+1) overlaps [1.0 s, 1.5 s], plus the one at 1.5 s:
    # 1.0, 1.1, 1.2, 1.3, 1.4, 1.5 s -> 6 samples
    assert g.samples == 6
    # SM: 1980 1980 1500 1500 1980 1980 -> min 1500, median of sorted (1500 1500 1980 1980 1980 1980) = 1980
    assert (g.sm_mhz.min, g.sm_mhz.median, g.sm_mhz.max) == (1500, 1980, 1980)
    # power: 500 600 700 700 600 200 -> sorted 200 500 600 600 700 700: median (600 + 600) / 2 = 600
    assert (g.power_w.min, g.power_w.median, g.power_w.max) == (200, 600, 700)
    # energy counter at 1.5 s minus at 1.0 s: 1,330,000 - 1,020,000 mJ = 310 J
    assert g.energy_method == "energy counter" and g.energy_j == pytest.approx(310.0)
    # sw power cap (0x4) held over [1.2, 1.3) and [1.3, 1.4): 200 ms, 2 samples; no idle bit in the window
    assert [(r.name, r.slowdown, r.duration_ns, r.samples) for r in g.reasons] == [("sw_power_cap", True, 200 * MS, 2)]
    # busy (util 100, no idle bit) below 0.9 x 1980 = 1782 MHz: the 1.2 and 1.3 s samples, 200 ms
    assert (g.run_max_sm_mhz, g.busy_sm_min_mhz, g.low_clock_busy_ns) == (1980, 1500, 200 * MS)


def test_clock_drop_finding(result):
    (f,) = result.findings
    assert f.rule == "gpu_clock_drop" and f.severity == "medium"       # 200 ms of 500 ms = 40% >= 10%
    assert "SM clock down to 1500 MHz (76% of the run's 1980 MHz) for 200 ms while busy" in f.title
    assert "software power cap (200 ms)" in f.title
    share = next(e for e in f.evidence if e.label == "share of the window")
    assert share.value == pytest.approx(0.4)


def test_joules_per_token_by_hand(result):
    t = result.tokens
    # iteration energies (counter at end - at start): it0 [1.0,1.1] 50 J (100 prefill tokens);
    # it1 [1.1,1.2] 60 J (2 decode); it2 [1.2,1.3] 70 J (1 decode + 50 prefill); it3 [1.3,1.4] 70 J (2 decode)
    assert t.decode_j_per_token == pytest.approx((60 + 70) / 4)                    # 32.5 J/token
    assert t.prefill_j_per_token == pytest.approx((50 + 70 - 1 * 32.5) / 150)      # 0.58333 J/token
    assert t.all_in_j_per_token == pytest.approx(250 / (4 + 1 + 150))             # 1.0 s .. 1.4 s: 250 J
    assert (t.decode_tokens, t.prefill_tokens, t.decode_only_iterations, t.prefill_iterations) == (4, 150, 2, 2)
    assert t.gpus == (0,) and t.outside_iterations == 0


def test_without_energy_counter_power_is_integrated(tmp_path):
    src = FOLDER / "torch" / "telemetry.jsonl"
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    for rec in lines:
        for g in rec.get("gpus", []):
            g["energy_mj"] = None
    path = tmp_path / "telemetry.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    inputs = load_inputs([FOLDER / "torch" / "rank0.trace.json"])
    res = analyze_telemetry(read_telemetry(path), inputs.traces)
    # trapezoids over 1.0..1.5 s, 0.1 s each: (500+600)/2 + (600+700)/2 + (700+700)/2 + (700+600)/2 + (600+200)/2
    # = 550 + 650 + 700 + 650 + 400 = 2950 W x 0.1 s = 295 J
    assert res.gpus[0].energy_method == "integrated power"
    assert res.gpus[0].energy_j == pytest.approx(295.0)


def test_a_trace_without_epoch_base_uses_the_whole_telemetry_and_says_so():
    inputs = load_inputs([FOLDER])
    tr = inputs.traces[0]
    extra = {k: v for k, v in tr.meta.extra.items() if k != "baseTimeNanoseconds"}
    tr2 = dataclasses.replace(tr, meta=dataclasses.replace(tr.meta, extra=extra))
    res = analyze_telemetry(inputs.telemetry, [tr2])
    assert res.window_unix_ns == (BASE + 800 * MS, BASE + 1700 * MS)
    assert "no Unix time base" in res.window_source
    assert res.gpus[0].samples == 10


def test_telemetry_from_another_time_does_not_overlap(tmp_path):
    inputs = load_inputs([FOLDER])
    log = inputs.telemetry
    shifted = dataclasses.replace(log, t_unix_ns=log.t_unix_ns + 3600 * 10**9)
    res = analyze_telemetry(shifted, inputs.traces)
    assert not res.overlaps and res.gpus == () and res.findings == ()


def test_limitation_only_for_captures_recorded_without_sampler(tmp_path):
    from tracestory.ingest import Inputs

    trace = load_inputs([FOLDER / "torch" / "rank0.trace.json"]).traces
    plain = analyze_inputs(Inputs(traces=trace))
    assert not [x for x in plain.limitations if x.analysis == "GPU telemetry"]
    manifest = json.loads((FOLDER / "manifest.json").read_text())
    manifest["captures"][0]["telemetry"] = {"status": "off", "reason": "--skip-power-monitor"}
    off = analyze_inputs(Inputs(traces=trace, manifests=(manifest,)))
    assert [x.reason for x in off.limitations if x.analysis == "GPU telemetry"] == [
        "no GPU telemetry (clocks, power) in the torch capture: the sampler was off (--skip-power-monitor)."]
    assert off.telemetry is None
    np.testing.assert_equal(len(off.runs), 1)
