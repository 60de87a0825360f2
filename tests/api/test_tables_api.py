"""The notebook API: ``Trace.kernels_frame()``, ``Results.table(name, run)``, short reprs, and
GPU time per operator in the report and its JSON (``traces[].operators``).

Second sources: ``json.load`` of the Kineto files. Kernel events are counted and their
durations summed as ``round(dur_us * 1000)`` ns; per-op sums give each GPU event to its launch
call by ``correlation``, then to the longest ``cpu_op`` of the launch's pid and tid whose span
contains the launch's ts (the top-level op), grouped by name, ``Input Dims`` and ``Input type``.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest
from conftest import A100_NCCL, H100_BERT, H200_LLAMA

import tracestory
from tracestory.analysis import results as results_module
from tracestory.errors import UsageError
from tracestory.render.build import write_report


def _events(path):
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _ns(us: float) -> int:
    return int(round(us * 1000.0))


def _top_level_sums(path):
    """{(name, dims json, types json): gpu_ns} of the top-level cpu_ops, from the file."""
    events = _events(path)
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops = [e for e in events if e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#")]
    rows = defaultdict(int)
    for g in events:
        launch = launches.get(g.get("args", {}).get("correlation")) if g.get("cat") in (
            "kernel", "gpu_memcpy", "gpu_memset") else None
        if launch is None:
            continue
        t = _ns(launch["ts"])
        chain = [o for o in ops if o["pid"] == launch["pid"] and o["tid"] == launch["tid"]
                 and _ns(o["ts"]) <= t < _ns(o["ts"]) + _ns(o["dur"])]
        if chain:
            top = max(chain, key=lambda o: _ns(o["dur"]))
            a = top["args"]
            rows[(top["name"], json.dumps(a.get("Input Dims")), json.dumps(a.get("Input type")))] += _ns(g["dur"])
    return dict(rows)


def test_kernels_frame_has_real_names_and_the_files_durations():
    events = [e for e in _events(H100_BERT) if e.get("cat") == "kernel"]
    trace = tracestory.load(H100_BERT)
    df = trace.kernels_frame()
    assert len(df) == len(events) == 60
    assert {"name", "start_ns", "end_ns", "dur_ns", "grid_x", "block_x", "shared_mem_bytes"} <= set(df.columns)
    assert set(df["name"]) == {e["name"] for e in events}
    assert int(df["dur_ns"].sum()) == sum(_ns(e["dur"]) for e in events)
    per_name = df.groupby("name")["dur_ns"].sum().to_dict()
    want = defaultdict(int)
    for e in events:
        want[e["name"]] += _ns(e["dur"])
    assert per_name == dict(want)
    # grid as the file records it (first kernel by start time, by hand: indexSelectLargeIndex, [564, 1, 1])
    first = min(events, key=lambda e: e["ts"])
    assert [int(df.loc[0, c]) for c in ("grid_x", "grid_y", "grid_z")] == first["args"]["grid"] == [564, 1, 1]


def test_reprs_are_one_short_line():
    trace = tracestory.load(H200_LLAMA)
    results = tracestory.analyze(trace)
    for obj in (trace, results, results.runs[0], results.table("ops")):
        text = repr(obj)
        assert "\n" not in text and len(text) < 300, text
    assert repr(trace).startswith("Trace('llama2layer_eager_decode.trace.json.gz', kineto, kernels=848")


def test_results_table_per_run_and_for_every_run():
    results = tracestory.analyze([H100_BERT, H200_LLAMA])
    one = [results.table("kernels", i) for i in range(2)]
    both = results.table("kernels", run=None)
    assert list(both.columns)[0] == "trace" and len(both) == sum(len(t) for t in one)
    for path, t in zip((H100_BERT, H200_LLAMA), one):
        kernels = [e for e in _events(path) if e.get("cat") == "kernel"]
        assert int(sum(t["count"])) == len(kernels)
        assert int(sum(t["total_ns"])) == sum(_ns(e["dur"]) for e in kernels)
    df = both.to_pandas()
    assert df.groupby("trace")["count"].sum().to_dict() == {"kineto_h100_bert-small_1rank.json.gz": 60,
                                                            "llama2layer_eager_decode.trace.json.gz": 848}
    with pytest.raises(UsageError, match="unknown table 'opz'"):
        results.table("opz")


def test_ops_table_and_the_modules_table_from_the_file():
    results = tracestory.analyze(H100_BERT)
    want = _top_level_sums(H100_BERT)
    ops = results.table("ops")
    got = {(n, json.dumps(json.loads(d)), json.dumps(json.loads(ty))): int(ns)
           for n, k, d, ty, ns in zip(ops["name"], ops["kind"], ops["input_dims"], ops["input_types"], ops["total_ns"])
           if k == "op"}
    assert got == want
    modules = results.table("modules")
    # one BertLMHeadModel_0 call spans the whole forward (hand reading of the file's nn.Module events)
    assert modules["path"][0] == "BertLMHeadModel_0"
    assert int(modules["total_ns"][0]) == sum(_ns(e["dur"]) for e in _events(H100_BERT)
                                              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))


def test_report_and_json_carry_the_ten_largest_op_groups(tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    write_report(tracestory.analyze(H100_BERT), md, json_path=js)
    doc = json.loads(js.read_text())["traces"][0]["operators"]
    want = sorted(_top_level_sums(H100_BERT).items(), key=lambda kv: -kv[1])[:10]
    rows = doc["top_level"]
    assert doc["computed"] is True and len(rows) == 10
    assert [r["gpu_ns"] for r in rows] == [ns for _, ns in want]
    assert {(r["name"], json.dumps(json.loads(r["input_dims"]))) for r in rows} == {(k[0], k[1]) for k, _ in want}
    text = md.read_text()
    part = text[text.index("**GPU time per operator**"):text.index("**Timeline**")]
    # by hand from the file: 17 aten::linear calls on [[1, 141, 512], [512, 512], [512]] lead
    assert "| `aten::linear` | `[[1, 141, 512], [512, 512], [512]]` |" in part.splitlines()[4]
    assert sum(1 for ln in part.splitlines() if ln.startswith("| `aten::")) == 10


def test_a_trace_with_too_many_ops_gets_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(results_module, "REPORT_MAX_OPS", 1000)
    n_ops = sum(e.get("cat") == "cpu_op" for e in _events(A100_NCCL))
    assert n_ops > 1000
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    results = tracestory.analyze(A100_NCCL)
    write_report(results, md, json_path=js)
    doc = json.loads(js.read_text())["traces"][0]["operators"]
    trace = results.runs[0].trace
    assert doc == {"computed": False, "op_count": n_ops + len(trace.ranges), "op_limit": 1000}
    assert set(results.runs[0]._cache) <= {"story"}   # operators not computed for the report
    lines = [ln for ln in md.read_text().splitlines() if ln.startswith("**GPU time per operator**")]
    assert len(lines) == 1 and "`tracestory analyze --table ops` gives it" in lines[0]
