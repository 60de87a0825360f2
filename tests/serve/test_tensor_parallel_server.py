"""``tracestory serve --tensor-parallel 2`` under ``python -m torch.distributed.run`` on the CPU
(gloo): the HTTP answers equal those of a one-process server, and a SIGINT to the ranks ends
every process with exit code 0."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("aiohttp")

import tracestory  # noqa: E402
from tracestory.capture.under_load import stop_torchrun_ranks, torchrun_ranks  # noqa: E402
from tracestory.serve import ServeOptions, start_server_thread, wait_healthy  # noqa: E402

PROMPTS = [("a b c d e f g", 9), (" ".join(f"w{i}" for i in range(30)), 5), ("x y", 12)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _complete(url: str, prompt: str, n: int) -> str:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": n, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["choices"][0]["text"]


def _plain_torchrun(tmp_path, *flags: str):
    """``python -m torch.distributed.run --nproc_per_node=2 -m tracestory.cli serve --tensor-parallel 2``
    on a free port, output to ``tmp_path/server.log``, in a session of its own: (process, port, log)."""
    port = _free_port()
    src = str(Path(tracestory.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "tracestory.cli", "serve",
           "--tensor-parallel", "2", "--port", str(port), *flags]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port, log


def _kill_group(proc) -> None:
    """The launcher's process group killed, if a test left it running."""
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_tp2_server_answers_as_tp1_and_stops_with_exit_code_0(tmp_path):
    one = start_server_thread(ServeOptions(port=0))
    try:
        want = [_complete(one.url, p, n) for p, n in PROMPTS]
    finally:
        one.stop()
    assert [len(t.split()) for t in want] == [9, 5, 12]

    sched = tmp_path / "sched.jsonl"
    proc, port, log = _plain_torchrun(tmp_path, "--event-log", str(sched))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 90, proc=proc)
        got = [_complete(url, p, n) for p, n in PROMPTS]
        assert len(torchrun_ranks(proc.pid)) == 2
        assert stop_torchrun_ranks(proc, 30)
    finally:
        _kill_group(proc)
    text = log.read_text(errors="replace")
    assert got == want
    assert proc.returncode == 0, text
    assert text.count("tracestory serve: stopped") == 2 and "Traceback" not in text
    lines = [json.loads(x) for x in sched.read_text().splitlines()]
    assert lines[0]["type"] == "meta" and lines[0]["tensor_parallel"] == 2
    # the all-reduce's choice, logged once at start-up (gloo: no symmetric memory)
    assert lines[0]["startup"]["all_reduce"]["chosen"] == "dist.all_reduce"
    assert lines[0]["startup"]["all_reduce"]["backend"] == "gloo"
    # rank 0 alone writes the log: one finish per request
    assert sum(x["type"] == "finish" for x in lines) == 3
    # every iteration says how long rank 0 spent sending its plan (part of its launch) and waiting
    # for its tokens; rank 1 says its slow launches (none expected at this load) at its end
    its = [x for x in lines if x["type"] == "iteration"]
    assert its and all(0 < x["plan_send_ns"] <= x["launch_ns"] for x in its)
    assert all(0 <= x["result_wait_ns"] <= x["forward_ns"] for x in its)
    assert "rank 1: Python GC" in text and "launch" in text.split("rank 1: Python GC", 1)[1].splitlines()[0]


