"""The batch story of a real capture under load (``tests/data/serving/h200_serve_q12``: the
reference server on an H200, torch.profiler over scheduler iterations 600-615 at 12 QPS).

Expected values come from the files through plain ``gzip``/``json``/``statistics``: the
scheduler log's ``iteration``/``arrival``/``first_token`` lines, the trace's ``iteration N``
annotations and kernel events, the load generator's summary JSON.
"""

from __future__ import annotations

import gzip
import json
import statistics

import pytest

from conftest import TEST_DATA
from tracestory.analysis.batching import STALL_MIN_NS, STALL_RATIO
from tracestory.cli import main

FOLDER = TEST_DATA / "serving" / "h200_serve_q12"


@pytest.fixture(scope="module")
def log_lines():
    with gzip.open(FOLDER / "torch" / "serve.sched.jsonl.gz", "rt") as f:
        return [json.loads(x) for x in f if x.strip()]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving_report")
    assert main(["report", str(FOLDER), "-o", str(out / "r.md"), "--json", str(out / "r.json")]) == 0
    return (out / "r.md").read_text(), json.loads((out / "r.json").read_text())


def test_stalls_match_the_log(log_lines, report):
    its = [x for x in log_lines if x["type"] == "iteration"]
    dur = [x["t_end_ns"] - x["t_start_ns"] for x in its]
    limit = max(STALL_RATIO * statistics.median(dur), STALL_MIN_NS)
    expected = [x["iter"] for x, d in zip(its, dur) if d >= limit]
    assert expected == [0, 615]       # warm-up, and the profiler's stop after the window
    arrivals = [x for x in log_lines if x["type"] == "arrival"]
    stalls = report[1]["batching"]["stalls"]
    assert [s["iter"] for s in stalls] == expected
    for s in stalls:
        it = next(x for x in its if x["iter"] == s["iter"])
        assert s["duration_ns"] == it["t_end_ns"] - it["t_start_ns"]
        assert s["arrivals_during"] == sum(it["t_start_ns"] <= a["t_ns"] < it["t_end_ns"] for a in arrivals)
    # the profiler's start (primed before the server listened) is no stall: iteration 600 is ordinary
    it600 = next(x for x in its if x["iter"] == 600)
    assert it600["t_end_ns"] - it600["t_start_ns"] < limit


def test_trace_window_and_client_view(report):
    with gzip.open(FOLDER / "torch" / "rank0.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert names == [f"iteration {i}" for i in range(600, 616)]
    text, doc = report
    assert doc["batching"]["trace"]["iterations"] == list(range(600, 616))
    assert "Joined with the trace (16 `iteration N` ranges, iterations 600-615, gpu side)" in text
    summary = json.loads((FOLDER / "torch" / "load.summary.json").read_text())["summary"]
    client = doc["batching"]["client"]
    assert (client["ok"], client["failed"], client["output_tokens"]) == (summary["ok"], summary["failed"],
                                                                          summary["output_tokens"])
    assert client["ttft"]["p50_ns"] == summary["ttft"]["p50_ns"]
    assert "Client side, as the load generator measured it (12 QPS Poisson for 15 s): 159 of 159" in text
    assert "- Iteration 615 at T=" in text and "the profiler's stop ran on the engine thread" in text


def test_report_of_the_capture_passes_the_checklist(report, tmp_path, capsys):
    path = tmp_path / "r.md"
    path.write_text(report[0])
    assert main(["check", str(path)]) == 0
    assert "0 FAIL" in capsys.readouterr().out


def test_traced_iterations_against_untraced_ones(log_lines, report):
    its = [x for x in log_lines if x["type"] == "iteration"]

    def kind(x):
        p = sum(m["tokens"] for m in x["members"] if m["phase"] == "prefill")
        d = sum(1 for m in x["members"] if m["phase"] == "decode")
        return ("decode-only" if not p else "prefill-only" if not d else "mixed"), p, d

    stalls = {0, 615}
    traced = [x for x in its if 600 <= x["iter"] <= 615 and x["iter"] not in stalls]
    window = {w["kind"]: w for w in report[1]["batching"]["window"]}
    for k in ("mixed", "decode-only"):
        mine = [x for x in traced if kind(x)[0] == k]
        ps, ds = [kind(x)[1] for x in mine], [kind(x)[2] for x in mine]
        others = [x["t_end_ns"] - x["t_start_ns"] for x in its
                  if not 600 <= x["iter"] <= 615 and x["iter"] not in stalls and kind(x)[0] == k
                  and min(ps) <= kind(x)[1] <= max(ps) and min(ds) <= kind(x)[2] <= max(ds)]
        w = window[k]
        assert (w["traced"], w["others"]) == (len(mine), len(others))
        assert w["traced_median_ns"] == statistics.median(x["t_end_ns"] - x["t_start_ns"] for x in mine)
        assert w["others_median_ns"] == statistics.median(others)
        assert w["traced_median_ns"] > 1.4 * w["others_median_ns"]   # the profiler's cost, seen on the H200
