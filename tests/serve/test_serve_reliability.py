"""The server class of issue 25 on loopback: a failed event-log write, a stalled engine (a
stopped tensor-parallel rank), a client that leaves a non-streaming request, a model too large
for the memory at hand.

Expected values: line counts of the event log follow from its format as written down in each
test (one ``arrival``, one ``iteration`` per output token when requests run one at a time, one
``first_token``, one ``finish`` per request); memory estimates are compared with the bytes of
the tensors a real build allocates; refusal counts are the requests each test sends.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tracestory.serve.engine import Engine
from tracestory.serve.eventlog import EventLog
from tracestory.serve.metrics import ServerMetrics
from tracestory.serve.progress import Progress
from tracestory.serve.scheduler import Scheduler, SchedulerConfig
from tracestory.serve.server import Api, ServerLimits, start_in_thread

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")


def _post(url: str, body: dict, timeout: float = 30):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _sample(url: str, name: str, **labels) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    _, text = _get(url + "/metrics")
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


class _Model:
    """Samples token 7 for every sampling member; while ``hold`` is set each step waits for
    ``release`` (a forward stuck in a collective with a stopped rank)."""

    def __init__(self):
        self.hold = False
        self.release = threading.Event()
        self.holding = threading.Event()

    def step(self, members, iteration):
        if self.hold:
            self.holding.set()
            self.release.wait(60)
        return {m.request_id: 7 for m in members if m.samples}

    def memory(self):
        return None


def _scripted_server(log: EventLog, limits: ServerLimits | None = None):
    model = _Model()
    engine = Engine(Scheduler(SchedulerConfig(block_size=4, num_blocks=64, max_batch_tokens=64, max_num_seqs=4)),
                    model, log, ServerMetrics("m"))
    api = Api(engine, "m", vocab=512, limits=limits)
    return model, engine, api, start_in_thread(engine, api)


# --------------------------------------------------------------------------- event log on a full disk
def test_event_log_on_dev_full_is_refused_at_start_in_one_line():
    from tracestory.errors import UsageError

    with pytest.raises(UsageError) as e:
        EventLog("/dev/full", {"model": "x"})
    assert str(e.value) == "/dev/full: expected a writable event-log path, found No space left on device"


def test_full_disk_mid_run_loses_the_log_not_the_server(tmp_path, capfd):
    path = tmp_path / "sched.jsonl"
    log = EventLog(path, {"model": "m"})
    model, engine, _, h = _scripted_server(log)
    try:
        before = [_post(h.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 3})[0] for _ in range(2)]
        # the disk fills: from now on every write of the log's file fails with ENOSPC (a real
        # /dev/full file, line-buffered as the log's own)
        with log._lock:
            log._fh.close()
            log._fh = open("/dev/full", "w", buffering=1, encoding="utf-8")  # noqa: SIM115
        after = [_post(h.url + "/v1/completions", {"prompt": "a b c d", "max_tokens": 5}) for _ in range(3)]
        status, text = _get(h.url + "/health")
        lost_metric = _sample(h.url, "tracestory:event_log_lines_lost_total", model_name="m")
        alive = engine.alive
    finally:
        h.stop()
    assert before == [200, 200]
    assert [a[0] for a in after] == [200, 200, 200]
    assert [a[1]["usage"]["completion_tokens"] for a in after] == [5, 5, 5]
    assert alive and engine.error is None
    # one request run alone: arrival + 5 iterations (one per token) + first_token + finish = 8 lines
    assert log.lines_lost == 3 * 8
    assert lost_metric == 3 * 8
    health = json.loads(text)
    assert status == 200 and health["status"] == "ok"
    assert health["event_log"]["lines_lost"] == 24 and "No space left on device" in health["event_log"]["error"]
    err = capfd.readouterr().err
    said = [x for x in err.splitlines() if "event-log write failed" in x]
    assert said == [f"tracestory serve: {path}: event-log write failed (No space left on device); the log stops "
                    "here, the server keeps serving"]
    assert "Traceback" not in err
    # what was written before stays whole: meta + 2 x (arrival + 3 iterations + first_token + finish)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 1 + 2 * 6 and [x["type"] for x in lines].count("finish") == 2


class _CutsOff:
    """A line-buffered text file whose ``k``-th write from now lands half its line, then fails
    with ENOSPC (a disk that fills part-way through a line)."""

    def __init__(self, fh, k: int):
        self.fh, self.k = fh, k

    def write(self, text: str) -> int:
        self.k -= 1
        if self.k == 0:
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            raise OSError(28, "No space left on device")
        return self.fh.write(text)

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def test_a_write_that_fails_part_way_leaves_no_half_line(tmp_path, capfd):
    from tracestory.ingest.scheduler_log import read_scheduler_log
    from tracestory.serve.scheduler import Finish

    path = tmp_path / "sched.jsonl"
    log = EventLog(path, {"model": "m"})
    log.arrival(10, "r1", 3, 4)
    log._fh = _CutsOff(log._fh, 2)
    log.finish(20, Finish("r1", "length", 3, 4))        # written
    log.arrival(30, "r2", 5, 6)                          # half written, then ENOSPC
    log.finish(40, Finish("r2", "length", 5, 6))         # dropped
    log.close()
    assert log.lines_lost == 2 and log.failure is not None
    # the project's reader (ingest) takes the file: meta, r1's arrival and finish, nothing of r2
    got = read_scheduler_log(path)
    assert [a.request_id for a in got.arrivals] == ["r1"] and [f.request_id for f in got.finishes] == ["r1"]
    assert path.read_text().count("\n") == 3 and path.read_text().endswith("\n")
    assert capfd.readouterr().err.count("event-log write failed") == 1


# --------------------------------------------------------------------------- a stalled engine
def test_progress_names_the_step_and_the_tensor_parallel_cause():
    now = [100.0]
    p = Progress(tensor_parallel=2, clock=lambda: now[0])
    p.beat()
    p.doing("in the forward of iteration 57 (3 requests)")
    now[0] += 2.0
    assert p.stalled(2.0) is None                  # exactly the timeout: not yet
    now[0] += 0.6
    assert p.stalled(2.0) == ("engine stalled: no progress for 2.6 s (over --stall-timeout 2 s) in the forward of "
                              "iteration 57 (3 requests); tensor parallel 2: rank 0 waits in a collective step "
                              "for another rank, which may be stopped or dead")
    p.beat()                                       # the step returned: the loop turns again
    assert p.stalled(2.0) is None
    one = Progress(clock=lambda: now[0])
    now[0] += 5
    assert "tensor parallel" not in one.stalled(1.0)


def test_stalled_engine_fails_requests_and_health_then_recovers():
    model, engine, api, h = _scripted_server(EventLog(None, {}), ServerLimits(stall_timeout_s=1.0))
    try:
        assert _post(h.url + "/v1/completions", {"prompt": "a b", "max_tokens": 2})[0] == 200
        assert _get(h.url + "/health")[0] == 200
        model.hold = True
        got: dict = {}
        # the engine's clock is the test's while it is held, so both requests are surely waiting
        # (not refused at the door) when the stall begins, however loaded the machine
        now = [0.0]
        held = Progress(clock=lambda: now[0])
        t_stall = [0.0]

        def whole():
            got["whole"] = _post(h.url + "/v1/completions", {"prompt": "a b", "max_tokens": 3})
            got["took"] = time.monotonic() - t_stall[0]

        def stream():
            got["stream"] = _post_stream(h.url, {"prompt": "c d", "max_tokens": 3, "stream": True})

        threads = [threading.Thread(target=whole), threading.Thread(target=stream)]
        for t in threads:
            t.start()
        assert model.holding.wait(10)
        held.doing(engine.progress._doing)           # what the engine entered: the held forward
        engine.progress = held                       # the held step began at the test clock's 0
        deadline = time.monotonic() + 10
        while api.admission.admitted < 2:            # both handed to the engine, both waiting
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _get(h.url + "/health")[0] == 200     # held, but not for longer than the timeout yet
        t_stall[0] = time.monotonic()
        now[0] = 1.5                                 # the step has now run 1.5 s > --stall-timeout 1
        for t in threads:
            t.join(15)
        status, text = _get(h.url + "/health")
        new = _post(h.url + "/v1/completions", {"prompt": "e", "max_tokens": 1})
        refused = _sample(h.url, "tracestory:requests_refused_total", model_name="m", reason="stalled")
        model.hold = False
        model.release.set()
        deadline = time.monotonic() + 10
        while _get(h.url + "/health")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        healthy_again = _get(h.url + "/health")[0]
        after = _post(h.url + "/v1/completions", {"prompt": "a b", "max_tokens": 2})
    finally:
        h.stop()
    code, body, _ = got["whole"]
    assert code == 503
    assert "engine stalled: no progress for 1.5 s (over --stall-timeout 1 s)" in body["error"]["message"]
    assert got["took"] < 5                           # one poll (0.5 s) after the stall began, on a loaded machine
    chunks = got["stream"]
    assert chunks[-1] == "[DONE]" and "engine stalled" in chunks[-2]["error"]["message"]
    health = json.loads(text)
    assert status == 503 and health["status"] == "stalled"
    assert "in the forward of iteration" in health["reason"] and "tensor parallel" not in health["reason"]
    assert new[0] == 503 and new[2].get("Retry-After") == "1" and "engine stalled" in new[1]["error"]["message"]
    assert refused == 3                              # the waiting whole, the waiting stream, the new one
    assert healthy_again == 200
    assert after[0] == 200 and after[1]["usage"]["completion_tokens"] == 2


def _post_stream(url: str, body: dict) -> list:
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=30) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


# --------------------------------------------------------------------------- a client that leaves
@pytest.mark.parametrize("handler_cancellation", [True, False], ids=["aiohttp-cancels", "transport-poll"])
def test_non_streaming_request_of_a_client_that_left_is_cancelled_and_its_kv_freed(tmp_path, handler_cancellation):
    """A non-streaming request for 4,000 tokens whose client closes its socket: the running set
    and the KV cache are empty again within seconds (the tiny model makes a few hundred tokens
    per second here, so 4,000 would take far longer). Both ways the server notices: aiohttp's
    handler cancellation, and with it off the handler's own look at its transport."""
    pytest.importorskip("torch")
    from tracestory.serve import ServeOptions, build_server

    log = tmp_path / "sched.jsonl"
    engine, api = build_server(ServeOptions(port=0, num_blocks=512, event_log=str(log)))
    h = start_in_thread(engine, api, handler_cancellation=handler_cancellation)
    host, port = h.url.rsplit("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"prompt": "a b", "max_tokens": 4000, "ignore_eos": True}).encode()
    try:
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 20
        while _sample(h.url, "tracestory:num_requests_running", model_name="tiny") != 1:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.05)
        s.close()
        t_closed = time.monotonic()
        while (_sample(h.url, "tracestory:num_requests_running", model_name="tiny"),
               _sample(h.url, "tracestory:kv_cache_usage_perc", model_name="tiny")) != (0, 0):
            assert time.monotonic() - t_closed < 5, "the request kept running after its client left"
            time.sleep(0.05)
        assert engine.scheduler.num_running == 0 and engine.scheduler.kv.in_use == 0
    finally:
        h.stop()
    fins = [json.loads(x) for x in log.read_text().splitlines() if '"finish"' in x]
    assert len(fins) == 1 and fins[0]["reason"] == "cancelled" and fins[0]["error"] == "client disconnected"
    assert 0 < fins[0]["output_tokens"] < 4000


