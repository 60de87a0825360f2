"""The server under hostile or excessive clients: slow headers, idle connections over the limit,
overload, malformed bodies, deadlines, and the argument errors of ``tracestory serve``.

Expected values are worked out by hand from the limits each test sets (written next to each
assertion); the refusal counts of /metrics are compared with what the client itself saw.
Every loop is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from conftest import free_port

from tracestory.serve import ServeOptions, ServerLimits, start_server_thread, wait_healthy
from tracestory.serve.admission import Admission
from tracestory.serve.guard import ConnectionGuard
from tracestory.serve.request_body import BadRequest, json_depth, load_json, parse_request


# --------------------------------------------------------------------------- helpers
def _post(url: str, body=None, raw: bytes | None = None, timeout: float = 30.0):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def _health_seconds(url: str) -> float:
    t0 = time.monotonic()
    with urllib.request.urlopen(url + "/health", timeout=5) as r:
        assert r.status == 200
    return time.monotonic() - t0


def _refused(url: str) -> Counter:
    """``tracestory:requests_refused_total`` by reason, read from the exposition text by hand."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = Counter()
    for line in text.splitlines():
        if line.startswith("tracestory:requests_refused_total{"):
            labels, value = line.rsplit(" ", 1)
            reason = labels.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = int(float(value))
    return out


def _kv_usage(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("tracestory:kv_cache_usage_perc{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no kv_cache_usage_perc sample")


@pytest.fixture(scope="module")
def guarded():
    """max_num_seqs 2 + max_waiting 2 = 4 admitted; 20 connections; 1.5 s idle timeout;
    bodies up to 4096 bytes."""
    limits = ServerLimits(max_waiting=2, max_connections=20, idle_timeout_s=1.5, request_timeout_s=120,
                          max_request_bytes=4096, max_inflight_bytes=8192)
    h = start_server_thread(ServeOptions(port=free_port(), max_num_seqs=2, num_blocks=256, block_size=16,
                                         limits=limits))
    wait_healthy(h.url, timeout_s=20)
    yield h
    h.stop()


# --------------------------------------------------------------------------- request bodies (pure)
def test_json_depth_limit_without_recursion():
    assert json_depth(5, 32) == 0 and json_depth([], 32) == 1 and json_depth({"a": [[1]]}, 32) == 3
    assert json_depth([[[[]]]], 2) == 3                    # stops counting past the limit
    with pytest.raises(BadRequest, match="nested deeper than 32"):
        load_json(b"[" * 100_000 + b"]" * 100_000)        # past the C parser's recursion limit
    with pytest.raises(BadRequest, match="nested deeper than 32"):
        load_json(b"[" * 33 + b"]" * 33)                  # parses, but 33 > 32
    assert load_json(b"[" * 32 + b"]" * 32) is not None
    with pytest.raises(BadRequest, match="not valid JSON"):
        load_json(b"\xff\xfe{")


@pytest.mark.parametrize("body, param", [
    ({"prompt": "t1", "stream": "false"}, "stream"),
    ({"prompt": "t1", "stream": 0}, "stream"),
    ({"prompt": "t1", "ignore_eos": "yes"}, "ignore_eos"),
    ({"prompt": "t1", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "t1", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "t1", "max_tokens": True}, "max_tokens"),
    ({"prompt": "t1", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "t1", "n": 2}, "n"),
    ({"prompt": "t1", "temperature": "hot"}, "temperature"),
    ({"prompt": "t1", "stop": [1]}, "stop"),
    ({"prompt": "t1", "model": ["a"]}, "model"),
    ({"prompt": [1, "t2"]}, "prompt"),
    ({"prompt": 7}, "prompt"),
])
def test_completion_field_types_are_strict(body, param):
    with pytest.raises(BadRequest) as e:
        parse_request(body, chat=False, vocab=512)
    assert e.value.param == param


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": [{"type": "text", "text": 5}]}],
    [{"role": "user", "content": [{"type": "text", "text": None}]}],
    [{"role": "user", "content": [{"type": "text"}]}],
    [{"role": "user", "content": ["t1"]}],
    [{"role": "user", "content": 3}],
    [{"role": 1, "content": "t1"}],
    ["t1"],
    [],
])
def test_chat_content_types_are_strict(messages):
    with pytest.raises(BadRequest) as e:
        parse_request({"messages": messages}, chat=True, vocab=512)
    assert e.value.param == "messages"


