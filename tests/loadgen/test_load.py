"""tracestory load: against a stub SSE server in this file (every failure kind, exact counts,
not-sent accounting, bounds) and against the real reference server ``tracestory serve --preset
tiny --device cpu`` on loopback (token counts, injected HTTP 500s, a server killed mid-run, every
metric of the vLLM-style result recomputed from the streamed records with the statistics
module). Expected numbers come from the stub's own behaviour table, the server's documented
rules, a direct numpy draw, or plain Python over the records."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tracestory.loadgen import LoadConfig, RequestRecord, benchmark_result, run_load, summarize
from tracestory.loadgen.generator import LoadResult

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)

def cfg(url, **kw) -> LoadConfig:
    base = {"url": url, "model": "m", "concurrency": 1, "duration_s": 20, "num_requests": 4, "prompt_len_min": 3,
            "prompt_len_max": 9, "max_new_tokens": 5, "timeout_s": 5}
    base.update(kw)
    return LoadConfig(**base)


def test_every_failure_kind_is_counted_separately(stub_server):
    behaviors = {1: "500", 2: "disconnect", 3: "badjson", 4: "nodone", 5: "stream_error", 6: "json",
                 7: "notsse", 8: "429", 10: "500"}
    url = stub_server(Stub(behaviors))
    # concurrency 1: request index k is the stub's request number k
    result = run_load(cfg(url, num_requests=12))
    kinds = [r.error_kind for r in result.records]
    assert kinds == [None, "http_status", "server_disconnect", "malformed_stream", "malformed_stream",
                     "stream_error", "malformed_stream", "malformed_stream", "http_status", None, "http_status", None]
    assert [r.http_status for r in result.records if r.error_kind == "http_status"] == [500, 429, 500]
    s = summarize(result)
    assert s.ok == 3 and s.failed == 9 and s.planned == 12
    assert s.failures == {"http_429": 1, "http_500": 2, "malformed_stream": 4, "server_disconnect": 1,
                          "stream_error": 1}
    ok = [r for r in result.records if r.ok]
    # usage chunk: prompt 1000 + k % 24, completion = max_tokens; 5 token events -> 4 gaps
    assert [r.prompt_tokens for r in ok] == [1000, 1009, 1011]
    assert all(r.output_tokens == 5 and r.output_tokens_source == "usage" and len(r.itl_ns) == 4 for r in ok)
    assert all(r.ttft_ns > 0 and r.e2e_ns >= r.ttft_ns + sum(r.itl_ns) for r in ok)


def test_counts_chunks_without_usage_and_chat_role_delta_is_not_a_token(stub_server):
    stub = Stub(usage=False)
    url = stub_server(stub)
    result = run_load(cfg(url, endpoint="chat", num_requests=3, max_new_tokens=7, seed=3))
    assert all(r.ok and r.output_tokens == 7 and r.output_tokens_source == "chunks" for r in result.records)
    # no usage: the prompt length is the planned one, uniform in [3, 9] from default_rng([seed, 1])
    planned = np.random.default_rng([3, 1]).integers(3, 10, size=3)
    assert [r.prompt_tokens for r in result.records] == planned.tolist()
    assert [r.prompt_tokens_source for r in result.records] == ["planned"] * 3
    sent = stub.bodies[0]
    assert sent["stream"] is True and sent["max_tokens"] == 7
    assert len(sent["messages"][0]["content"].split()) == planned[0]   # the t<k> word rule: one token a word


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return port


def test_connection_refused_poisson_every_arrival_has_a_record_and_sending_backs_off():
    port = closed_port()
    qps, duration, seed = 40.0, 0.5, 7
    t0 = time.monotonic()
    result = run_load(LoadConfig(url=f"http://127.0.0.1:{port}", model="m", target_qps=qps, duration_s=duration,
                                 prompt_len_min=2, prompt_len_max=4, max_new_tokens=2, seed=seed, timeout_s=2))
    assert time.monotonic() - t0 < duration + 2 + 1
    # first arrival at 0, then exponential gaps (gamma of shape 1) of mean 1/qps
    arrivals = np.concatenate([[0.0], np.cumsum(np.random.default_rng(seed).gamma(1.0, 1 / qps, size=2000))])
    expected = arrivals[arrivals < duration]
    assert len(result.records) == expected.size
    assert [r.index for r in result.records] == list(range(expected.size))
    assert [r.scheduled_ns for r in result.records] == np.round(expected * 1e9).astype(np.int64).tolist()
    sent = [r for r in result.records if r.send_ns is not None]
    assert {r.error_kind for r in sent} == {"connection_refused"}
    assert {r.error_kind for r in result.records if r.send_ns is None} <= {"not_sent"}
    # after the first refusal, one probe at a time with waits of 0.05, 0.1, 0.2, ... s
    first_end = min(r.end_ns for r in sent)
    later = sorted(r.send_ns for r in sent if r.send_ns > first_end)
    gaps = np.diff([first_end, *later]) / 1e9
    assert all(g >= 0.05 * 2 ** k * 0.95 for k, g in enumerate(gaps)), gaps
    s = summarize(result)
    assert s.failures == {"connection_refused": len(sent)} and s.failed == len(sent)
    assert s.not_sent == expected.size - len(sent) and s.planned == expected.size


def test_timeout_ends_the_request_and_the_run_is_bounded(stub_server):
    url = stub_server(Stub({0: "slow", 1: "slow"}))
    t0 = time.monotonic()
    result = run_load(cfg(url, concurrency=2, num_requests=3, timeout_s=0.5))
    assert time.monotonic() - t0 < 3
    assert sorted(r.error_kind or "ok" for r in result.records) == ["ok", "timeout", "timeout"]


def rec(i, ttft_ms, itl_ms, ok=True, kind=None, out=None) -> RequestRecord:
    def ns(ms):
        return round(ms * 1e6)

    itl = tuple(ns(x) for x in itl_ms)
    e2e = ns(ttft_ms) + sum(itl) if ok else None
    return RequestRecord(i, None, 0, e2e, ok, kind, 500 if kind == "http_status" else None, None, ns(ttft_ms) if ok else None,
                         itl, e2e, 10, "usage", out if out is not None else len(itl) + 1, "usage", None)


def test_summary_percentiles_goodput_by_hand():
    records = (rec(0, 10, [10, 20]), rec(1, 20, [30, 90]), rec(2, 30, [40]), rec(3, 40, [60, 60, 60]),
               rec(4, 0, [], ok=False, kind="http_status"))
    c = LoadConfig(url="http://x", model="m", concurrency=1, slo_ttft_s=0.035, slo_itl_s=0.05)
    s = summarize(LoadResult(c, records, 0, elapsed_ns=2_000_000_000, send_window_ns=1_000_000_000,
                             interrupted=False, deadline_hit=False))
    ms = 1e6
    # TTFT 10, 20, 30, 40: p50 rank 1.5 -> 25; p90 rank 2.7 -> 37; p99 rank 2.97 -> 39.7
    assert (s.ttft.p50_ns / ms, s.ttft.p90_ns / ms, s.ttft.p99_ns / ms) == pytest.approx((25, 37, 39.7))
    # ITL pooled: 10 20 30 40 60 60 60 90 -> p50 rank 3.5 -> 50; p90 rank 6.3 -> 60 + 0.3*30 = 69
    assert (s.itl.p50_ns / ms, s.itl.p90_ns / ms) == pytest.approx((50, 69))
    # E2E 40, 140, 70, 220 -> sorted 40 70 140 220, p50 = 105
    assert s.e2e.p50_ns / ms == pytest.approx(105)
    # good: TTFT <= 35 and mean ITL <= 50: r0 (mean 15), r2 (40); r1 mean 60, r3 TTFT 40
    assert s.good == 2 and s.goodput_fraction == pytest.approx(2 / 5) and s.goodput_rps == pytest.approx(1.0)
    assert s.achieved_qps == pytest.approx(4 / 2) and s.sent_qps == pytest.approx(5 / 1)
    # output tokens: 3 + 3 + 2 + 4 over 2 s; input 4 x 10 over 2 s
    assert s.output_tokens_per_s == pytest.approx(12 / 2) and s.input_tokens_per_s == pytest.approx(40 / 2)
    assert s.failures == {"http_500": 1}
    # the vLLM-style keys of the same records, in ms
    res = benchmark_result(LoadResult(c, records, 0, elapsed_ns=2_000_000_000, send_window_ns=1_000_000_000,
                                      interrupted=False, deadline_hit=False),
                           ("ttft", "tpot", "itl", "e2el"), (50, 90, 99.9))
    assert (res["completed"], res["failed"], res["not_sent"], res["duration"]) == (4, 1, 0, 2.0)
    assert res["mean_ttft_ms"] == pytest.approx(25) and res["median_ttft_ms"] == pytest.approx(25)
    # population std of 10 20 30 40: sqrt(((15^2 + 5^2) * 2) / 4) = sqrt(125)
    assert res["std_ttft_ms"] == pytest.approx(125 ** 0.5)
    assert res["p90_ttft_ms"] == pytest.approx(37) and res["p99.9_ttft_ms"] == pytest.approx(39.97)
    # TPOT = (e2e - ttft) / (out - 1): 30/2, 120/2, 40/1, 180/3 = 15 60 40 60 -> mean 43.75, median 50
    assert res["mean_tpot_ms"] == pytest.approx(43.75) and res["median_tpot_ms"] == pytest.approx(50)
    assert res["mean_itl_ms"] == pytest.approx(370 / 8) and res["median_e2el_ms"] == pytest.approx(105)
    # goodput: TTFT <= 35 and TPOT <= 50: r0 and r2 -> 2 requests over 2 s
    assert res["request_goodput"] == pytest.approx(1.0) and res["request_throughput"] == pytest.approx(2.0)
    assert res["total_output_tokens"] == 12 and res["output_throughput"] == pytest.approx(6)
    assert res["total_token_throughput"] == pytest.approx((40 + 12) / 2)


def test_window_closing_leaves_requests_not_sent_not_failed(stub_server):
    # one slot, held 0.5 s by a request that times out: every later arrival of the 0.3 s window
    # finds the window closed when the slot frees
    url = stub_server(Stub({0: "slow"}))
    rate, duration, seed = 50.0, 0.3, 4
    result = run_load(LoadConfig(url=url, model="m", request_rate=rate, max_concurrency=1, duration_s=duration,
                                 seed=seed, prompt_len_min=2, prompt_len_max=2, max_new_tokens=2, timeout_s=0.5))
    arrivals = np.concatenate([[0.0], np.cumsum(np.random.default_rng(seed).gamma(1.0, 1 / rate, size=500))])
    n = int((arrivals < duration).sum())
    assert n > 3
    assert [r.error_kind for r in result.records] == ["timeout"] + ["not_sent"] * (n - 1)
    s = summarize(result)
    assert (s.planned, s.sent, s.ok, s.failed, s.not_sent) == (n, 1, 0, 1, n - 1)
    assert s.failures == {"timeout": 1}
    res = benchmark_result(result)
    assert (res["completed"], res["failed"], res["not_sent"], res["planned"]) == (0, 1, n - 1, n)


def test_rate_and_duration_far_beyond_the_caps_stay_bounded(tmp_path, stub_server):
    # 1e6 requests/s for 1 s: planning stops at --max-requests, in-flight requests at --max-in-flight
    url = stub_server(Stub(delay_s=0.05))
    rec_file = tmp_path / "rec.jsonl"
    # peak RSS of this process image (VmHWM; ru_maxrss would carry the forking pytest's peak over exec)
    code = ("import re, sys; from tracestory.cli import main; rc = main(sys.argv[1:]); "
            "print('MAXRSS_KB', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); "
            "sys.exit(rc)")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code, "load", "--base-url", url, "--model", "m", "--request-rate", "1e6",
                        "--duration", "1", "--max-in-flight", "32", "--random-input-len", "4", "--random-output-len",
                        "2", "--timeout", "5", "--no-progress", "--output", str(rec_file)],
                       capture_output=True, text=True, timeout=60)
    wall = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    assert wall < 1 + 5 + 10
    rows = [json.loads(x) for x in rec_file.read_text().splitlines()]
    assert len(rows) == 100_000 and sorted(r["index"] for r in rows) == list(range(100_000))
    assert "capped at 100,000 (--max-requests)" in p.stderr
    sent = [r for r in rows if r["send_ns"] is not None]
    assert sum(r["error_kind"] == "not_sent" for r in rows) == 100_000 - len(sent)
    # in flight at any send time, counted from the records
    most = max(sum(1 for o in sent if o["send_ns"] <= r["send_ns"] < o["end_ns"]) for r in sent[:2000])
    assert most <= 32
    maxrss_mb = int(p.stdout.split("MAXRSS_KB")[1].split()[0]) / 1024
    assert maxrss_mb < 600, maxrss_mb


# ------------------------------------------------------------------ the real reference server


def start_real_server(*extra: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-m", "tracestory.cli", "serve", "--preset", "tiny", "--device", "cpu",
                          "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    line = b""
    while time.monotonic() < deadline and b"listening on" not in line:
        ready, _, _ = select.select([p.stdout], [], [], 1.0)
        if ready:
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                break
    if b"listening on" not in line:
        p.kill()
        raise RuntimeError(f"tracestory serve did not start: {line!r}")
    return p, line.decode().split("listening on", 1)[1].strip()


@pytest.fixture(scope="module")
def real_servers():
    # Both servers start at once: their start-up (torch import, model build) overlaps.
    results = {}

    def go(key, *extra):
        results[key] = start_real_server(*extra)

    threads = [threading.Thread(target=go, args=("fail", "--fail-rate", "0.5")),
               threading.Thread(target=go, args=("kill",)), threading.Thread(target=go, args=("plain",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    yield results
    for p, _ in results.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_real_server_tokens_and_injected_500s(real_servers):
    _, url = real_servers["fail"]
    c = LoadConfig(url=url, model="tiny", concurrency=1, num_requests=6, prompt_len_min=8, prompt_len_max=40,
                   max_new_tokens=6, seed=5, ignore_eos=True, timeout_s=20)
    result = run_load(c)
    # fail rate 0.5: accepted request k (1-based) fails iff floor(k/2) > floor((k-1)/2): k = 2, 4, 6
    assert [r.error_kind for r in result.records] == [None, "http_status"] * 3
    assert summarize(result).failures == {"http_500": 3}
    planned = np.random.default_rng([5, 1]).integers(8, 41, size=6)
    ok = [r for r in result.records if r.ok]
    assert [r.prompt_tokens for r in ok] == planned[[0, 2, 4]].tolist()
    assert all(r.output_tokens == 6 and r.output_tokens_source == "usage" and len(r.itl_ns) == 5 for r in ok)


def test_real_server_killed_mid_run_keeps_every_record(real_servers):
    p, url = real_servers["kill"]
    qps, duration, seed = 10.0, 3.0, 11
    killer = threading.Timer(1.2, lambda: os.killpg(p.pid, signal.SIGKILL))
    killer.start()
    try:
        result = run_load(LoadConfig(url=url, model="tiny", target_qps=qps, duration_s=duration, prompt_len_min=16,
                                     prompt_len_max=64, max_new_tokens=64, ignore_eos=True, seed=seed, timeout_s=5))
    finally:
        killer.cancel()
    arrivals = np.concatenate([[0.0], np.cumsum(np.random.default_rng(seed).gamma(1.0, 1 / qps, size=500))])
    n = int((arrivals < duration).sum())
    assert [r.index for r in result.records] == list(range(n))
    s = summarize(result)
    assert s.planned == n and s.ok + s.failed + s.not_sent == n
    before = [r for r in result.records if r.send_ns is not None and r.end_ns < 1.1e9]
    assert before and all(r.ok for r in before)
    after = [r for r in result.records if r.scheduled_ns > 1.6e9]   # well after the kill
    assert after and {r.error_kind for r in after} <= {"connection_refused", "not_sent"}
    assert set(s.failures) <= {"connection_refused", "server_disconnect"}


def test_vllm_result_every_metric_from_the_records(real_servers, tmp_path):
    """`load` against `serve` through the CLI: each key of the result JSON recomputed from the
    streamed records with the statistics module (quantiles 'inclusive' = linear interpolation)."""
    _, url = real_servers["plain"]
    out = tmp_path / "res"
    argv = [sys.executable, "-m", "tracestory.cli", "load", "--base-url", url, "--model", "tiny",
            "--request-rate", "40", "--burstiness", "0.5", "--max-concurrency", "3", "--num-prompts", "12",
            "--random-input-len", "16", "--random-output-len", "6", "--random-range-ratio", "0.5", "--seed", "9",
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--goodput", "ttft:150", "tpot:20", "--save-result", "--save-detailed", "--result-dir", str(out),
            "--result-filename", "run.json", "--label", "lbl", "--metadata", "gpu=none", "note=a b",
            "--json", str(tmp_path / "summary.json"), "--no-progress"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((out / "run.json").read_text())
    recs = sorted((json.loads(x) for x in (out / "run.requests.jsonl").read_text().splitlines()),
                  key=lambda r: r["index"])
    assert [r["index"] for r in recs] == list(range(12)) and all(r["ok"] for r in recs)
    # input lengths: uniform in [floor(16 * 0.5), floor(16 * 1.5)] = [8, 24] from default_rng([seed, 1]);
    # the server counts one token a word, so its usage equals the plan; output: 6 tokens (ignore_eos)
    planned_in = np.random.default_rng([9, 1]).integers(8, 25, size=12).tolist()
    assert [r["prompt_tokens"] for r in recs] == planned_in
    out_lens = np.random.default_rng([9, 2]).integers(3, 10, size=12).tolist()   # [floor(6 * .5), floor(6 * 1.5)]
    assert [r["output_tokens"] for r in recs] == out_lens

    ok = [r for r in recs if r["ok"]]
    duration = max(r["end_ns"] for r in recs) / 1e9
    assert res["duration"] == pytest.approx(duration)
    assert (res["completed"], res["failed"], res["not_sent"]) == (12, 0, 0)
    tin, tout = sum(r["prompt_tokens"] for r in ok), sum(r["output_tokens"] for r in ok)
    assert (res["total_input_tokens"], res["total_output_tokens"]) == (tin, tout) == (sum(planned_in), sum(out_lens))
    assert res["request_throughput"] == pytest.approx(12 / duration)
    assert res["output_throughput"] == pytest.approx(tout / duration)
    assert res["total_token_throughput"] == pytest.approx((tin + tout) / duration)
    samples = {"ttft": [r["ttft_ns"] / 1e6 for r in ok],
               "tpot": [(r["e2e_ns"] - r["ttft_ns"]) / 1e6 / (r["output_tokens"] - 1) for r in ok],
               "itl": [g / 1e6 for r in ok for g in r["itl_ns"]],
               "e2el": [r["e2e_ns"] / 1e6 for r in ok]}
    for m, xs in samples.items():
        q = statistics.quantiles(xs, n=100, method="inclusive")
        assert res[f"mean_{m}_ms"] == pytest.approx(statistics.mean(xs)), m
        assert res[f"median_{m}_ms"] == pytest.approx(statistics.median(xs)), m
        assert res[f"std_{m}_ms"] == pytest.approx(statistics.pstdev(xs)), m
        for pc in (50, 90, 99):
            assert res[f"p{pc}_{m}_ms"] == pytest.approx(q[pc - 1]), (m, pc)
    good = sum(1 for r, tp in zip(ok, samples["tpot"]) if r["ttft_ns"] / 1e6 <= 150 and tp <= 20)
    assert res["request_goodput"] == pytest.approx(good / duration)
    in_flight = max(sum(1 for o in recs if o["send_ns"] <= r["send_ns"] < o["end_ns"]) for r in recs)
    assert res["max_concurrent_requests"] == in_flight <= 3
    # peak output throughput: token events (send + ttft, then each gap) in whole seconds from the first send
    first, bins = min(r["send_ns"] for r in ok), {}
    for r in ok:
        t = r["send_ns"] + r["ttft_ns"]
        for gap in [0, *r["itl_ns"]]:
            t += gap
            bins[(t - first) // 10**9] = bins.get((t - first) // 10**9, 0) + 1
    assert res["max_output_tokens_per_s"] == max(bins.values())
    # per-request lists in request order, seconds as vLLM writes them
    assert res["input_lens"] == planned_in and res["output_lens"] == out_lens
    assert res["ttfts"] == pytest.approx([r["ttft_ns"] / 1e9 for r in recs])
    assert [len(x) for x in res["itls"]] == [len(r["itl_ns"]) for r in recs]
    assert res["itls"][3] == pytest.approx([g / 1e9 for g in recs[3]["itl_ns"]])
    assert res["errors"] == [""] * 12 and res["failures"] == {}
    assert (res["label"], res["gpu"], res["note"], res["request_rate"], res["burstiness"], res["max_concurrency"],
            res["num_prompts"], res["model_id"]) == ("lbl", "none", "a b", 40.0, 0.5, 3, 12, "tiny")
    assert res["prompts_exact"] is False and "no --tokenizer" in res["prompts"]
    # the printed block
    lines = p.stdout.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[1].split() == ["Successful", "requests:", "12"] and lines[1].index("12") == 41
    assert "---------------Time to First Token----------------" in lines
    assert any(x.startswith("P90 E2EL (ms):") for x in lines) and "Request goodput (req/s):" in p.stdout
    # our summary for `tracestory report`: the same requests
    summ = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert (summ["planned"], summ["sent"], summ["ok"], summ["failed"], summ["not_sent"]) == (12, 12, 12, 0, 0)
    assert summ["ttft"]["p50_ns"] / 1e6 == pytest.approx(statistics.median(samples["ttft"]))
    assert summ["target_qps"] == 40.0 and summ["concurrency"] == 3


def test_cli_ctrl_c_writes_every_record_in_flight_cancelled_rest_not_sent(tmp_path, stub_server):
    stub = Stub({k: "slow" for k in range(100)})
    url = stub_server(stub)
    out = tmp_path / "req.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "tracestory.cli", "load", "--url", url, "--model", "m",
                          "--target-qps", "20", "--duration", "4", "--seed", "2", "--prompt-len-min", "2",
                          "--prompt-len-max", "3", "--max-new-tokens", "2", "--timeout", "30",
                          "--output", str(out), "--json", str(tmp_path / "s.json"), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while stub.n < 3 and time.monotonic() < deadline:   # the run has started: requests hang in the stub
        time.sleep(0.05)
    assert stub.n >= 3
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=20)
    assert p.returncode == 130, stderr.decode()[-2000:]
    rows = sorted((json.loads(x) for x in out.read_text().splitlines()), key=lambda r: r["index"])
    arrivals = np.concatenate([[0.0], np.cumsum(np.random.default_rng(2).gamma(1.0, 1 / 20, size=500))])
    n = int((arrivals < 4).sum())
    assert [r["index"] for r in rows] == list(range(n))
    sent = [r for r in rows if r["send_ns"] is not None]
    assert sent and len(sent) < n
    assert {r["error_kind"] for r in sent} == {"cancelled"}
    assert {r["error_kind"] for r in rows if r["send_ns"] is None} == {"not_sent"}
    summ = json.loads((tmp_path / "s.json").read_text())["summary"]
    assert summ["interrupted"] and (summ["failed"], summ["not_sent"]) == (len(sent), n - len(sent))
    assert summ["failures"] == {"cancelled": len(sent)}
