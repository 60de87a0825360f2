"""Capture under load: the real reference server driven by ``tracestory load`` end to end, and
small Python stand-in servers for the failure paths (never healthy, exits early, ignores
SIGINT and SIGTERM)."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
import time

import pytest

from conftest import free_port
from tracestory.capture.under_load import load_argv, run_under_load, url_of

STEP_KEYS = {"name", "argv", "command", "env", "in_process", "started_at", "duration_ns", "exit_code", "status",
             "error", "files"}   # the keys of a manifest step (capture/manifest.py)


def stand_in(tmp_path, port: int, *, ignore_signals: bool) -> list[str]:
    """A server that answers GET /health with 200 (optionally deaf to SIGINT and SIGTERM)."""
    script = tmp_path / "standin.py"
    script.write_text(textwrap.dedent(f"""
        import signal
        from http.server import BaseHTTPRequestHandler, HTTPServer
        if {ignore_signals}:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()
            def log_message(self, *a):
                pass
        HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """))
    return [sys.executable, str(script)]


def test_reference_server_under_load(tmp_path):
    port = free_port()
    log, out, slog = tmp_path / "sched.jsonl", tmp_path / "req.jsonl", tmp_path / "server.log"
    server = [sys.executable, "-m", "tracestory.cli", "serve", "--preset", "tiny", "--device", "cpu",
              "--port", str(port), "--event-log", str(log)]
    load = (f"tracestory load --url http://127.0.0.1:{port} --model tiny --concurrency 2 --num-requests 4 "
            f"--prompt-len-min 8 --prompt-len-max 16 --max-new-tokens 4 --ignore-eos --no-progress "
            f"--output {shlex.quote(str(out))}")
    t0 = time.monotonic()
    r = run_under_load(server, load, health_timeout_s=60, grace_s=10, server_log=slog)
    assert r.ok and r.error is None and not r.interrupted, r.error
    assert time.monotonic() - t0 < 60
    assert r.base_url == f"http://127.0.0.1:{port}"
    assert [s["name"] for s in r.steps] == ["server", "health", "load"]
    assert all(STEP_KEYS <= set(s) and s["status"] == "ok" for s in r.steps)
    assert r.server["stop_signal"] == "SIGINT" and r.server["exit_code"] == 0   # graceful stop
    assert r.load["exit_code"] == 0 and r.load["argv"][:4] == [sys.executable, "-m", "tracestory.cli", "load"]
    assert r.health["waited_ns"] > 0 and r.server["duration_ns"] > r.load["duration_ns"]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 4 and all(x["ok"] and x["output_tokens"] == 4 for x in rows)
    finishes = [x for x in map(json.loads, log.read_text().splitlines()) if x["type"] == "finish"]
    assert len(finishes) == 4
    assert "listening on" in slog.read_text()
    json.dumps(r.manifest())


def test_never_healthy_server_is_stopped_and_load_not_run(tmp_path):
    port = free_port()
    server = [sys.executable, "-c", "import time; time.sleep(60)"]   # never listens
    t0 = time.monotonic()
    r = run_under_load(server, f"--url http://127.0.0.1:{port} --model m --concurrency 1",
                       health_timeout_s=1.0, grace_s=5)
    assert time.monotonic() - t0 < 8
    assert not r.ok and r.health["status"] == "failed" and "expected HTTP 200 within 1 s" in r.health["error"]
    assert r.load["exit_code"] is None and r.load["error"].startswith("not run")
    # SIGINT: Python dies of the signal (-2), which counts as a clean stop
    assert r.server["stop_signal"] == "SIGINT" and r.server["exit_code"] == -2 and r.server["status"] == "ok"


def test_server_exiting_early_ends_the_health_wait(tmp_path):
    t0 = time.monotonic()
    r = run_under_load([sys.executable, "-c", "import sys; sys.exit(3)"], "python -c pass",
                       base_url=f"http://127.0.0.1:{free_port()}", health_timeout_s=30)
    assert time.monotonic() - t0 < 10
    assert "exited with code 3" in r.health["error"]
    assert r.server["stop_signal"] is None and r.server["exit_code"] == 3 and r.server["status"] == "failed"


def test_deaf_server_gets_sigterm_then_sigkill(tmp_path):
    port = free_port()
    r = run_under_load(stand_in(tmp_path, port, ignore_signals=True), [sys.executable, "-c", "print('load ran')"],
                       base_url=f"http://127.0.0.1:{port}", health_timeout_s=20, grace_s=0.5)
    assert r.health["status"] == "ok" and r.load["exit_code"] == 0
    assert r.server["stop_signal"] == "SIGKILL" and r.server["exit_code"] == -9
    assert r.server["status"] == "failed" and "killed" in r.server["error"] and not r.ok


def test_failing_load_and_missing_programs(tmp_path):
    port = free_port()
    r = run_under_load(stand_in(tmp_path, port, ignore_signals=False), [sys.executable, "-c", "raise SystemExit(4)"],
                       base_url=f"http://127.0.0.1:{port}", health_timeout_s=20, grace_s=5)
    assert r.load["exit_code"] == 4 and r.load["status"] == "failed" and r.server["status"] == "ok"
    assert r.error == "load: exit code 4"
    r = run_under_load(["/nonexistent/server"], "--model m --concurrency 1", health_timeout_s=1)
    assert r.server["exit_code"] == 127 and r.load["exit_code"] is None and not r.ok


@pytest.mark.parametrize("cmd, expected", [
    ("--target-qps 2 --model m", [sys.executable, "-m", "tracestory.cli", "load", "--target-qps", "2", "--model", "m"]),
    ("tracestory load --model 'a b'", [sys.executable, "-m", "tracestory.cli", "load", "--model", "a b"]),
    ("python bench.py --x", ["python", "bench.py", "--x"]),
])
def test_load_argv(cmd, expected):
    assert load_argv(cmd) == expected


def test_url_of():
    assert url_of("--url http://h:1 --model m") == "http://h:1"
    assert url_of("tracestory load --url=http://h:2") == "http://h:2"
    assert url_of("--model m") == "http://127.0.0.1:8000"
    # vLLM's spellings, which tracestory load takes
    assert url_of("--base-url http://h:3 --model m") == "http://h:3"
    assert url_of("--port 8123 --model m") == "http://127.0.0.1:8123"
    assert url_of("--host 10.0.0.2 --port 9") == "http://10.0.0.2:9"
