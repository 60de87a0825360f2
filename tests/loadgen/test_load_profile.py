"""``tracestory load --profile`` against fake servers with vLLM's and SGLang's endpoint shapes
(POST /start_profile and /stop_profile at the root; vLLM without its profiler folder has no such
routes: 404) and against ``tracestory serve --profiler-dir`` on loopback (CPU, tiny preset),
whose trace must hold every engine iteration its scheduler log records. Expected values: the
order of calls each fake server saw, the scheduler log's iteration numbers read with plain
``json``, and the HTTP statuses the server's docstring promises."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from tracestory.serve import ServeOptions, start_server_thread

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)


class ProfiledStub(Stub):
    """The SSE stub that also logs, in order, every profile call and every completion request."""

    def __init__(self, shape: str, stop_status: int = 200):
        super().__init__()
        self.shape, self.stop_status = shape, stop_status
        self.events: list[tuple[str, bytes]] = []

    async def handle(self, request):
        self.events.append(("request", b""))
        return await super().handle(request)

    async def start(self, request):
        body = await request.read()
        self.events.append(("start", body))
        if self.shape == "sglang":            # answers text, reads an optional JSON body
            return web.Response(text="Start profiling.\n")
        return web.Response(status=200)       # vLLM: empty 200

    async def stop(self, request):
        self.events.append(("stop", await request.read()))
        if self.stop_status != 200:
            return web.json_response({"error": "trace write failed"}, status=self.stop_status)
        return web.Response(text="Stop profiling. This will take some time.\n" if self.shape == "sglang" else "")

    def routes(self):
        return [("POST", "/start_profile", self.start), ("POST", "/stop_profile", self.stop)]


def load(url: str, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--url", url, "--model", "m",
                           "--num-prompts", "4", "--random-input-len", "3", "--random-output-len", "2",
                           "--no-progress", "--skip-power-monitor", "--save-result", "--result-dir", str(tmp_path),
                           "--result-filename", "r.json", "--profile", *extra],
                          capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("shape", ["vllm", "sglang"])
def test_profile_calls_wrap_the_measured_run(stub_server, tmp_path, shape):
    stub = ProfiledStub(shape)
    url = stub_server(stub, routes=stub.routes())
    extra = ("--profile-body", '{"num_steps": 5, "activities": ["GPU"]}') if shape == "sglang" else ()
    p = load(url, tmp_path, "--warmup-requests", "2", *extra)
    assert p.returncode == 0, p.stderr[-1500:]
    kinds = [k for k, _ in stub.events]
    # 2 warm-up requests first, not profiled; then start, the 4 measured requests, stop
    assert kinds == ["request"] * 2 + ["start"] + ["request"] * 4 + ["stop"]
    start_body = stub.events[2][1]
    if shape == "sglang":
        assert json.loads(start_body) == {"num_steps": 5, "activities": ["GPU"]}
    else:
        assert start_body == b""                               # vLLM's endpoint reads no body
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["profile"]["start"]["status"] == 200 and res["profile"]["stop"]["ok"] is True
    assert res["profile"]["start"]["url"] == f"{url}/start_profile"
    assert "load: profiler started" in p.stderr and "load: profiler stopped" in p.stderr


def test_server_without_profile_endpoints_stops_before_any_request(stub_server, tmp_path):
    stub = Stub()
    url = stub_server(stub)                                     # vLLM without VLLM_TORCH_PROFILER_DIR: no routes
    p = load(url, tmp_path)
    assert p.returncode == 2 and stub.n == 0
    err = [x for x in p.stderr.splitlines() if x.startswith("tracestory: error")]
    assert len(err) == 1 and f"expected HTTP 200 from POST {url}/start_profile, found HTTP 404" in err[0]
    assert "VLLM_TORCH_PROFILER_DIR" in err[0]
    assert not (tmp_path / "r.json").exists()


def test_failed_stop_is_reported_and_the_result_still_written(stub_server, tmp_path):
    stub = ProfiledStub("vllm", stop_status=500)
    url = stub_server(stub, routes=stub.routes())
    p = load(url, tmp_path)
    assert p.returncode == 0, p.stderr[-1500:]
    assert "load: profiler stop FAILED" in p.stderr and "HTTP 500" in p.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["completed"] == 4 and res["profile"]["stop"]["ok"] is False and res["profile"]["stop"]["status"] == 500


def test_profile_body_needs_profile():
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--model", "m", "--profile-body", "{}",
                        "--no-progress"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--profile-body: expected with --profile" in p.stderr


# ------------------------------------------------------------------ our server


def post(url: str) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_tracestory_serve_profiles_every_iteration_of_the_run(tmp_path):
    log = tmp_path / "sched.jsonl"
    h = start_server_thread(ServeOptions(port=0, profiler_dir=str(tmp_path / "prof"), event_log=str(log)))
    try:
        assert post(h.url + "/stop_profile")[0] == 409                     # nothing to stop yet
        p = load(h.url, tmp_path, "--ignore-eos", "--served-model-name", "tiny")
        assert p.returncode == 0, p.stderr[-1500:]
        res = json.loads((tmp_path / "r.json").read_text())
        trace = res["profile"]["stop"]["answer"]
        path = json.loads(trace)["trace"]
        assert post(h.url + "/stop_profile")[0] == 409                     # the session is over
        status, body = post(h.url + "/start_profile")
        assert status == 200 and body["status"] == "started"
        assert post(h.url + "/start_profile")[0] == 409                    # one session at a time
        assert post(h.url + "/stop_profile")[0] == 200
    finally:
        h.stop()
    iters = {json.loads(x)["iter"] for x in log.read_text().splitlines() if json.loads(x).get("type") == "iteration"}
    with open(path) as fh:
        events = json.load(fh)["traceEvents"]
    marked = {int(e["name"].split()[1]) for e in events
              if e.get("cat") == "user_annotation" and e.get("name", "").startswith("iteration ")}
    assert iters and marked == iters                # every iteration the scheduler ran is in the trace
    assert sorted(p.name for p in (tmp_path / "prof").iterdir()) == sorted(
        [f"{path.rsplit('/', 1)[1]}", path.rsplit('/', 1)[1].replace("-1.pt", "-2.pt")])


def test_serve_without_profiler_dir_answers_404():
    h = start_server_thread(ServeOptions(port=0))
    try:
        status, body = post(h.url + "/start_profile")
    finally:
        h.stop()
    assert status == 404 and "--profiler-dir" in body["error"]["message"]


def test_serve_cli_refuses_a_profiler_dir_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "serve", "--port", "0", "--profiler-dir", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"--profiler-dir: expected a folder, found a file {f}" in p.stderr
    assert time.monotonic() - t < 60
