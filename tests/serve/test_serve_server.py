"""The paged Llama model and the real HTTP server (tiny config, CPU, loopback).

Expected values: the paged forward is compared with the contiguous-cache layers of
``tracestory.models.llama`` (an independent implementation of the same math); the token counts
and ids follow from the documented word rule worked out in the test; the event log is checked
against the format spec (serve_format.md) by a validator written here.
"""

from __future__ import annotations

import asyncio
import json
import math
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tracestory.serve import prompt_of_tokens

VOCAB_TINY = 512


# --------------------------------------------------------------------------- the token rule
def test_token_rule():
    from tracestory.serve import count_tokens, token_text, tokenize

    # 't<k>' is k mod vocab; any other word is crc32(word) mod vocab: crc32(b"hello") = 907060870,
    # 907060870 = 512 * 1771603 + 134
    assert tokenize("t5  t600\nhello", 512) == [5, 88, 134]
    assert tokenize("", 512) == [] and count_tokens(" a  b\tc ") == 3
    assert token_text(42) == " t42"
    p = prompt_of_tokens(300, seed=7)
    assert len(p.split()) == 300 and p == prompt_of_tokens(300, seed=7) != prompt_of_tokens(300, seed=8)
    assert all(w[0] == "t" and 0 <= int(w[1:]) < 512 for w in p.split())


