"""Ramp-up, sampling fields and --extra-body, non-streaming requests and the peak output token
throughput. Expected values: the rate formulas written out by hand, a direct numpy draw of the
documented gaps, the bodies the stub received, and hand-built records whose token times are
worked out below each test."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tracestory.errors import UsageError
from tracestory.loadgen import LoadConfig, RequestRecord, benchmark_result, parse_extra_body, result_lines, run_load
from tracestory.loadgen.arrivals import ramp_offsets_ns, ramp_rates
from tracestory.loadgen.generator import LoadResult, planned_offsets_ns
from tracestory.loadgen.metrics import peak_output_tokens_per_s
from tracestory.loadgen.warmup import warmup_config

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)


# ------------------------------------------------------------------ ramp-up

def test_ramp_rates_follow_the_formulas():
    # linear 2 -> 10 over 5 requests: progress 0, .25, .5, .75, 1 -> 2, 4, 6, 8, 10
    assert ramp_rates("linear", 2, 10, 5).tolist() == [2, 4, 6, 8, 10]
    # exponential 1 -> 16 over 5: 1 * 16^(i/4) = 1, 2, 4, 8, 16
    assert ramp_rates("exponential", 1, 16, 5) == pytest.approx([1, 2, 4, 8, 16])
    assert ramp_rates("linear", 3, 7, 1).tolist() == [3]              # one request: the start rate


def test_ramp_offsets_are_the_documented_gamma_gaps():
    got = ramp_offsets_ns("exponential", 1, 16, count=5, burstiness=2.0, seed=4)
    draws = np.random.default_rng(4).standard_gamma(2.0, size=4)
    rates = [2, 4, 8, 16]                                              # requests 1..4 of the ramp above
    want = [0.0] + list(np.cumsum([d / (r * 2.0) for d, r in zip(draws, rates, strict=True)]))
    assert got.tolist() == [round(t * 1e9) for t in want]
    # a very regular ramp (burstiness 1e6): each gap is 1 / r_i within 1%
    steady = ramp_offsets_ns("linear", 2, 10, count=5, burstiness=1e6, seed=0) / 1e9
    assert np.diff(steady) == pytest.approx([1 / 4, 1 / 6, 1 / 8, 1 / 10], rel=0.01)
    cfg = LoadConfig(url="http://h", model="m", num_requests=5, ramp_up_strategy="linear", ramp_up_start_rps=2,
                     ramp_up_end_rps=10, burstiness=1e6)
    assert planned_offsets_ns(cfg).tolist() == ramp_offsets_ns("linear", 2, 10, count=5, burstiness=1e6).tolist()


def test_ramp_cut_by_duration_keeps_arrivals_before_it():
    t = ramp_offsets_ns("linear", 2, 10, count=5, burstiness=1e6, seed=0) / 1e9
    # arrivals at about 0, .25, .417, .542, .642 s: a 0.5 s window keeps the first three
    assert ramp_offsets_ns("linear", 2, 10, count=5, burstiness=1e6, seed=0, duration_s=0.5).size == \
        int((t < 0.5).sum()) == 3


@pytest.mark.parametrize(("kw", "found"), [
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1}, "expected --ramp-up-start-rps and --ramp-up-end-rps"),
    ({"ramp_up_start_rps": 1, "ramp_up_end_rps": 2}, "expected with --ramp-up-strategy"),
    ({"ramp_up_strategy": "exponential", "ramp_up_start_rps": 0, "ramp_up_end_rps": 2}, "expected > 0 with"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 5, "ramp_up_end_rps": 2}, "expected at most"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 2, "request_rate": 3},
     "expected none with --ramp-up-strategy"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 2, "num_requests": None,
      "duration_s": 5}, "expected --num-prompts"),
    ({"ramp_up_strategy": "step", "ramp_up_start_rps": 1, "ramp_up_end_rps": 2}, "expected linear or exponential"),
])
def test_ramp_settings_are_checked(kw, found):
    base = {"url": "http://h", "model": "m", "num_requests": 4}
    base.update(kw)
    with pytest.raises(UsageError, match=found):
        LoadConfig(**base).validate()


def test_warmup_of_a_ramp_runs_at_its_start_rate():
    cfg = LoadConfig(url="http://h", model="m", num_requests=40, ramp_up_strategy="linear", ramp_up_start_rps=3,
                     ramp_up_end_rps=9)
    w = warmup_config(cfg, 4, None)
    assert (w.ramp_up_strategy, w.request_rate, w.num_requests) == (None, 3, 4)
    w.validate()


def test_ramp_run_sends_every_planned_request_at_its_time(stub_server):
    url = stub_server(Stub())
    cfg = LoadConfig(url=url, model="m", num_requests=6, prompt_len_min=2, prompt_len_max=2, max_new_tokens=2,
                     ramp_up_strategy="linear", ramp_up_start_rps=20, ramp_up_end_rps=60, timeout_s=5)
    result = run_load(cfg)
    plan = ramp_offsets_ns("linear", 20, 60, count=6, seed=0)
    assert [r.scheduled_ns for r in result.records] == plan.tolist()
    assert all(r.ok and r.send_ns >= r.scheduled_ns for r in result.records)


# ------------------------------------------------------------------ bodies


def test_bodies_carry_greedy_temperature_by_default_and_the_given_sampling(stub_server):
    stub = Stub()
    url = stub_server(stub)
    base = {"url": url, "model": "m", "num_requests": 1, "prompt_len_min": 2, "prompt_len_max": 2,
            "max_new_tokens": 2, "timeout_s": 5}
    run_load(LoadConfig(**base))
    assert stub.bodies[-1]["temperature"] == 0.0 and "top_p" not in stub.bodies[-1]
    extra = parse_extra_body('{"priority": 3, "top_k": 5, "repetition_penalty": 1.1}')
    run_load(LoadConfig(**base, temperature=0.6, top_p=0.9, top_k=40, min_p=0.05, extra_body=extra))
    body = stub.bodies[-1]
    assert (body["temperature"], body["top_p"], body["min_p"]) == (0.6, 0.9, 0.05)
    assert body["top_k"] == 5                                          # --extra-body is merged last
    assert (body["priority"], body["repetition_penalty"]) == (3, 1.1)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("text", "found"), [
    ("[1, 2]", "expected a JSON object, found a JSON list"),
    ("{bad", "found unreadable JSON"),
])
def test_extra_body_must_be_a_json_object(text, found):
    with pytest.raises(UsageError, match=found):
        parse_extra_body(text)


@pytest.mark.parametrize(("kw", "found"), [
    ({"extra_body": {"stream": False}}, "--extra-body: expected no 'stream'"),
    ({"extra_body": {"model": "x", "prompt": "y"}}, "expected no 'model', 'prompt'"),
    ({"temperature": -1.0}, "--temperature: expected a number >= 0"),
    ({"top_p": 0.0}, r"--top-p: expected a number in \(0, 1\]"),
    ({"top_k": -3}, "--top-k: expected an integer >= 1"),
    ({"min_p": 1.5}, r"--min-p: expected a number in \[0, 1\]"),
])
def test_sampling_settings_are_checked(kw, found):
    with pytest.raises(UsageError, match=found):
        LoadConfig(url="http://h", model="m", **kw).validate()


# ------------------------------------------------------------------ non-streaming


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_no_stream_records_e2e_only_and_usage_tokens(stub_server, endpoint):
    stub = Stub()
    url = stub_server(stub)
    cfg = LoadConfig(url=url, model="m", endpoint=endpoint, num_requests=3, concurrency=1, prompt_len_min=4,
                     prompt_len_max=4, max_new_tokens=5, stream=False, timeout_s=5)
    result = run_load(cfg)
    assert all(b["stream"] is False and "stream_options" not in b for b in stub.bodies)
    for k, r in enumerate(result.records):
        assert r.ok and r.ttft_ns is None and r.itl_ns == () and r.tpot_ns is None and r.e2e_ns > 0
        # the stub's usage: prompt 1000 + k % 24, completion = max_tokens
        assert (r.prompt_tokens, r.output_tokens, r.output_tokens_source) == (1000 + k, 5, "usage")
    res = benchmark_result(result, ("ttft", "tpot", "itl", "e2el"), (50,))
    assert res["mean_ttft_ms"] is None and res["mean_itl_ms"] is None and res["max_output_tokens_per_s"] is None
    assert res["mean_e2el_ms"] == pytest.approx(np.mean([r.e2e_ns / 1e6 for r in result.records]))
    lines = result_lines(res, cfg, ("ttft",), (50,))
    assert any(x.startswith("Non-streaming requests (--no-stream)") for x in lines)


def test_no_stream_without_usage_counts_the_text_words(stub_server):
    url = stub_server(Stub(usage=False))
    result = run_load(LoadConfig(url=url, model="m", num_requests=2, prompt_len_min=3, prompt_len_max=3,
                                 max_new_tokens=6, stream=False, timeout_s=5))
    # the stub's text is " t0 t1 ... t5": 6 words
    assert [(r.output_tokens, r.output_tokens_source, r.prompt_tokens) for r in result.records] == [(6, "text", 3)] * 2


def test_no_stream_answer_that_is_not_a_completion_is_malformed(stub_server):
    url = stub_server(Stub({0: "500", 1: "json"}))
    result = run_load(LoadConfig(url=url, model="m", num_requests=3, concurrency=1, prompt_len_min=2,
                                 prompt_len_max=2, max_new_tokens=2, stream=False, timeout_s=5))
    # request 1: the stub's "json" behaviour answers {"choices": [{"text": "x"}]}: a completion of one word
    assert [r.error_kind for r in result.records] == ["http_status", None, None]
    assert result.records[1].output_tokens == 1 and result.records[1].output_tokens_source == "text"


# ------------------------------------------------------------------ peak output throughput


def rec(index, send_s, ttft_s, itl_s, ok=True) -> RequestRecord:
    ns = [round(x * 1e9) for x in itl_s]
    e2e = round((ttft_s + sum(itl_s)) * 1e9) + 1
    return RequestRecord(index=index, scheduled_ns=None, send_ns=round(send_s * 1e9),
                         end_ns=round(send_s * 1e9) + e2e, ok=ok, error_kind=None if ok else "http_status",
                         http_status=None, error=None, ttft_ns=round(ttft_s * 1e9) if ok else None,
                         itl_ns=tuple(ns) if ok else (), e2e_ns=e2e if ok else None, prompt_tokens=4,
                         prompt_tokens_source="usage", output_tokens=len(itl_s) + 1, output_tokens_source="usage",
                         response_id=None)


def test_peak_output_throughput_counts_token_events_in_one_second_bins():
    records = [
        rec(0, 0.2, 0.5, [0.2, 0.2, 0.2]),      # tokens at 0.7, 0.9, 1.1, 1.3 s
        rec(1, 0.6, 0.2, [0.1, 0.5, 0.1]),      # tokens at 0.8, 0.9, 1.4, 1.5 s
        rec(2, 1.0, 0.1, [0.05]),               # tokens at 1.1, 1.15 s
        rec(3, 0.0, 0.0, [], ok=False),         # failed: not counted, and not the bins' start
    ]
    # bins start at the earliest OK send, 0.2 s: [0.2, 1.2) holds 0.7 0.9 1.1 0.8 0.9 1.1 1.15 = 7,
    # [1.2, 2.2) holds 1.3 1.4 1.5 = 3
    assert peak_output_tokens_per_s(records) == 7.0
    assert peak_output_tokens_per_s(records[3:]) is None
    result = LoadResult(config=LoadConfig(url="http://h", model="m"), records=tuple(records), t0_unix_ns=0,
                        elapsed_ns=2_000_000_000, send_window_ns=1_000_000_000, interrupted=False, deadline_hit=False)
    res = benchmark_result(result)
    assert res["max_output_tokens_per_s"] == 7.0
    lines = result_lines(res, result.config, ("ttft",), (99,))
    i = lines.index(next(x for x in lines if x.startswith("Output token throughput")))
    assert lines[i + 1].split() == ["Peak", "output", "token", "throughput", "(tok/s):", "7.00"]
    assert lines[i + 2].startswith("Peak concurrent requests:")


def test_cli_flags_reach_the_server(stub_server, tmp_path):
    stub = Stub()
    url = stub_server(stub)
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--url", url, "--model", "m",
                        "--num-prompts", "3", "--random-input-len", "3", "--random-output-len", "2",
                        "--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "10", "--ramp-up-end-rps", "40",
                        "--temperature", "0.5", "--top-p", "0.8", "--top-k", "7", "--extra-body", '{"priority": 2}',
                        "--no-stream", "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json",
                        "--no-progress", "--skip-power-monitor"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-1500:]
    assert len(stub.bodies) == 3
    assert all((b["temperature"], b["top_p"], b["top_k"], b["priority"], b["stream"]) == (0.5, 0.8, 7, 2, False)
               for b in stub.bodies)
    res = json.loads(out.read_text())
    assert (res["ramp_up_strategy"], res["ramp_up_start_rps"], res["ramp_up_end_rps"]) == ("exponential", 10, 40)
    assert res["stream"] is False and res["sampling"] == {"temperature": 0.5, "top_p": 0.8, "top_k": 7}
    assert res["extra_body"] == {"priority": 2} and res["completed"] == 3 and res["max_output_tokens_per_s"] is None
    assert "Ramp-up: exponential from 10 to 40 requests/s" in p.stdout
