"""Served model names (404 for others, as vLLM answers) and the Prometheus /metrics endpoint.

Expected values: the engine scenario is the scheduler's hand-worked preemption case written out
below; the real-server counters are the sums of the prompt lengths and max_tokens this test
sends; the iteration histogram is checked against the iteration lines of the event log the
same server wrote.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tracestory.serve import ServeOptions, prompt_of_tokens, start_server_thread, wait_healthy
from tracestory.serve.engine import Engine
from tracestory.serve.eventlog import EventLog
from tracestory.serve.metrics import ServerMetrics
from tracestory.serve.scheduler import Scheduler, SchedulerConfig


class _ScriptedModel:
    """Samples token 7 for every sampling member; the first step waits until ``release`` is set."""

    def __init__(self):
        self.release = threading.Event()
        self.steps = 0

    def step(self, members, iteration):
        self.steps += 1
        if self.steps == 1:
            assert self.release.wait(10)
        return {m.request_id: 7 for m in members if m.samples}

    def memory(self):
        return None


def test_engine_counts_tokens_preemptions_and_iterations():
    # 3 blocks of 2 tokens; A and B: prompt 2, 4 new tokens (5 KV slots each, 6 exist).
    # iter 0: A alone (B not yet submitted) prefills 2 tokens, 1 block, first token.
    # iter 1: A decodes (2nd block); B is admitted into the last block, first token.
    # iter 2: A decodes into its 2nd block; B needs a block, none free: B (youngest) is preempted.
    # iter 3: A takes the freed block and finishes (4 tokens); B waits (needs 2 blocks, 0 free).
    # iter 4: B re-prefills prompt + 1 output (3 tokens) and samples; iter 5, 6: decodes, finishes.
    # So: 7 iterations, 1 preemption, 8 tokens generated, prompt tokens 2 + 2 (B counted once).
    model = _ScriptedModel()
    metrics = ServerMetrics("m")
    engine = Engine(Scheduler(SchedulerConfig(block_size=2, num_blocks=3, max_batch_tokens=8, max_num_seqs=4)),
                    model, EventLog(None, {}), metrics)
    done = {}
    finished = threading.Event()

    def sink_of(rid):
        def sink(kind, payload):
            if kind == "finish":
                done[rid] = payload
                if len(done) == 2:
                    finished.set()
        return sink

    engine.start()
    try:
        engine.submit("A", [1, 2], 4, False, sink_of("A"))
        while model.steps == 0:                        # iteration 0 runs A alone
            threading.Event().wait(0.005)
        engine.submit("B", [3, 4], 4, False, sink_of("B"))
        model.release.set()
        assert finished.wait(10)
    finally:
        engine.stop()
    assert {r: (f.reason, f.output_tokens) for r, f in done.items()} == {"A": ("length", 4), "B": ("length", 4)}

    def value(name):
        return metrics.registry.get_sample_value(name, {"model_name": "m"})

    assert value("tracestory:num_preemptions_total") == 1
    assert value("tracestory:prompt_tokens_total") == 4
    assert value("tracestory:generation_tokens_total") == 8
    assert value("tracestory:iteration_time_seconds_count") == 7
    assert (value("tracestory:num_requests_running"), value("tracestory:num_requests_waiting")) == (0, 0)
    assert value("tracestory:kv_cache_usage_perc") == 0


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def named_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("metrics") / "sched.jsonl"
    h = start_server_thread(ServeOptions(port=0, served_model_names=("tiny-a", "tiny-b"), block_size=4,
                                         num_blocks=64, max_batch_tokens=16, event_log=str(log)))
    wait_healthy(h.url, timeout_s=10)
    yield h, log
    h.stop()


def test_unknown_model_is_404_and_served_names_are_listed(named_server):
    h, _ = named_server
    with urllib.request.urlopen(h.url + "/v1/models", timeout=10) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["tiny-a", "tiny-b"]
    for path, body in (("/v1/completions", {"model": "llama", "prompt": "t1 t2", "max_tokens": 2}),
                       ("/v1/chat/completions", {"model": "llama", "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": "t1"}]})):
        status, err = _post(h.url + path, body)
        assert status == 404
        assert err["error"] == {"message": "The model `llama` does not exist.", "type": "NotFoundError",
                                "param": "model", "code": 404}
    status, err = _post(h.url + "/v1/completions", {"model": 3, "prompt": "t1"})
    assert status == 400 and err["error"]["param"] == "model"
    # the second served name is accepted; responses carry the first one
    status, ok = _post(h.url + "/v1/completions", {"model": "tiny-b", "prompt": "t1 t2", "max_tokens": 2})
    assert status == 200 and ok["model"] == "tiny-a"


def test_metrics_endpoint_after_known_requests(named_server):
    h, log = named_server
    before = _scrape(h.url)
    # prompts of 5, 9 and 30 tokens (30 > the 16-token budget: chunked), 3 + 4 + 6 new tokens;
    # one request without "model" (served by the first name)
    for n, out, model in ((5, 3, "tiny-a"), (9, 4, None), (30, 6, "tiny-b")):
        body = {"prompt": prompt_of_tokens(n, seed=n), "max_tokens": out, "ignore_eos": True}
        if model:
            body["model"] = model
        status, resp = _post(h.url + "/v1/completions", body)
        assert status == 200 and resp["usage"]["completion_tokens"] == out
    after = _scrape(h.url)
    assert after["tracestory:prompt_tokens_total"] - before["tracestory:prompt_tokens_total"] == 5 + 9 + 30
    assert after["tracestory:generation_tokens_total"] - before["tracestory:generation_tokens_total"] == 3 + 4 + 6
    assert after["tracestory:num_preemptions_total"] == 0          # 64 blocks x 4 hold every request
    assert after["tracestory:num_requests_running"] == after["tracestory:num_requests_waiting"] == 0
    assert after["tracestory:kv_cache_usage_perc"] == 0
    # the histogram holds one sample per iteration line of the event log, with the same durations
    iters = [o for o in map(json.loads, log.read_text().splitlines()) if o["type"] == "iteration"]
    assert after["tracestory:iteration_time_seconds_count"] == len(iters) > 0
    assert after["tracestory:iteration_time_seconds_sum"] == pytest.approx(
        sum(o["t_end_ns"] - o["t_start_ns"] for o in iters) / 1e9, rel=1e-9, abs=1e-9)


def _scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics by name (the single label is model_name="tiny-a"; refusals are
    keyed ``name{reason}``)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "reason" in s.labels:
                assert s.labels["model_name"] == "tiny-a", s
                out[f"{s.name}{{{s.labels['reason']}}}"] = s.value
            elif "le" not in s.labels:
                assert s.labels == {"model_name": "tiny-a"}, s
                out[s.name] = s.value
    return out
