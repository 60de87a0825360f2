"""The TP=2 serving capture on two H100s (``tests/data/tp_serve_gpu``, README there): the capture
ended ``ok`` with the ranks stopped by SIGINT, and ``tracestory report`` on it tells the batch story
and the multi-GPU section of both ranks. Expected values from the fixture's files read here with
plain ``json`` (the manifest, the load summary) and from its README."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from tracestory.ingest import load_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "tp_serve_gpu"


def test_the_capture_ended_ok_with_the_ranks_stopped():
    cap = json.loads((DATA / "manifest.json").read_text())["captures"][-1]
    assert cap["status"] == "complete" and "error" not in cap
    server, health, load = cap["steps"]
    assert (server["name"], server["status"], server["exit_code"]) == ("torch-profile", "ok", 0)
    assert server["stop_signal"] == "SIGINT" and server["stopped"] == "ranks"
    assert set(server["profiler_blocked_s"]) == {"0", "1"}
    assert health["status"] == "ok" and load["status"] == "ok" and load["exit_code"] == 0


def test_both_ranks_the_log_and_the_load_are_read():
    inputs = load_inputs([DATA])
    assert sorted(t.meta.rank for t in inputs.traces) == [0, 1]
    for t in inputs.traces:
        assert t.meta.world_size == 2 and t.meta.distributed["backend"] == "nccl"
        assert len(t.kernels) > 0
    summary = json.loads((DATA / "torch" / "load.summary.json").read_text())["summary"]
    assert (summary["ok"], summary["failed"]) == (160, 0)
    with gzip.open(DATA / "torch" / "serve.sched.jsonl.gz", "rt") as fh:
        first = json.loads(fh.readline())
    assert first["tensor_parallel"] == 2 and first["max_batch_tokens"] == 2048
    assert inputs.scheduler_log is not None and inputs.scheduler_log.meta.max_batch_tokens == 2048
    assert inputs.load_summary is not None and inputs.telemetry is not None


def test_report_tells_the_batch_story_and_the_multi_gpu_section(tmp_path):
    out = tmp_path / "report.md"
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "report", str(DATA), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "Execution Story: Continuous Batching" in text and "160 requests" in text
    assert "Multi-GPU communication timeline" in text and "2 GPUs" in text
    assert "rank0.trace.json.gz (rank 0)" in text and "rank1.trace.json.gz (rank 1)" in text
    assert "partial capture" not in text
