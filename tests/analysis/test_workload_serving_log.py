"""A scheduler event log given with a trace names the workload when the trace's own names cannot
(the serving engine replays its steps from CUDA graphs, so no op names a model block)."""

from __future__ import annotations

import gzip
import json

from conftest import TEST_DATA

from tracestory.analysis.results import analyze_inputs
from tracestory.ingest import load_inputs

FOLDER = TEST_DATA / "tp_serve_gpu" / "torch"


def test_the_log_names_llm_serving_and_the_trace_alone_does_not():
    meta = json.loads(gzip.open(FOLDER / "serve.sched.jsonl.gz").readline())
    assert meta["type"] == "meta" and meta["engine"] == "tracestory-serve"
    alone = analyze_inputs(load_inputs([FOLDER / "rank0.trace.json.gz"])).runs[0].workload
    assert alone.kind != "llm_serving"
    with_log = analyze_inputs(load_inputs([FOLDER / "rank0.trace.json.gz", FOLDER / "serve.sched.jsonl.gz"]))
    w = with_log.runs[0].workload
    assert w.kind == "llm_serving"
    assert meta["engine"] in w.evidence[0] and meta["model"] in w.evidence[0]
