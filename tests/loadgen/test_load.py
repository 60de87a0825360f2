"""tracestory load: against a stub SSE server in this file (every failure kind, exact counts) and
against the real reference server ``tracestory serve --preset tiny --device cpu`` on loopback
(token counts, injected HTTP 500s, a server killed mid-run). Expected numbers come from the
stub's own behaviour table, the server's documented rules, or a direct numpy draw."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from aiohttp import web

from tracestory.loadgen import LoadConfig, RequestRecord, run_load, summarize
from tracestory.loadgen.generator import LoadResult

# ------------------------------------------------------------------ a stub server


class Stub:
    """Streams ``max_tokens`` chunks; request number k (0-based, arrival order) behaves as
    ``behaviors.get(k, "ok")``."""

    def __init__(self, behaviors=None, usage=True, delay_s=0.001):
        self.behaviors, self.usage, self.delay_s = behaviors or {}, usage, delay_s
        self.n = 0
        self.bodies = []

    async def handle(self, request):
        body = await request.json()
        k, self.n = self.n, self.n + 1
        self.bodies.append(body)
        b = self.behaviors.get(k, "ok")
        chat = request.path.endswith("/chat/completions")
        if b == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if b == "429":
            return web.json_response({"error": {"message": "slow down"}}, status=429)
        if b == "json":
            return web.json_response({"choices": [{"text": "x"}]})
        if b == "slow":
            await asyncio.sleep(5)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj):
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        if chat:  # role-only first delta: not a token
            await send({"id": f"c{k}", "choices": [{"delta": {"role": "assistant"}}]})
        for i in range(body["max_tokens"]):
            await asyncio.sleep(self.delay_s)
            await resp.write(b": keep-alive\n\n")
            piece = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
            await send({"id": f"c{k}", "choices": [piece]})
            if b == "disconnect" and i == 1:
                request.transport.close()
                return resp
        if b == "badjson":
            await resp.write(b"data: {not json\n\n")
        if b == "stream_error":
            await send({"error": {"message": "engine died"}})
        if b == "notsse":
            await resp.write(b"hello there\n\n")
        if self.usage:
            await send({"choices": [], "usage": {"prompt_tokens": 1000 + k, "completion_tokens": body["max_tokens"]}})
        if b != "nodone":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
def stub_server():
    """Start a Stub in a background event loop; yields (start(stub) -> url)."""
    started = []

    def start(stub: Stub) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", stub.handle)
        app.router.add_post("/v1/chat/completions", stub.handle)
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        loop.run_until_complete(runner.setup())
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        loop.run_until_complete(web.SockSite(runner, sock).start())
        threading.Thread(target=loop.run_forever, daemon=True).start()
        started.append((loop, runner))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for loop, runner in started:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)


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
    # usage chunk: prompt 1000 + k, completion = max_tokens; 5 token events -> 4 gaps
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


def test_connection_refused_poisson_every_arrival_has_a_record(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    qps, duration, seed = 40.0, 0.5, 7
    t0 = time.monotonic()
    result = run_load(LoadConfig(url=f"http://127.0.0.1:{port}", model="m", target_qps=qps, duration_s=duration,
                                 prompt_len_min=2, prompt_len_max=4, max_new_tokens=2, seed=seed, timeout_s=2))
    assert time.monotonic() - t0 < duration + 2 + 1
    gaps = np.random.default_rng(seed).exponential(1 / qps, size=2000)
    arrivals = np.cumsum(gaps)
    expected = arrivals[arrivals < duration]
    assert len(result.records) == expected.size
    assert [r.index for r in result.records] == list(range(expected.size))
    assert [r.scheduled_ns for r in result.records] == np.round(expected * 1e9).astype(np.int64).tolist()
    assert {r.error_kind for r in result.records} == {"connection_refused"}
    assert summarize(result).failures == {"connection_refused": expected.size}


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


def test_bad_arguments_are_usage_errors():
    from tracestory.errors import UsageError

    with pytest.raises(UsageError, match="exactly one of"):
        LoadConfig(url="http://x", model="m").validate()
    with pytest.raises(UsageError, match="--prompt-len-max"):
        LoadConfig(url="http://x", model="m", target_qps=1, prompt_len_min=10, prompt_len_max=5).validate()


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
               threading.Thread(target=go, args=("kill",))]
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
    arrivals = np.cumsum(np.random.default_rng(seed).exponential(1 / qps, size=500))
    n = int((arrivals < duration).sum())
    assert [r.index for r in result.records] == list(range(n))
    s = summarize(result)
    assert s.planned == n and s.sent == n
    after = [r for r in result.records if r.scheduled_ns > 1.6e9]   # well after the kill
    assert after and {r.error_kind for r in after} == {"connection_refused"}
    assert s.failed >= len(after) and s.ok + s.failed == n
    assert set(s.failures) <= {"connection_refused", "server_disconnect"}


def test_cli_ctrl_c_writes_every_record(tmp_path, stub_server):
    stub = Stub({k: "slow" for k in range(100)})
    url = stub_server(stub)
    out = tmp_path / "req.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "tracestory.cli", "load", "--url", url, "--model", "m",
                          "--target-qps", "20", "--duration", "4", "--seed", "2", "--prompt-len-min", "2",
                          "--prompt-len-max", "3", "--max-new-tokens", "2", "--timeout", "30",
                          "--output", str(out), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while stub.n < 3 and time.monotonic() < deadline:   # the run has started: requests hang in the stub
        time.sleep(0.05)
    assert stub.n >= 3
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=20)
    assert p.returncode == 130, stderr.decode()[-2000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    arrivals = np.cumsum(np.random.default_rng(2).exponential(1 / 20, size=500))
    n = int((arrivals < 4).sum())
    assert [r["index"] for r in rows] == list(range(n))
    assert {r["error_kind"] for r in rows} == {"cancelled"}
    assert any(r["send_ns"] is not None for r in rows)