def test_valid_bodies_parse():
    # "t3 t4" is token ids 3, 4 by the token rule; the image part is skipped, the text parts joined
    r = parse_request({"messages": [{"role": "user", "content": [{"type": "text", "text": "t3"},
                                                                 {"type": "image_url", "image_url": {}},
                                                                 {"type": "text", "text": "t4"}]}],
                       "max_completion_tokens": 3, "stream": False, "temperature": 0}, chat=True, vocab=512)
    assert (r.prompt_ids, r.max_new_tokens, r.stream, r.ignore_eos) == ([3, 4], 3, False, False)
    r = parse_request({"prompt": [[7, 8]], "stream": True, "stop": None}, chat=False, vocab=512)
    assert (r.prompt_ids, r.max_new_tokens, r.stream) == ([7, 8], 16, True)   # 16: the OpenAI default


# --------------------------------------------------------------------------- admission and guard (pure)
def test_admission_counts_and_byte_caps():
    a = Admission(max_admitted=2, max_request_bytes=100, max_inflight_bytes=150)
    assert a.try_admit() and a.try_admit() and not a.try_admit()       # the third of 2 is refused
    a.done()
    assert a.try_admit()
    assert a.reserve_body(101)[1] == 413                               # one body over 100 bytes
    n1, status, _ = a.reserve_body(100)
    assert (n1, status) == (100, None)
    assert a.reserve_body(60)[1] == 503                                # 100 + 60 > 150 in flight
    assert a.reserve_body(None)[1] == 503                              # unknown length reserves 100
    a.release_body(n1)
    assert a.reserve_body(None)[:2] == (100, None)
    assert a.refused == Counter(queue_full=1, body_too_large=1, bytes_in_flight=2)


class _FakeTransport:
    def __init__(self):
        self.written, self.closed = b"", False

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True

    abort = close

    def is_closing(self):
        return self.closed


class _FakeHandler:
    def __init__(self):
        self.made = self.lost = 0

    def connection_made(self, t):
        self.made += 1

    def connection_lost(self, exc):
        self.lost += 1

    def data_received(self, data):
        pass


def test_connection_guard_evicts_headless_then_refuses():
    refusals = Counter()
    guard = ConnectionGuard(_FakeHandler, max_connections=2, refuse=lambda r: refusals.update([r]))
    c1, c2, c3, c4 = (guard() for _ in range(4))
    t1, t2, t3, t4 = (_FakeTransport() for _ in range(4))
    c1.connection_made(t1)
    c2.connection_made(t2)
    c2.data_received(b"GET /health HTTP/1.1\r\nHost: x\r")    # head split over two reads
    c2.data_received(b"\n\r\n")
    c3.connection_made(t3)                     # at the limit: c1 sent no head, it is closed
    assert t1.closed and not t2.closed and guard.open_count == 2
    c1.connection_lost(None)
    assert c1.inner.lost == 1                  # aiohttp still hears that c1 went away
    c3.data_received(b"POST /v1/completions HTTP/1.1\r\n\r\n")
    c4.connection_made(t4)                     # every open connection has a head: c4 refused
    assert t4.closed and t4.written.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in t4.written
    assert c4.inner.made == 0
    c4.connection_lost(None)
    assert c4.inner.lost == 0
    assert refusals == Counter(connection_evicted=1, connection_limit=1)