def test_a_killed_rank_ends_the_server_with_one_line_not_a_hang(tmp_path):
    proc, port, log = _plain_torchrun(tmp_path)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 90, proc=proc)
        ranks = torchrun_ranks(proc.pid)
        assert len(ranks) == 2
        os.kill(ranks[1], 9)                      # rank 1 vanishes while the server idles
        proc.wait(timeout=30)                     # heartbeat: rank 0 notices within a second or so
    finally:
        _kill_group(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode != 0
    lost = [x for x in text.splitlines() if x.startswith("tracestory serve: tensor-parallel rank lost")]
    # one line, from the heartbeat ("...; stopping the server") or, when torchrun stopped rank 0
    # first, from its stop message to the other ranks
    assert len(lost) == 1 and "rank 0 could not send to the other ranks" in lost[0]


def test_serve_tensor_parallel_without_torchrun_launches_its_ranks_and_ctrl_c_exits_0(tmp_path):
    """``tracestory serve --tensor-parallel 2`` typed as is: it starts torchrun itself; a Ctrl-C
    (SIGINT to its process group, as a terminal sends it) reaches the ranks, not the launcher."""
    import signal

    port = _free_port()
    src = str(Path(tracestory.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("WORLD_SIZE", None)
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "tracestory.cli", "serve", "--tensor-parallel", "2", "--port", str(port)]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 90, proc=proc)
        assert len(_complete(url, "a b c", 4).split()) == 4
        assert len(torchrun_ranks(proc.pid)) == 2          # the launcher is this process's child
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        _kill_group(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "SignalException" not in text
    assert text.count("tracestory serve: stopped\n") == 2, text    # both ranks (the whole log when not)
    # each rank's timed stop line: rank 0 sent the stop, rank 1 received it
    assert "tracestory serve: rank 0: stopped: stop sent to the other ranks in" in text
    assert "tracestory serve: rank 1: stopped: stop received in" in text


def _rank_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(x for x in env if x.startswith(b"RANK="))[5:])


def test_a_stopped_rank_makes_health_503_and_requests_fail_then_it_recovers(tmp_path):
    """Rank 1 stopped (SIGSTOP) while serving: rank 0's forward waits in its all-reduce. With
    ``--stall-timeout 2`` a request fails with 503 naming the stall instead of hanging,
    ``/health`` is 503 with the reason; after SIGCONT both are 200 again and the server stops
    with exit code 0."""
    import signal
    import time

    proc, port, log = _plain_torchrun(tmp_path, "--stall-timeout", "2")
    url = f"http://127.0.0.1:{port}"
    stopped = None
    try:
        wait_healthy(url, 90, proc=proc)
        assert len(_complete(url, "a b c", 3).split()) == 3
        stopped = next(pid for pid in torchrun_ranks(proc.pid) if _rank_of(pid) == 1)
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        body = json.dumps({"model": "tiny", "prompt": "a b c", "max_tokens": 4, "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        took = time.monotonic() - t0
        answer = json.loads(e.value.read())
        with pytest.raises(urllib.error.HTTPError) as h:
            urllib.request.urlopen(url + "/health", timeout=10)
        health = json.loads(h.value.read())
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=10) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError:
                time.sleep(0.2)
        again = _complete(url, "x y", 5)
        assert stop_torchrun_ranks(proc, 30)
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        _kill_group(proc)
    text = log.read_text(errors="replace")
    assert e.value.code == 503 and "engine stalled: no progress for" in answer["error"]["message"]
    assert "tensor parallel 2: rank 0 waits in a collective step" in answer["error"]["message"]
    assert took < 20                              # 2 s stall timeout + 0.5 s poll, on a loaded machine
    assert h.value.code == 503 and health["status"] == "stalled" and "tensor parallel 2" in health["reason"]
    assert len(again.split()) == 5
    assert proc.returncode == 0, text
    assert "Traceback" not in text


def test_ctrl_c_at_plain_torchrun_stops_the_ranks_cleanly_but_torchrun_itself_exits_1(tmp_path):
    """What docs/CAPTURE.md says about ``torchrun ... serve --tensor-parallel 2`` and Ctrl-C, pinned
    (torch 2.11-2.13): torchrun starts each rank in a session of its own, so a terminal's SIGINT
    reaches torchrun alone; its handler raises ``SignalException``, the agent forwards SIGINT to
    the ranks, which stop cleanly (both ``stopped`` lines, no traceback of ours), then re-raises it:
    torchrun prints that traceback and exits 1. Nothing a rank does changes that exit code, hence
    ``tracestory serve --tensor-parallel N`` launching torchrun itself (the test above: exit 0).
    If a torch release changes this, the test fails and the document must be updated."""
    import signal

    proc, port, log = _plain_torchrun(tmp_path)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 90, proc=proc)
        ranks = torchrun_ranks(proc.pid)
        assert len(ranks) == 2
        assert all(os.getsid(pid) == pid for pid in ranks)       # each rank leads a session of its own
        os.killpg(proc.pid, signal.SIGINT)                       # what Ctrl-C sends: torchrun's group only
        proc.wait(timeout=60)
    finally:
        _kill_group(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode == 1
    assert "tracestory serve: rank 0: stopped: stop sent to the other ranks in" in text
    assert "tracestory serve: rank 1: stopped: stop received in" in text
    assert text.count("Traceback") == 1 and "SignalException: Process" in text
    assert "tracestory/" not in text.split("Traceback", 1)[1]    # the traceback is torchrun's, not a rank's


def test_a_server_stalled_on_a_stopped_rank_still_stops_on_sigint(tmp_path):
    """Rank 1 stopped, rank 0 stalled in the all-reduce of a request's forward: SIGINT to rank 0
    ends it within seconds (the engine is not waited for, *stop* cannot be sent: one line, exit
    1 so torchrun ends the stopped rank), not after gloo's 300 s timeout."""
    import signal
    import threading
    import time

    proc, port, log = _plain_torchrun(tmp_path, "--stall-timeout", "1")
    url = f"http://127.0.0.1:{port}"
    ranks: dict[int, int] = {}
    try:
        wait_healthy(url, 90, proc=proc)
        ranks = {_rank_of(pid): pid for pid in torchrun_ranks(proc.pid)}
        os.kill(ranks[1], signal.SIGSTOP)
        answer: dict = {}

        def ask():
            try:
                _complete(url, "a b c", 4)
            except urllib.error.HTTPError as e:
                answer["code"] = e.code

        t = threading.Thread(target=ask)
        t.start()
        t.join(30)
        assert answer.get("code") == 503                  # the stall was seen
        t0 = time.monotonic()
        os.kill(ranks[0], signal.SIGINT)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                os.kill(ranks[0], 0)
            except ProcessLookupError:
                break
            if Path(f"/proc/{ranks[0]}/stat").read_text().split()[2] == "Z":
                break
            time.sleep(0.1)
        took = time.monotonic() - t0
    finally:
        # the ranks run in sessions of their own: killing torchrun's group leaves them, and rank 1
        # is still stopped (SIGKILL ends a stopped process; every other signal waits for SIGCONT)
        leftover = set(torchrun_ranks(proc.pid)) | set(ranks.values()) if proc.poll() is None else set(ranks.values())
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        proc.wait()
    text = log.read_text(errors="replace")
    assert took < 30, text              # 2 s for the engine, 1 s for the heartbeat, 5 s for the channel, exit
    lines = [x for x in text.splitlines() if x.startswith("tracestory serve: tensor-parallel rank stalled")]
    assert len(lines) == 1 and "stop not sent to the other ranks, exiting with code 1" in lines[0]