# --------------------------------------------------------------------------- the model
def test_paged_forward_matches_contiguous_reference():
    import torch

    from tracestory.models.llama import build_model
    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve.model import PagedLlama

    cfg = LlamaConfig.from_name("tiny")
    S = 37
    ref = build_model(cfg, layers=2, batch=1, max_len=S, dtype=torch.float64, seed=3)
    paged = PagedLlama(cfg, layers=2, num_blocks=16, block_size=4, dtype=torch.float64, seed=3)
    # same layer weights as the reference (its contiguous caches and RoPE tables are not weights)
    weights = {k: v for k, v in ref.state_dict().items() if "cache" not in k and k not in ("cos", "sin")}
    paged.stack.load_state_dict(weights, strict=False)
    x = torch.randn(S, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    table = [5, 2, 9, 0, 7, 1, 3, 4, 6, 8]          # scattered blocks: positions 0-3 in block 5, ...
    with torch.inference_mode():
        want = ref(x[None], 0, False)[0]             # one causal prefill over all 37 positions
        # chunked prefill, then single-token steps, through the block table
        got = torch.cat([paged.forward_hidden(x[a:b], [(a, b - a, table)])
                         for a, b in [(0, 10), (10, 11), (11, 30), (30, 31), (31, 37)]])
    assert torch.allclose(got, want, atol=1e-10, rtol=0)


def test_mixed_batch_equals_separate_runs():
    """Two decode tokens with contexts of different lengths (6 and 3: the shorter one padded and
    masked) and a 4-token prefill chunk in one forward give the hidden states of running each
    request alone: attention stays inside each request."""
    import torch

    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve.model import PagedLlama

    cfg = LlamaConfig.from_name("tiny")
    g = torch.Generator().manual_seed(1)
    xa, xb, xc = (torch.randn(n, cfg.dim, dtype=torch.float64, generator=g) for n in (6, 9, 3))
    ta, tb, tc = [0, 1], [2, 3, 4], [5]
    with torch.inference_mode():
        m1 = PagedLlama(cfg, layers=2, num_blocks=8, block_size=4, dtype=torch.float64, seed=5)
        ha, hb, hc = (m1.forward_hidden(x, [(0, len(x), t)]) for x, t in ((xa, ta), (xb, tb), (xc, tc)))
        m2 = PagedLlama(cfg, layers=2, num_blocks=8, block_size=4, dtype=torch.float64, seed=5)
        m2.forward_hidden(xa[:5], [(0, 5, ta)])
        m2.forward_hidden(xb[:5], [(0, 5, tb)])
        m2.forward_hidden(xc[:2], [(0, 2, tc)])
        mixed = m2.forward_hidden(torch.cat([xa[5:], xb[5:], xc[2:]]), [(5, 1, ta), (5, 4, tb), (2, 1, tc)])
    assert torch.allclose(mixed[0], ha[5], atol=1e-10, rtol=0)
    assert torch.allclose(mixed[1:5], hb[5:], atol=1e-10, rtol=0)
    assert torch.allclose(mixed[5], hc[2], atol=1e-10, rtol=0)


# --------------------------------------------------------------------------- event-log validator
ACTIONS = {"admit", "chunk", "wait", "preempt", "finish"}


def validate_event_log(lines: list[str]) -> list[dict]:
    """Check every line against serve_format.md; returns the parsed objects."""
    objs = [json.loads(line) for line in lines]
    meta = objs[0]
    assert meta["type"] == "meta" and meta["version"] == 1 and meta["engine"] == "tracestory-serve"
    for k in ("block_size", "num_blocks", "max_batch_tokens", "max_num_seqs", "t0_unix_ns"):
        assert isinstance(meta[k], int) and meta[k] > 0, k
    assert isinstance(meta["model"], str) and isinstance(meta["device"], str)
    # the log's t0 on this host's monotonic clock: written by a server that ran before now
    assert isinstance(meta["t0_mono_ns"], int) and 0 < meta["t0_mono_ns"] < time.monotonic_ns()
    for o in objs[1:]:
        t = o["type"]
        if t == "arrival":
            assert isinstance(o["t_ns"], int) and o["t_ns"] >= 0 and isinstance(o["request_id"], str)
            assert o["prompt_tokens"] >= 1 and o["max_new_tokens"] >= 1
        elif t == "iteration":
            assert isinstance(o["iter"], int) and 0 <= o["t_start_ns"] <= o["t_end_ns"]
            for m in o["members"]:
                assert m["phase"] in ("prefill", "decode") and m["tokens"] >= 1 and m["context"] >= m["tokens"]
                assert m["phase"] == "decode" or isinstance(m["chunked"], bool)
            for d in o["decisions"]:
                assert d["action"] in ACTIONS and isinstance(d["reason"], str) and d["reason"]
            kv = o["kv"]
            assert 0 <= kv["in_use"] <= kv["total"] == meta["num_blocks"] and kv["allocated"] >= 0 <= kv["freed"]
            assert isinstance(o["waiting"], int) and isinstance(o["running"], int)
            assert "memory" not in o or o["memory"]["allocated_bytes"] >= 0
        elif t == "first_token":
            assert isinstance(o["t_ns"], int) and isinstance(o["request_id"], str)
        elif t == "finish":
            assert o["reason"] in ("length", "stop", "error", "cancelled")
            assert o["reason"] != "error" or isinstance(o["error"], str)
        else:
            raise AssertionError(f"unknown line type {t!r}")
    return objs


# --------------------------------------------------------------------------- the real server
def _word_ids(text: str) -> list[int]:
    """The token rule for words 't<k>' (k < vocab): id k."""
    words = text.split()
    assert all(w[0] == "t" and w[1:].isdigit() for w in words), text
    return [int(w[1:]) for w in words]


def _post(url: str, body, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def _stream(session, url: str, body: dict) -> list:
    """SSE 'data:' payloads of one streaming request (parsed JSON, or the string '[DONE]')."""
    out = []
    async with session.post(url, json=body) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                payload = line[len("data: "):]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


@pytest.fixture(scope="module", autouse=True)
def _booting_server(tmp_path_factory):
    """Start the server process before the first test of this module, so that its start-up
    (importing torch, building the model) overlaps the in-process model tests."""
    log = tmp_path_factory.mktemp("serve") / "sched.jsonl"
    # a small budget and cache so that chunked prefill happens: 64 blocks x 4 = 256 token slots
    cmd = [sys.executable, "-m", "tracestory.cli", "serve", "--preset", "tiny", "--device", "cpu", "--port", "0",
           "--block-size", "4", "--num-blocks", "64", "--max-batch-tokens", "16", "--max-num-seqs", "4",
           "--event-log", str(log)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    yield {"proc": proc, "log": log, "lines": lines}
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(_booting_server):
    proc = _booting_server["proc"]
    try:
        first = _booting_server["lines"].get(timeout=60)
    except queue.Empty:
        proc.kill()
        pytest.fail(f"server printed no ready line: {proc.stderr.read()}")
    assert first.startswith("tracestory serve: listening on http://127.0.0.1:"), first
    url = first.split("listening on ")[1].strip()
    return {"proc": proc, "url": url, "log": _booting_server["log"], "ids": {}}


def test_health_models_and_bad_requests(server):
    url = server["url"]
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["tiny"]      # default: the preset name
    comp = url + "/v1/completions"
    for body, raw, param in [({"prompt": "", "max_tokens": 4}, None, "prompt"),
                             (None, b"{not json", None),
                             ({"prompt": "t1 t2", "max_tokens": 0}, None, "max_tokens"),
                             ({"prompt": [1, 2, VOCAB_TINY]}, None, "prompt"),
                             # 250 + 8 - 1 = 257 KV slots > 64 blocks x 4
                             ({"prompt": prompt_of_tokens(250, 0), "max_tokens": 8}, None, "max_tokens")]:
        status, err = _post(comp, body, raw)
        assert status == 400, body
        assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param
    status, err = _post(url + "/v1/chat/completions", {"messages": [], "max_tokens": 2})
    assert status == 400 and err["error"]["param"] == "messages"


def test_non_streaming_completion_and_token_ids(server):
    url = server["url"] + "/v1/completions"
    prompt = prompt_of_tokens(20, seed=1)
    assert len(prompt.split()) == 20
    status, a = _post(url, {"model": "tiny", "prompt": prompt, "max_tokens": 5})
    assert status == 200 and a["object"] == "text_completion" and a["model"] == "tiny"
    assert a["usage"] == {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
    assert a["choices"][0]["finish_reason"] == "length" and len(_word_ids(a["choices"][0]["text"])) == 5
    # the same prompt as token ids (words 't<k>' with k < 512 are ids k) gives the same greedy text
    status, b = _post(url, {"prompt": _word_ids(prompt), "max_tokens": 5})
    assert status == 200 and b["choices"][0]["text"] == a["choices"][0]["text"] and b["id"] != a["id"]
    server["ids"].update({a["id"]: (20, 5), b["id"]: (20, 5)})


def test_concurrent_streams_completions_and_chat(server):
    import aiohttp

    base = server["url"]
    lens = [3, 30, 41, 7, 12]                 # with a 16-token budget the long prompts are chunked

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            tasks = [_stream(s, base + "/v1/completions", {"prompt": prompt_of_tokens(n, seed=n), "max_tokens": 6,
                                                           "stream": True}) for n in lens]
            tasks.append(_stream(s, base + "/v1/chat/completions", {
                "messages": [{"role": "user", "content": prompt_of_tokens(9, seed=9)}], "max_tokens": 4,
                "stream": True}))
            return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    for n, chunks in zip(lens + [9], results):
        chat = n == 9
        want_out = 4 if chat else 6
        assert chunks[-1] == "[DONE]"
        token_chunks, last = chunks[:-2], chunks[-2]
        assert len(token_chunks) == want_out                       # one chunk per token
        for i, c in enumerate(token_chunks):
            ch = c["choices"][0]
            assert ch["finish_reason"] is None
            text = ch["delta"]["content"] if chat else ch["text"]
            assert len(_word_ids(text)) == 1
            if chat:
                assert c["object"] == "chat.completion.chunk" and (("role" in ch["delta"]) == (i == 0))
        assert last["choices"][0]["finish_reason"] == "length"
        assert last["usage"] == {"prompt_tokens": n, "completion_tokens": want_out, "total_tokens": n + want_out}
        assert len({c["id"] for c in chunks[:-1]}) == 1
        server["ids"][last["id"]] = (n, want_out)


def test_sigterm_closes_a_valid_event_log(server):
    proc = server["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    objs = validate_event_log(server["log"].read_text().splitlines())
    meta = objs[0]
    assert (meta["block_size"], meta["num_blocks"], meta["max_batch_tokens"], meta["max_num_seqs"]) == (4, 64, 16, 4)
    arrivals = {o["request_id"]: o for o in objs if o["type"] == "arrival"}
    finishes = {o["request_id"]: o for o in objs if o["type"] == "finish"}
    firsts = {o["request_id"] for o in objs if o["type"] == "first_token"}
    iters = [o for o in objs if o["type"] == "iteration"]
    ids = server["ids"]
    assert set(ids) == set(arrivals) == set(finishes) == firsts      # 400s never reach the engine
    for rid, (p, out) in ids.items():
        assert arrivals[rid]["prompt_tokens"] == p
        assert (finishes[rid]["reason"], finishes[rid]["prompt_tokens"], finishes[rid]["output_tokens"]) == (
            "length", p, out)
        steps = [m for it in iters for m in it["members"] if m["request_id"] == rid]
        # no preemption with this cache: prefill chunks sum to the prompt, then out-1 decode steps
        assert sum(m["tokens"] for m in steps if m["phase"] == "prefill") == p
        assert sum(m["phase"] == "decode" for m in steps) == out - 1
        assert steps[-1]["context"] == p + out - 1
    assert [it["iter"] for it in iters] == list(range(len(iters)))
    in_use = 0
    for it in iters:
        assert sum(m["tokens"] for m in it["members"]) <= 16
        in_use += it["kv"]["allocated"] - it["kv"]["freed"]
        assert it["kv"]["in_use"] == in_use
    assert in_use == 0
    reasons = [d["reason"] for it in iters for d in it["decisions"] if d["action"] == "chunk"]
    assert reasons and all("> token budget left" in r for r in reasons)


# --------------------------------------------------------------------------- failures, disconnects
def test_fail_rate_and_client_disconnect(tmp_path):
    import aiohttp

    from tracestory.serve import ServeOptions, start_server_thread, wait_healthy

    log = tmp_path / "fail.jsonl"
    h = start_server_thread(ServeOptions(port=0, fail_rate=0.5, num_blocks=64, event_log=str(log)))
    try:
        assert wait_healthy(h.url, timeout_s=10) >= 0
        # rule: request k fails iff floor(k/2) > floor((k-1)/2), i.e. k = 2, 4
        got = [_post(h.url + "/v1/completions", {"prompt": "t1 t2 t3", "max_tokens": 2})[0] for _ in range(4)]
        assert got == [200, 500, 200, 500]

        async def disconnect():
            async with aiohttp.ClientSession() as s:
                # request 5 (kept): read two token chunks, then drop the connection
                async with s.post(h.url + "/v1/completions", json={"prompt": "t1", "max_tokens": 200,
                                                                   "stream": True}) as resp:
                    seen = 0
                    async for raw in resp.content:
                        seen += raw.startswith(b"data: ")
                        if seen == 2:
                            break
                # request 6 is an injected failure: HTTP 500 before the stream starts
                async with s.post(h.url + "/v1/completions", json={"prompt": "t1", "stream": True}) as resp:
                    return resp.status, (await resp.json())["error"]["type"]

        assert asyncio.run(disconnect()) == (500, "server_error")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and '"reason":"cancelled"' not in log.read_text():
            time.sleep(0.05)
    finally:
        h.stop()
    objs = validate_event_log(log.read_text().splitlines())
    # the disconnect is noticed asynchronously: cmpl-5's finish may come after cmpl-6's
    fins = {o["request_id"]: o["reason"] for o in objs if o["type"] == "finish"}
    assert fins == {"cmpl-1": "length", "cmpl-2": "error", "cmpl-3": "length", "cmpl-4": "error",
                    "cmpl-5": "cancelled", "cmpl-6": "error"}
    out5 = next(o["output_tokens"] for o in objs if o["type"] == "finish" and o["request_id"] == "cmpl-5")
    assert 2 <= out5 < 200 and math.isfinite(out5)
