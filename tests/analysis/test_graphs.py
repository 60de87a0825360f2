"""Graph replays against a plain reading of the field traces' JSON: kernels whose correlation id
belongs to a ``*GraphLaunch`` runtime call are graph-replayed."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import TEST_DATA

from tracestory.analysis.graphs import graph_replays
from tracestory.ingest import load_inputs

SGLANG = TEST_DATA / "field" / "AMD-AGI_TraceLens__mi300x_sglang_qwen3-8b_decode_hipgraph.json.gz"
BERT = TEST_DATA / "public" / "kineto_h100_bert-small_1rank.json.gz"


def _plain(path):
    """(graph launches, graph kernels, direct kernels, unlinked kernels) from the JSON alone."""
    ev = json.load(gzip.open(path))["traceEvents"]
    runtime = {e["args"]["correlation"]: e["name"] for e in ev
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    graph = sum(1 for n in runtime.values() if "GraphLaunch" in n)
    kinds = {"graph": 0, "direct": 0, "unlinked": 0}
    for e in ev:
        if e.get("cat") != "kernel":
            continue
        name = runtime.get(e["args"].get("correlation"))
        kinds["unlinked" if name is None else "graph" if "GraphLaunch" in name else "direct"] += 1
    return graph, kinds


def test_sglang_decode_is_one_graph_replay():
    graph_calls, kinds = _plain(SGLANG)
    # Read from the JSON: one hipGraphLaunch replays 544 of the 555 kernels; 11 are launched directly
    # (hipLaunchKernel x10, hipModuleLaunchKernel x1).
    assert (graph_calls, kinds["graph"], kinds["direct"]) == (1, 544, 11)
    (t,) = load_inputs([SGLANG]).traces
    g = graph_replays(t)
    assert (g.graph_launches, g.graph_kernels, g.direct_kernels, g.unlinked_kernels) == (1, 544, 11, 0)
    assert g.max_kernels_per_graph_launch == 544 and g.replays_graphs


def test_eager_trace_has_no_graphs():
    graph_calls, kinds = _plain(BERT)
    (t,) = load_inputs([BERT]).traces
    g = graph_replays(t)
    assert graph_calls == 0 and g.graph_launches == 0 and g.graph_kernels == 0
    assert (g.direct_kernels, g.unlinked_kernels) == (kinds["direct"], kinds["unlinked"])
    assert not g.replays_graphs


GRAPH_RUNS = [TEST_DATA / "compare" / "decode_max-autotune_b.trace.json.gz",   # torch.compile max-autotune
              *(TEST_DATA / "graphs" / f"{n}.trace.json.gz" for n in ("reduce_overhead_decode", "manual_graph_decode",
                                                                    "mixed_graph_eager"))]


@pytest.mark.parametrize("path", GRAPH_RUNS, ids=[p.name.split(".")[0] for p in GRAPH_RUNS])
def test_graph_runs_match_plain_reading(path):
    graph_calls, kinds = _plain(path)
    (t,) = load_inputs([path]).traces
    g = graph_replays(t)
    assert graph_calls >= 1 and kinds["graph"] > kinds["direct"]
    assert (g.graph_launches, g.graph_kernels, g.direct_kernels) == (graph_calls, kinds["graph"], kinds["direct"])
    assert g.replays_graphs


def test_flex_attention_run_has_no_graphs():
    path = TEST_DATA / "graphs" / "flex_prefill_decode.trace.json.gz"
    graph_calls, kinds = _plain(path)
    g = graph_replays(load_inputs([path]).traces[0])
    assert graph_calls == 0 == g.graph_kernels and g.direct_kernels == kinds["direct"] > 0
