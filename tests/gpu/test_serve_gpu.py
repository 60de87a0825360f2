"""The serving engine on a CUDA GPU: decode CUDA graphs, FlexAttention over the paged cache,
and a served request with graphs on (run on the device machine).

Expected tokens come from a second path: the same model with the graphs' body run without a
graph (same kernels: bitwise the same ids), and the SDPA gather path (another attention
implementation, float32: the same greedy ids on these random weights)."""

import json
import random
import urllib.request

import pytest
import torch

from tracestory.models.llama_config import LlamaConfig
from tracestory.serve import ServeOptions, prompt_of_tokens, start_server_thread, wait_healthy
from tracestory.serve.model import PagedLlama
from tracestory.serve.scheduler import Scheduler, SchedulerConfig

pytestmark = pytest.mark.gpu

BS, NB, SEQS, BUDGET = 16, 96, 4, 64


def _run(attention, prepare, graphs=True, mixed=True, replay=True):
    """A continuous-batching run over 7 ragged requests (chunked prefills, decode at batch 1..4).
    ``mixed``: prefill/mixed buckets built; ``replay=False``: the graphs are captured but their
    bodies run instead (same kernels, no replay)."""
    cfg = LlamaConfig.from_name("llama-3-8b")
    m = PagedLlama(cfg, layers=2, num_blocks=NB, block_size=BS, vocab=1024, device="cuda", dtype=torch.float32,
                   seed=2, attention=attention)
    if prepare:
        m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET, cuda_graphs=graphs, mixed_graphs=mixed)
        if not replay:
            m._graphs.use_graphs = False
            m._mixed.use_graphs = False
    s = Scheduler(SchedulerConfig(block_size=BS, num_blocks=NB, max_batch_tokens=BUDGET, max_num_seqs=SEQS))
    rng = random.Random(0)
    for i in range(7):
        s.add_request(f"r{i}", [rng.randrange(1024) for _ in range(rng.randrange(5, 150))], rng.randrange(3, 40))
    out, paths = {}, []
    while s.has_work:
        p = s.schedule()
        launch = m.launch(p.members, p.iteration)
        paths.append(launch.path)
        for rid, tok in s.complete(p, launch.result()).new_tokens:
            out.setdefault(rid, []).append(tok)
    return out, paths


def _first_difference(a, b):
    for rid in sorted(a):
        if a[rid] != b.get(rid):
            return rid, a[rid], b.get(rid)
    return None


def test_graph_replay_gives_the_tokens_of_the_same_body_run_eagerly():
    graph, paths = _run("flex", prepare=True, graphs=True)
    # decode-only iterations and the prefill/mixed ones both replay graphs
    assert paths.count("graph") > 10 and paths.count("mixed-graph") >= 3 and "eager" not in paths
    bodies, bpaths = _run("flex", prepare=True, graphs=True, replay=False)
    assert {"static", "mixed-static"} <= set(bpaths) and not {"graph", "mixed-graph"} & set(bpaths)
    assert _first_difference(graph, bodies) is None
    static, spaths = _run("flex", prepare=True, graphs=False)
    assert "static" in spaths and "graph" not in spaths
    assert _first_difference(graph, static) is None


def test_flex_on_cuda_gives_the_tokens_of_sdpa():
    flex, _ = _run("flex", prepare=True, graphs=True)
    sdpa, _ = _run("sdpa", prepare=False)
    assert _first_difference(flex, sdpa) is None
    # without the prefill/mixed buckets those iterations run eagerly, with the same tokens
    eager_mixed, paths = _run("flex", prepare=True, graphs=True, mixed=False)
    assert "eager" in paths and "mixed-graph" not in paths
    assert _first_difference(eager_mixed, sdpa) is None


def test_served_request_completes_with_graphs(tmp_path):
    log = tmp_path / "sched.jsonl"
    h = start_server_thread(ServeOptions(port=0, device="cuda", preset="llama-3-8b", layers=2, max_num_seqs=8,
                                         num_blocks=256, max_batch_tokens=128, event_log=str(log)))
    try:
        wait_healthy(h.url, timeout_s=60)
        outs = []
        for n in (40, 300):
            body = {"model": "llama-3-8b", "prompt": prompt_of_tokens(n, seed=n), "max_tokens": 24, "ignore_eos": True}
            req = urllib.request.Request(h.url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                outs.append(json.loads(r.read()))
    finally:
        h.stop()
    assert [o["usage"]["completion_tokens"] for o in outs] == [24, 24]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    meta = lines[0]
    assert meta["attention_backend"] == "flex" and meta["startup"]["cuda_graphs"] is True
    assert meta["startup"]["decode_buckets"] == [1, 2, 4, 8] and meta["startup"]["compile_s"] > 0
    # chunk rows 128 (the budget) x decode rows 0, 1, 2, 4, 8: one graph each
    assert meta["startup"]["chunk_rows"] == [128] and meta["startup"]["mixed_graphs"] == 5
    decode = [o for o in lines if o["type"] == "iteration" and o["prefill_tokens"] == 0]
    assert len(decode) >= 20