def test_connection_guard_head_timeout():
    refusals = Counter()

    async def main():
        guard = ConnectionGuard(_FakeHandler, max_connections=4, refuse=lambda r: refusals.update([r]),
                                head_timeout_s=0.05)
        slow, quick = guard(), guard()
        ts, tq = _FakeTransport(), _FakeTransport()
        slow.connection_made(ts)
        slow.data_received(b"GET /hea")              # half a request line
        quick.connection_made(tq)
        quick.data_received(b"GET /health HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.3)                     # well past 0.05 s
        return ts.closed, tq.closed

    assert asyncio.run(main()) == (True, False)
    assert refusals == Counter(head_timeout=1)


# --------------------------------------------------------------------------- the real server
def test_slow_headers_are_dropped_while_health_answers(guarded):
    host, port = guarded.url.rsplit("/", 1)[-1].split(":")
    socks = []
    for _ in range(5):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"GET /hea")                  # half a request line, never finished
        socks.append(s)
    t0 = time.monotonic()
    assert _health_seconds(guarded.url) < 1.0
    closed = 0
    for s in socks:                             # each read ends by the 1.5 s idle timeout (+ slack)
        s.settimeout(max(0.1, t0 + 6.0 - time.monotonic()))
        try:
            closed += s.recv(1024) == b""
        except ConnectionResetError:
            closed += 1
        except socket.timeout:
            pass
        s.close()
    assert closed == 5 and time.monotonic() - t0 < 6.0


def test_idle_connections_over_the_limit_do_not_stop_health(guarded):
    host, port = guarded.url.rsplit("/", 1)[-1].split(":")
    before = _refused(guarded.url)["connection_evicted"]
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(60)]   # limit: 20
    try:
        for _ in range(3):
            assert _health_seconds(guarded.url) < 1.0
        # 60 idle connections in 20 slots: the 40 oldest evicted; the first /health connection
        # evicts one more (41); later ones take the slot a finished /health connection freed
        assert _refused(guarded.url)["connection_evicted"] - before == 41
        t_end = time.monotonic() + 5.0
        for s in socks[:41]:                   # oldest first: these are the evicted ones
            s.settimeout(max(0.05, t_end - time.monotonic()))
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for s in socks:
            s.close()


def test_overload_gets_429_quickly_while_admitted_requests_finish(guarded):
    import aiohttp

    url = guarded.url + "/v1/completions"
    before = _refused(guarded.url)["queue_full"]
    # 12 requests of 400 tokens each (ignore_eos): at one token per iteration none can finish
    # before all 12 have arrived, so 2 running + 2 waiting are admitted and 8 refused
    body = {"prompt": "t1 t2 t3", "max_tokens": 400, "ignore_eos": True}

    async def one(session):
        t0 = time.monotonic()
        async with session.post(url, json=body) as r:
            await r.read()
            return r.status, r.headers.get("Retry-After"), time.monotonic() - t0

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            return await asyncio.gather(*(one(s) for _ in range(12)))

    results = asyncio.run(main())
    statuses = Counter(r[0] for r in results)
    refused = [r for r in results if r[0] == 429]
    assert statuses == Counter({200: 4, 429: 8})
    assert all(r[1] == "1" and r[2] < 2.0 for r in refused)
    assert _refused(guarded.url)["queue_full"] - before == statuses[429]


