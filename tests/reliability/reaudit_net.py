"""The re-audit's server and load-generator cases.

Server: one ``tracestory serve --preset tiny --device cpu --port 0`` on loopback; each case is one
HTTP exchange a user (or a broken client) might send, over a raw socket: good requests, bad JSON,
wrong field types, huge or lying bodies, disconnects, unknown paths and methods. A case ends
``done`` (2xx), ``refused`` (4xx, or 503/429 with ``Retry-After``) or fails: ``http-500`` (a 5xx for
the client's mistake), ``no-answer`` (closed or silent where an answer was due), ``health-lost``
(``/health`` not 200 right after), ``server-died``.

Load: ``tracestory load`` against the same server, against stub servers that misbehave (each
request answered 500, 429, plain JSON, a cut stream, bad JSON, an error object, no ``[DONE]``,
negative usage), against a closed port and bad URLs, and with wrong flags. ``load`` exits 1 when
requests failed (an answer, not a failure); the judge is the one of every command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from reaudit_run import REPO, Case

STUB = r"""
import asyncio, json, socket, sys, threading
sys.path.insert(0, sys.argv[1])
from aiohttp import web
from sse_stub import Stub
class Always(dict):
    def __init__(self, b): super().__init__(); self.b = b
    def get(self, k, d=None): return self.b