# --------------------------------------------------------------------------- model size vs memory
def test_footprint_estimate_equals_the_bytes_a_build_allocates():
    torch = pytest.importorskip("torch")
    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve.footprint import estimate
    from tracestory.serve.model import PagedLlama

    cfg = LlamaConfig.from_name("tiny")
    m = PagedLlama(cfg, layers=3, num_blocks=10, block_size=4, vocab=300, dtype=torch.float32)
    # the weights: every layer's parameters (not its unused contiguous caches or RoPE tables),
    # embedding, final norm, LM head; the KV cache: every layer's K and V tensors
    layer_bytes = sum(v.numel() * v.element_size() for k, v in m.stack.state_dict().items()
                      if "cache" not in k and k not in ("cos", "sin"))
    weights = layer_bytes + sum(t.numel() * t.element_size() for t in (m.embed, m.norm, m.lm_head))
    kv = sum(t.numel() * t.element_size() for t in m.k_cache + m.v_cache)
    fp = estimate(cfg, 3, 300, 4, num_blocks=10, block_size=4)
    assert (fp.weights, fp.kv) == (weights, kv)
    assert estimate(cfg, 3, 300, 4, 10, 4, processes=2).total == 2 * (weights + kv)


def test_check_fits_says_what_was_asked_the_estimate_and_the_memory():
    from tracestory.errors import UsageError
    from tracestory.serve.footprint import Footprint, check_fits

    check_fits("x", Footprint(10, 5), 15, "here")       # exactly fits
    check_fits("x", Footprint(10**15, 5), None, "unknown")  # memory unknown: nothing refused
    with pytest.raises(UsageError) as e:
        check_fits("serve --layers 9", Footprint(3 * 2**30, 2**30, processes=2), 2**30, "MemAvailable")
    assert str(e.value) == ("serve --layers 9: expected weights + KV cache to fit in the memory at hand, found "
                            "3.00 GiB weights + 1.00 GiB KV cache x 2 ranks on this host = 8.00 GiB (8589934592 "
                            "bytes) estimated, 1.00 GiB available (MemAvailable); use fewer --layers or "
                            "--num-blocks, or a smaller --preset/--vocab")


