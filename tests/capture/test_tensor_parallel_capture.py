"""The TP=2 serving capture on the CPU (``tests/data/tp_serve_cpu``, README there): the files a
``capture torch --torchrun 2 --load ... -- tracestory serve --tensor-parallel 2`` wrote, read with
plain ``gzip``/``json``, then ``tracestory report`` of the folder (batch story and multi-GPU
section together). Also the argv and environment of such captures (torch and ncu, dry plans)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tracestory.capture import pipeline
from tracestory.capture.under_load import TORCHRUN_SAFE_ENV, _is_launcher, _is_launcher_argv, torchrun_env
from tracestory.cli import main

FOLDER = Path(__file__).resolve().parents[1] / "data" / "tp_serve_cpu"
LAYERS = 2          # tiny preset, --layers default
TRACED = [5, 6, 7]  # --skip 5 --count 3


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _trace(rank: int) -> dict:
    with gzip.open(FOLDER / "torch" / f"rank{rank}.trace.json.gz", "rt") as f:
        return json.load(f)


def test_fixture_files_tell_a_two_rank_serving_run():
    sched = _jsonl(FOLDER / "torch" / "serve.sched.jsonl")
    kinds = [x["type"] for x in sched]
    assert sched[0]["type"] == "meta" and sched[0]["tensor_parallel"] == 2
    assert (kinds.count("arrival"), kinds.count("iteration"), kinds.count("finish")) == (23, 137, 23)
    cap = json.loads((FOLDER / "manifest.json").read_text())["captures"][-1]
    server = cap["steps"][0]
    assert cap["status"] == "complete" and server["stop_signal"] == "SIGINT" and server["exit_code"] == 0
    assert {k: server["env"][k] for k in TORCHRUN_SAFE_ENV} == TORCHRUN_SAFE_ENV
    for rank in (0, 1):
        t = _trace(rank)
        assert (t["distributedInfo"]["rank"], t["distributedInfo"]["world_size"]) == (rank, 2)
        ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
        its = {e["name"]: e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("iteration ")}
        assert sorted(its) == [f"iteration {i}" for i in TRACED]
        reduces = [e for e in ev if e["name"] == "gloo:all_reduce"]
        # wo and wd outputs: 2 all-reduces per layer per iteration
        assert len(reduces) == 2 * LAYERS * len(TRACED)
        for it in its.values():
            inside = [e for e in reduces if it["ts"] <= e["ts"] <= it["ts"] + it["dur"]]
            assert len(inside) == 2 * LAYERS


def test_report_tells_batch_story_and_multi_gpu_together(tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main(["report", str(FOLDER), "-o", str(md), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert doc["batching"]["arrivals"] == 23 and doc["batching"]["iterations"] == 137
    assert doc["batching"]["trace"]["iterations"] == TRACED
    assert doc["batching"]["client"]["ok"] == 23
    assert doc["multigpu"]["ranks"] == [0, 1]
    text = md.read_text()
    story, multi = text.index("### Execution Story: Continuous Batching"), text.index("### Multi-GPU communication timeline")
    assert story < multi
    assert "| GPU 0 |" in text and "| GPU 1 |" in text
    assert "Joined with the trace (3 `iteration N` ranges" in text
    # a CPU (gloo) run: neither trace holds a GPU event (plain JSON), so the summary says so
    # instead of counting the ranks as GPUs
    for rank in (0, 1):
        assert not [e for e in _trace(rank)["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert "**2 ranks, no GPU activity** in any of their traces" in text and "**2 GPUs**" not in text


def test_launcher_recognised():
    assert _is_launcher(["torchrun", "--nproc_per_node=2", "-m", "x"])
    assert _is_launcher(["/usr/bin/python3", "/opt/venv/bin/torchrun", "--nproc_per_node=2"])
    assert _is_launcher(["python", "-m", "torch.distributed.run", "--nproc_per_node=2"])
    assert not _is_launcher(["python", "-m", "tracestory.cli", "serve"])
    assert _is_launcher_argv(["ncu", "--export", "x", "torchrun", "--nproc_per_node=2", "-m", "m"])
    assert not _is_launcher_argv(["python", "-m", "tracestory.cli", "serve"])


def test_torchrun_env_fills_only_what_is_unset():
    assert torchrun_env({}) == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}
    assert torchrun_env({"NCCL_NVLS_ENABLE": "1"}) == {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                                       "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("tool", ["torch", "ncu"])
def test_tensor_parallel_capture_plans(tool, monkeypatch, tmp_path):
    for k in TORCHRUN_SAFE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    p = pipeline.plan(tool, ["tracestory", "serve", "--tensor-parallel", "2", "--device", "cuda"],
                      {"torchrun": 2, "load": "--model tiny --duration 5", "range": "iteration", "skip": 20})
    server = next(s for s in p.steps if s.role == "server")
    argv = list(server.argv)
    i = argv.index("torchrun")
    assert argv[i + 1] == "--nproc_per_node=2"
    assert argv[argv.index("--") + 1:] == ["-m", "tracestory.cli", "serve", "--tensor-parallel", "2", "--device", "cuda"]
    assert argv[i + 2:i + 4] == ["-m", "tracestory.capture.runner"]       # every rank brackets its range
    assert {k: server.env[k] for k in TORCHRUN_SAFE_ENV} == TORCHRUN_SAFE_ENV
    assert "TRACESTORY_EVENT_LOG" in server.env
    if tool == "ncu":
        assert argv[0] == "ncu" and argv.index("--target-processes") < i


def test_ranks_that_ignore_sigint_get_sigterm_not_the_launcher(tmp_path):
    """A stand-in launcher named ``torchrun`` with two ranks that ignore SIGINT: the stop
    escalates on the ranks (SIGINT, then SIGTERM); the launcher itself is never signalled and
    exits by itself once its ranks are gone (it records the signals it saw)."""
    import subprocess
    import sys
    import textwrap
    import time

    from tracestory.capture.under_load import stop_torchrun_ranks, torchrun_ranks

    seen = tmp_path / "launcher_signals.txt"
    launcher = tmp_path / "torchrun"
    launcher.write_text(textwrap.dedent(f"""
        import signal, subprocess, sys
        got = []
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda n, f: got.append(n))
        rank = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "open(sys.argv[1], 'w').close(); time.sleep(60)")
        kids = [subprocess.Popen([sys.executable, "-c", rank, {str(tmp_path)!r} + f"/ready{{i}}"]) for i in range(2)]
        codes = [k.wait() for k in kids]
        open({str(seen)!r}, "w").write(repr(got))
        sys.exit(0)
    """))
    proc = subprocess.Popen([sys.executable, str(launcher)], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while len(list(tmp_path.glob("ready*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)                  # both ranks ignore SIGINT from here on
        assert len(torchrun_ranks(proc.pid)) == 2
        assert stop_torchrun_ranks(proc, 1.0) == "SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and seen.read_text() == "[]"