def test_deadline_cancels_and_frees_kv():
    h = start_server_thread(ServeOptions(port=free_port(), num_blocks=256, block_size=16,
                                         limits=ServerLimits(request_timeout_s=1.0)))
    try:
        wait_healthy(h.url, timeout_s=20)
        # 3000 output tokens need 3000 iterations; the 1 s deadline ends both requests first
        t0 = time.monotonic()
        status, err, _ = _post(h.url + "/v1/completions", {"prompt": "t1 t2", "max_tokens": 3000, "ignore_eos": True})
        assert status == 504 and "deadline of 1 s" in err["error"]["message"]
        req = urllib.request.Request(h.url + "/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "t1", "max_tokens": 3000, "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            events = [ln for ln in r.read().decode().split("\n\n") if ln]
        assert events[-1] == "data: [DONE]" and "deadline of 1 s" in events[-2]
        assert time.monotonic() - t0 < 15
        stop = time.monotonic() + 10
        while _kv_usage(h.url) != 0 and time.monotonic() < stop:
            time.sleep(0.1)
        assert _kv_usage(h.url) == 0
        assert _refused(h.url)["timeout"] == 2
    finally:
        h.stop()


@pytest.mark.parametrize("raw, status, param", [
    (b"[" * 100_000 + b"]" * 100_000, 413, None),    # 200,000 bytes over this server's 4096-byte cap
    (json.dumps({"prompt": "t1", "stream": "false"}).encode(), 400, "stream"),
    (json.dumps({"prompt": "t1", "max_tokens": "4"}).encode(), 400, "max_tokens"),
    (b'{"prompt": "t1", "max_tokens": 2', 400, None),
])
def test_malformed_bodies_get_400(guarded, raw, status, param):
    got, err, _ = _post(guarded.url + "/v1/completions", raw=raw)
    assert got == status and err["error"]["param"] == param


def test_deep_and_mistyped_chat_bodies_get_400(guarded):
    url = guarded.url + "/v1/chat/completions"
    deep = b"[" * 2000 + b"]" * 2000          # 4000 bytes: under the cap, 2000 > 32 levels
    status, err, _ = _post(url, raw=deep)
    assert status == 400 and "nested deeper" in err["error"]["message"]
    for text in (5, None):
        status, err, _ = _post(url, {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]})
        assert status == 400 and err["error"]["param"] == "messages"


# --------------------------------------------------------------------------- argument errors
@pytest.mark.parametrize("argv, line", [
    (["--port", "70000"], "--port: expected a TCP port in 0..65535, found 70000"),
    (["--device", "tpu"], "--device: expected cpu, cuda, cuda:N or auto, found 'tpu'"),
    (["--vocab", "0"], "--vocab: expected an integer >= 1, found 0"),
    (["--max-waiting", "0"], "--max-waiting: expected an integer >= 1, found 0"),
    (["--request-timeout", "0"], "--request-timeout: expected a finite number > 0, found 0.0"),
    (["--idle-timeout", "inf"], "--idle-timeout: expected a finite number > 0, found inf"),
    (["--gpu-memory-fraction", "2"], "--gpu-memory-fraction: expected a fraction in (0, 1], found 2.0"),
    (["--stall-timeout", "0"], "--stall-timeout: expected a finite number > 0, found 0.0"),
    (["--port", "0", "--event-log", "/dev/full"],
     "/dev/full: expected a writable event-log path, found No space left on device"),
])
def test_serve_argument_errors_are_one_line_exit_2(argv, line):
    r = subprocess.run([sys.executable, "-m", "tracestory.cli", "serve", *argv], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"tracestory: error: {line}\n"


def test_a_client_that_leaves_inside_its_body_is_counted_not_a_traceback(guarded, caplog):
    # a Content-Length of 1000 with 10 bytes sent, then the socket closed: the body can never be
    # whole; the handler counts it (reason client_gone) and the server answers the next request
    before = _refused(guarded.url)["client_gone"]
    host, port = guarded.url.removeprefix("http://").split(":")
    with caplog.at_level("ERROR"):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n" + b'{"prompt":')
        time.sleep(0.2)
        s.close()
        deadline = time.monotonic() + 10
        while _refused(guarded.url)["client_gone"] == before and time.monotonic() < deadline:
            time.sleep(0.05)
    assert _refused(guarded.url)["client_gone"] == before + 1
    assert _health_seconds(guarded.url) < 1
    assert not [r for r in caplog.records if r.exc_info]  # nothing logged with a traceback