@pytest.mark.parametrize("extra", [[], ["--tensor-parallel", "2"]], ids=["one-process", "tp-launcher"])
def test_serve_with_a_million_layers_is_refused_before_it_allocates(extra):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tracestory.cli", "serve", "--layers", "1000000", "--port", "0", *extra],
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and r.stdout == ""
    # tiny (LlamaConfig): dim 64, 4 heads and 2 KV heads of 16, MLP 160; per layer wq, wo 64*64,
    # wk, wv 64*32, wg, wu, wd 64*160, 2 norms of 64: 4096*2 + 2048*2 + 10240*3 + 128 = 43,136
    # parameters; embedding and LM head 512*64 each, final norm 64; fp32. KV per layer: 513 blocks
    # (512 + the scratch block) x K and V x 16 tokens x 2 heads x 16 x 4 bytes.
    n = 1_000_000
    weights = (n * 43_136 + 2 * 512 * 64 + 64) * 4
    kv = n * 513 * 2 * 16 * 2 * 16 * 4
    ranks = 2 if extra else 1
    assert lines[0].startswith("tracestory: error: serve --preset tiny --layers 1000000 --vocab 512 --dtype fp32 "
                               "--num-blocks 512 --block-size 16")
    assert f"({ranks * (weights + kv)} bytes) estimated" in lines[0] and " available (" in lines[0]
    assert ("x 2 ranks on this host" in lines[0]) == bool(extra)
    assert took < 60                                   # refused before building (building took minutes)