urls = {}
loop = asyncio.new_event_loop()
for b in ["ok", "500", "429", "json", "disconnect", "badjson", "stream_error", "notsse", "nodone", "negative-usage"]:
    stub = Stub(Always("ok" if b == "negative-usage" else b),
                usages={k: {"prompt_tokens": 3, "completion_tokens": -10 ** 12} for k in range(10000)}
                if b == "negative-usage" else None)
    app = web.Application()
    app.router.add_post("/v1/completions", stub.handle)
    app.router.add_post("/v1/chat/completions", stub.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    loop.run_until_complete(runner.setup())
    s = socket.socket(); s.bind(("127.0.0.1", 0))
    loop.run_until_complete(web.SockSite(runner, s).start())
    urls[b] = f"http://127.0.0.1:{s.getsockname()[1]}"
print(json.dumps(urls), flush=True)
loop.run_forever()
"""


def start_stub() -> tuple[subprocess.Popen, dict[str, str]]:
    p = subprocess.Popen([sys.executable, "-c", STUB, str(REPO / "tests" / "loadgen")], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    return p, json.loads(p.stdout.readline())


def start_server(work: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    log = open(work / "serve.out", "w")
    p = subprocess.Popen([sys.executable, "-m", "tracestory.cli", "serve", "--preset", "tiny", "--device", "cpu",
                          "--port", "0", "--event-log", str(work / "serve.sched.jsonl"), "--skip-power-monitor",
                          "--max-request-mb", "1"],
                         stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True, cwd=work)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if "listening on" in line:
            return p, line.rsplit(" ", 1)[-1].strip()
        if not line and p.poll() is not None:
            break
    raise RuntimeError(f"tracestory serve did not start: {(work / 'serve.out').read_text()[-500:]}")


def stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGINT)
        p.wait(20)
    except (OSError, subprocess.TimeoutExpired):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


# ------------------------------------------------------------------------- server cases
def _req(method: str, path: str, body: bytes | None, headers: dict | None = None) -> bytes:
    h = {"Host": "x", "Content-Type": "application/json", "Connection": "close", **(headers or {})}
    if body is not None and "Content-Length" not in h and "Transfer-Encoding" not in h:
        h["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode() + (body or b"")


def _comp(**fields) -> bytes:
    return json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 4, **fields}).encode()


def server_exchanges() -> list[tuple[str, bytes, str]]:
    """(name, raw bytes to send, how: "answer" | "close-after-send" | "close-early")."""
    c = "/v1/completions"
    ex = [("get-health", _req("GET", "/health", None), "answer"), ("get-metrics", _req("GET", "/metrics", None),
                                                                   "answer"),
          ("get-models", _req("GET", "/v1/models", None), "answer"),
          ("completion", _req("POST", c, _comp()), "answer"),
          ("completion-stream", _req("POST", c, _comp(stream=True)), "answer"),
          ("chat", _req("POST", "/v1/chat/completions", json.dumps(
              {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()), "answer"),
          ("chat-stream", _req("POST", "/v1/chat/completions", json.dumps(
              {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
               "stream": True}).encode()), "answer")]
    for name, body in [("cut-json", b'{"model": "tiny", "prompt": '), ("empty-body", b""), ("null", b"null"),
                       ("list", b"[]"), ("number", b"1"), ("string", b'"s"'), ("not-utf8", b'{"prompt": "\xff\xfe"}'),
                       ("deep-100k", b"[" * 100000 + b"]" * 100000), ("nan-literal", b'{"prompt": "x", '
                                                                                    b'"temperature": NaN}'),
                       ("duplicate-keys", b'{"prompt": "x", "prompt": 5, "max_tokens": 2}'),
                       ("bom", b'\xef\xbb\xbf' + _comp())]:
        ex.append((f"body-{name}", _req("POST", c, body), "answer"))
    for name, fields in [("prompt-number", {"prompt": 5}), ("prompt-null", {"prompt": None}),
                         ("prompt-empty-list", {"prompt": []}), ("prompt-token-ids", {"prompt": [1, 2, 3]}),
                         ("prompt-nested", {"prompt": [[1, 2], [3]]}), ("prompt-empty", {"prompt": ""}),
                         ("prompt-huge-ids", {"prompt": [2 ** 64]}), ("prompt-negative-ids", {"prompt": [-1]}),
                         ("max-tokens-negative", {"max_tokens": -1}), ("max-tokens-zero", {"max_tokens": 0}),
                         ("max-tokens-string", {"max_tokens": "4"}), ("max-tokens-1e9", {"max_tokens": 10 ** 9}),
                         ("max-tokens-2^64", {"max_tokens": 2 ** 64}), ("max-tokens-float", {"max_tokens": 2.5}),
                         ("temperature-string", {"temperature": "x"}), ("temperature-negative", {"temperature": -1}),
                         ("temperature-huge", {"temperature": 1e308}), ("top-p-2", {"top_p": 2}),
                         ("top-p-negative", {"top_p": -0.5}), ("top-k-string", {"top_k": "x"}),
                         ("stream-string", {"stream": "yes"}), ("n-2", {"n": 2}), ("n-0", {"n": 0}),
                         ("stop-number", {"stop": 5}), ("stop-list", {"stop": ["a", "b"]}),
                         ("model-unknown", {"model": "nope"}), ("model-number", {"model": 5}),
                         ("model-missing", {"model": None}), ("unknown-field", {"frobnicate": True}),
                         ("logprobs", {"logprobs": 5}), ("seed-negative", {"seed": -1}),
                         ("ignore-eos", {"ignore_eos": True}), ("echo", {"echo": True}),
                         ("presence-penalty-huge", {"presence_penalty": 1e300}),
                         ("stream-options", {"stream": True, "stream_options": {"include_usage": True}}),
                         ("long-prompt", {"prompt": "word " * 20000})]:
        ex.append((f"field-{name}", _req("POST", c, _comp(**fields)), "answer"))
    ex += [("chat-no-messages", _req("POST", "/v1/chat/completions", b'{"model": "tiny"}'), "answer"),
           ("chat-messages-string", _req("POST", "/v1/chat/completions", b'{"model": "tiny", "messages": "hi"}'),
            "answer"),
           ("chat-role-unknown", _req("POST", "/v1/chat/completions", json.dumps(
               {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2}).encode()),
            "answer"),
           ("body-over-cap", _req("POST", c, _comp(prompt="x" * (3 << 20))), "answer"),
           ("content-length-lies-short", _req("POST", c, _comp()[:10], {"Content-Length": "500"}), "close-after-send"),
           ("content-length-negative", _req("POST", c, _comp(), {"Content-Length": "-1"}), "answer"),
           ("content-length-text", _req("POST", c, _comp(), {"Content-Length": "abc"}), "answer"),
           ("content-length-huge", _req("POST", c, b"{", {"Content-Length": str(10 ** 15)}), "close-after-send"),
           ("chunked-garbage", _req("POST", c, b"zz\r\nxx\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"}), "answer"),
           ("content-type-text", _req("POST", c, _comp(), {"Content-Type": "text/plain"}), "answer"),
           ("header-100k", _req("GET", "/health", None, {"X-Big": "a" * 100000}), "answer"),
           ("headers-2000", _req("GET", "/health", None, {f"X-{i}": "1" for i in range(2000)}), "answer"),
           ("disconnect-after-head", _req("POST", c, None, {"Content-Length": "50"}), "close-early"),
           ("disconnect-during-stream", _req("POST", c, _comp(stream=True, max_tokens=2000, ignore_eos=True)),
            "close-early"),
           ("disconnect-non-streaming", _req("POST", c, _comp(max_tokens=2000, ignore_eos=True)), "close-early"),
           ("get-completions", _req("GET", c, None), "answer"), ("post-unknown-path", _req("POST", "/nope", b"{}"),
                                                                 "answer"),
           ("dotdot-path", _req("GET", "/../../etc/passwd", None), "answer"),
           ("long-url", _req("GET", "/health?" + "a" * 100000, None), "answer"),
           ("query-string", _req("POST", c + "?x=1", _comp()), "answer"),
           ("head-health", _req("HEAD", "/health", None), "answer"), ("put", _req("PUT", c, _comp()), "answer"),
           ("delete", _req("DELETE", c, None), "answer"), ("method-garbage", _req("FOO", c, None), "answer"),
           ("http-1.0", b"GET /health HTTP/1.0\r\n\r\n", "answer"), ("not-http", b"\x16\x03\x01\x02\x00" * 20,
                                                                      "answer"),
           ("request-line-garbage", b"hello\r\n\r\n", "answer"), ("profile-start", _req("POST", "/start_profile", b""),
                                                                   "answer")]
    return ex


def _exchange(host: str, port: int, data: bytes, how: str, timeout: float = 30.0) -> tuple[int | None, bytes]:
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        if how == "close-early":
            time.sleep(0.3)
            return 0, b""
        if how == "close-after-send":
            s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return None, got
            except ConnectionError:
                break
            if not chunk:
                break
            got += chunk
            if len(got) > 4 << 20:
                break
    except (TimeoutError, ConnectionError) as e:
        return -1, str(e).encode()
    finally:
        s.close()
    try:
        return int(got.split(b" ", 2)[1]), got
    except (IndexError, ValueError):
        return -1, got[:200]


def _health(host: str, port: int) -> int | None:
    try:
        code, _ = _exchange(host, port, _req("GET", "/health", None), "answer", timeout=10)
        return code
    except OSError:
        return None


def run_exchanges(proc: subprocess.Popen, url: str, exchanges: list) -> list[dict]:
    """Run ``exchanges`` in order against the running server; one judged record per exchange."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    port = int(port)
    recs = []
    if True:
        for name, data, how in exchanges:
            t0 = time.monotonic()
            try:
                code, got = _exchange(host, port, data, how)
            except OSError as e:
                code, got = -1, str(e).encode()
            secs = time.monotonic() - t0
            time.sleep(0.05)
            health = _health(host, port)
            if how == "close-early":   # the work of a client that left must end: running set back to empty
                for _ in range(100):
                    if health == 200:
                        break
                    time.sleep(0.1)
                    health = _health(host, port)
            if proc.poll() is not None:
                outcome, why = "server-died", f"exit {proc.returncode}"
            elif code is None:
                outcome, why = "no-answer", "no response within 30 s"
            elif health != 200:
                outcome, why = "health-lost", f"/health {health} after the case"
            elif how != "answer":
                outcome, why = "done", "client left; server healthy"
            elif code == -1:
                outcome, why = "no-answer", f"connection closed without a status line: {got[:80]!r}"
            elif 200 <= code < 300:
                outcome, why = "done", str(code)
            elif 400 <= code < 500 or (code in (503, 429) and b"Retry-After" in got):
                outcome, why = "refused", got.split(b"\r\n", 1)[0].decode("latin-1")[:100]
            else:
                outcome, why = "http-500", got[:200].decode("latin-1")
            recs.append({"name": f"server/{name}", "cls": "server", "outcome": outcome, "why": why,
                         "secs": round(secs, 3)})
    return recs


def server_tracebacks(work: Path) -> list[dict]:
    """A record for a traceback in the stopped server's stderr (none: an empty list)."""
    tail = (work / "serve.out").read_text()
    if "Traceback (most recent call last)" not in tail:
        return []
    return [{"name": "server/stderr", "cls": "server", "outcome": "traceback",
             "why": tail[tail.index("Traceback"):][:300], "secs": 0}]


# ------------------------------------------------------------------------- load cases
def load_cases(url: str, stubs: dict[str, str]) -> list[Case]:
    base = ["load", "--model", "tiny", "--num-prompts", "3", "--random-input-len", "4", "--random-output-len", "4",
            "--no-progress", "--skip-power-monitor", "--request-rate", "inf"]
    out = []

    def add(name, argv, **kw):
        kw.setdefault("allow_1", True)
        cls = kw.pop("cls_override", "load")
        out.append(Case(cls, f"{cls}/load/{name}", argv, timeout_s=kw.pop("timeout_s", 60), **kw))

    add("ok-json", [*base, "--base-url", url, "--json", "s.json"], outputs=["s.json"])
    add("ok-chat", [*base, "--base-url", url, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions"])
    add("ok-no-stream", [*base, "--base-url", url, "--no-stream"])
    add("ok-save-result", [*base, "--base-url", url, "--save-result", "--result-dir", "res"])
    for b, u in stubs.items():
        add(f"stub-{b}", [*base, "--base-url", u, "--json", "s.json", "--timeout", "10"])
        add(f"stub-{b}-no-stream", [*base, "--base-url", u, "--no-stream", "--timeout", "10"])
    for name, u in [("closed-port", "http://127.0.0.1:1"), ("not-a-url", "notaurl"), ("ftp", "ftp://127.0.0.1/x"),
                    ("no-host", "http://"), ("bad-ipv6", "http://[::1"), ("port-99999", "http://127.0.0.1:99999"),
                    ("unresolvable", "http://no-such-host.invalid:8000"), ("path-in-url", url + "/v1/completions"),
                    ("trailing-slash", url + "/"), ("https-to-http", url.replace("http:", "https:")),
                    ("empty", "")]:
        add(f"url-{name}", [*base, "--base-url", u, "--timeout", "5"], timeout_s=60)
    for name, flags in [("port-70000", ["--port", "70000"]), ("port-text", ["--port", "x"]),
                        ("endpoint-unknown", ["--base-url", url, "--endpoint", "/nope"]),
                        ("model-unknown", ["--base-url", url, "--model", "nope"]),
                        ("num-prompts-0", ["--base-url", url, "--num-prompts", "0"]),
                        ("num-prompts-negative", ["--base-url", url, "--num-prompts", "-1"]),
                        ("num-prompts-text", ["--base-url", url, "--num-prompts", "abc"]),
                        ("rate-negative", ["--base-url", url, "--request-rate", "-1"]),
                        ("rate-zero", ["--base-url", url, "--request-rate", "0"]),
                        ("rate-nan", ["--base-url", url, "--request-rate", "nan"]),
                        ("burstiness-0", ["--base-url", url, "--burstiness", "0"]),
                        ("burstiness-negative", ["--base-url", url, "--burstiness", "-1"]),
                        ("concurrency-0", ["--base-url", url, "--max-concurrency", "0"]),
                        ("timeout-0", ["--base-url", url, "--timeout", "0"]),
                        ("timeout-negative", ["--base-url", url, "--timeout", "-1"]),
                        ("duration-negative", ["--base-url", url, "--duration", "-1"]),
                        ("input-len-0", ["--base-url", url, "--random-input-len", "0"]),
                        ("input-len-negative", ["--base-url", url, "--random-input-len", "-4"]),
                        ("output-len-0", ["--base-url", url, "--random-output-len", "0"]),
                        ("range-ratio-2", ["--base-url", url, "--random-range-ratio", "2"]),
                        ("temperature-negative", ["--base-url", url, "--temperature", "-1"]),
                        ("top-p-2", ["--base-url", url, "--top-p", "2"]),
                        ("extra-body-not-json", ["--base-url", url, "--extra-body", "{nope"]),
                        ("extra-body-list", ["--base-url", url, "--extra-body", "[1]"]),
                        ("goodput-bad", ["--base-url", url, "--goodput", "ttft"]),
                        ("goodput-unknown", ["--base-url", url, "--goodput", "nope:5"]),
                        ("metadata-bad", ["--base-url", url, "--metadata", "noequals"]),
                        ("percentile-metrics-unknown", ["--base-url", url, "--percentile-metrics", "nope"]),
                        ("metric-percentiles-101", ["--base-url", url, "--metric-percentiles", "101"]),
                        ("metric-percentiles-text", ["--base-url", url, "--metric-percentiles", "a,b"]),
                        ("sharegpt-no-path", ["--base-url", url, "--dataset-name", "sharegpt"]),
                        ("dataset-missing", ["--base-url", url, "--dataset-name", "custom", "--dataset-path",
                                             "missing.jsonl"]),
                        ("dataset-empty", ["--base-url", url, "--dataset-name", "custom", "--dataset-path",
                                           "empty.jsonl"]),
                        ("dataset-bad-json", ["--base-url", url, "--dataset-name", "custom", "--dataset-path",
                                              "bad.jsonl"]),
                        ("dataset-folder", ["--base-url", url, "--dataset-name", "custom", "--dataset-path", "adir"]),
                        ("tokenizer-missing", ["--base-url", url, "--tokenizer", "/nonexistent/tok"]),
                        ("warmup-negative", ["--base-url", url, "--warmup-requests", "-1"]),
                        ("ramp-without-rates", ["--base-url", url, "--ramp-up-strategy", "linear"]),
                        ("profile-no-endpoint", ["--base-url", url, "--profile"]),
                        ("max-requests-0", ["--base-url", url, "--max-requests", "0"])]:
        add(f"flag-{name}", [*base, *flags], timeout_s=60,
            prepare=[("mkdir", "adir"), ("write", "empty.jsonl", ""), ("write", "bad.jsonl", "{nope\n")])
    # outputs of load
    for name, flags, dash in [("json-dash", ["--json", "-"], "json"), ("output-dash", ["--output", "-"], "text"),
                              ("both-dash", ["--json", "-", "--output", "-"], None),
                              ("json-dev-full", ["--json", "/dev/full"], None),
                              ("json-missing-folder", ["--json", "new/sub/s.json"], None),
                              ("json-file-as-folder", ["--json", "afile/s.json"], None),
                              ("json-existing-folder", ["--json", "adir"], None),
                              ("json-and-output-same", ["--json", "same.json", "--output", "same.json"], None),
                              ("result-dir-file", ["--save-result", "--result-dir", "afile"], None)]:
        add(f"output-{name}", [*base, "--base-url", url, *flags], dash=dash,
            prepare=[("write", "afile", "x"), ("mkdir", "adir")],
            outputs=[f for f in ("s.json", "new/sub/s.json", "same.json") if f in flags],
            expect_refusal=name in ("both-dash", "json-and-output-same"), cls_override="outputs")
    return out
