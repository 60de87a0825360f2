"""The Python API's analysed kernel frame (category, phase, op columns) and findings as typed
records.

Second source for the frame: the H200 Kineto JSON read with ``json``: each kernel's launch call
(same correlation id), the innermost ``cpu_op`` of that thread around the call (the op), the
outermost one (the top-level op), and the ``user_annotation`` range around the call (the
phase: ``prefill``, ``decode_0`` .. ``decode_15``). For the findings: the JSON document, whose
shape stays as it was.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from conftest import H200_LLAMA

import tracestory
from tracestory.analysis.results import FindingRecord
from tracestory.analysis.findings import Evidence


@pytest.fixture(scope="module")
def results():
    return tracestory.analyze(H200_LLAMA)


def _expected_from_json():
    """(ts_ns, op, top_op, phase) per kernel, in start order, from the plain JSON."""
    with gzip.open(H200_LLAMA, "rt") as f:
        events = json.load(f)["traceEvents"]
    x = [e for e in events if e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in x if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "correlation" in e.get("args", {})}
    ops = [e for e in x if e.get("cat") == "cpu_op"]
    marks = [e for e in x if e.get("cat") == "user_annotation"]

    def inside(e, t, tid):
        return e["tid"] == tid and e["ts"] <= t < e["ts"] + e["dur"]

    out = []
    for k in sorted((e for e in x if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        call = calls.get(k["args"].get("correlation"))
        op = top = phase = None
        if call is not None:
            around = [o for o in ops if inside(o, call["ts"], call["tid"])]
            if around:
                op = min(around, key=lambda o: o["dur"])["name"]
                top = max(around, key=lambda o: o["dur"])["name"]
            ph = [m for m in marks if inside(m, call["ts"], call["tid"])]
            phase = ph[0]["name"] if ph else None
        out.append((k["name"], op, top, phase))
    return out


def test_kernels_frame_has_category_phase_and_op(results):
    df = results.kernels_frame()
    assert list(df.columns)[-4:] == ["category", "phase", "op", "top_op"]
    want = _expected_from_json()
    assert len(df) == len(want) == 848
    got = list(zip(df["name"], df["op"].astype(object).where(df["op"].notna(), None),
                   df["top_op"].astype(object).where(df["top_op"].notna(), None),
                   df["phase"].astype(object).where(df["phase"].notna(), None), strict=True))
    assert Counter(got) == Counter(want)
    # phases as the report tells them: a 512-token prefill and 16 decode steps
    assert sorted(df["phase"].dropna().unique()) == sorted(["prefill"] + [f"decode_{i}" for i in range(16)])


def test_kernels_frame_category_is_the_breakdown(results):
    df = results.kernels_frame()
    by_cat = df.groupby("category")["dur_ns"].agg(["count", "sum"])
    from tracestory.render.jsonout import document

    cats = document(results)["traces"][0]["categories"]
    kernel_cats = {c["name"]: c for c in cats if c["name"] not in ("memcpy", "memset")}
    assert {n: (int(r["count"]), int(r["sum"])) for n, r in by_cat.iterrows()} == \
        {n: (c["count"], c["time_ns"]) for n, c in kernel_cats.items()}
    assert set(df.loc[df["name"].str.startswith("nvjet_"), "category"]) == {"gemm"}


def test_findings_are_typed_records_matching_the_json(results):
    from tracestory.render.jsonout import document

    records = results.findings
    assert isinstance(records, tuple) and records and all(isinstance(f, FindingRecord) for f in records)
    assert tracestory.FindingRecord is FindingRecord
    doc = document(results)["traces"][0]["findings"]
    assert len(doc) == len(records)
    for rec, js in zip(records, doc, strict=True):
        assert set(js) == {"rule", "severity", "title", "evidence", "implication", "recommendation", "basis"}
        assert (rec.trace, rec.scope) == (results.runs[0].trace.label, "trace")
        assert (rec.rule, rec.severity, rec.title, rec.text, rec.recommendation, list(rec.basis)) == (
            js["rule"], js["severity"], js["title"], js["implication"], js["recommendation"], js["basis"])
        assert all(isinstance(e, Evidence) for e in rec.evidence)
        assert [(e.label, e.unit) for e in rec.evidence] == [(e["label"], e["unit"]) for e in js["evidence"]]
    with pytest.raises(AttributeError):
        records[0].title = "changed"   # frozen


def test_multigpu_findings_are_records_without_a_trace():
    from conftest import TEST_DATA

    results = tracestory.analyze(TEST_DATA / "multigpu" / "tp2_even")
    mg = [f for f in results.findings if f.scope == "multigpu"]
    assert len(mg) == len(results.multigpu_findings) > 0
    assert {f.trace for f in mg} == {None}
    per_trace = [f for f in results.findings if f.scope == "trace"]
    assert len(per_trace) == sum(len(r.findings) for r in results.runs)
