"""``tracestory capture torch --load``: the reference server profiled under ``tracestory load``
through the CLI entry point, then ``tracestory report`` of the capture folder.

Expected values are read from the produced files with plain ``gzip``/``json`` (the trace's
``user_annotation`` names, the scheduler log's ``arrival`` lines, the load's request records),
never from tracestory's own readers.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from conftest import free_port
from tracestory.capture.workload import parse_workload
from tracestory.cli import main


@pytest.fixture
def work(clean_cwd):
    return clean_cwd


def load_words(port: int, n: int = 6) -> str:
    return (f"--url http://127.0.0.1:{port} --model tiny --concurrency 2 --num-requests {n} --prompt-len-min 8 "
            "--prompt-len-max 40 --max-new-tokens 6 --ignore-eos --no-progress --timeout 60")


def serve_words(port: int) -> list[str]:
    return ["tracestory", "serve", "--preset", "tiny", "--device", "cpu", "--port", str(port),
            "--max-batch-tokens", "32"]


def annotations(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        return [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def capture_record(work: Path, name: str = "serve") -> dict:
    return json.loads((work / "artifacts" / name / "manifest.json").read_text())["captures"][-1]


def test_capture_under_load_then_report(work):
    port = free_port()
    rc = main(["capture", "torch", "--load", load_words(port), "--range", "iteration", "--skip", "2",
               "--count", "5", "--health-timeout", "60", "--", *serve_words(port)])
    assert rc == 0
    folder = work / "artifacts" / "serve" / "torch"
    assert sorted(p.name for p in folder.iterdir()) == ["load.requests.jsonl", "load.summary.json",
                                                        "rank0.trace.json.gz", "serve.sched.jsonl"]
    # iterations 2..6 of the engine thread, each a `iteration N` region
    assert annotations(folder / "rank0.trace.json.gz") == [f"iteration {i}" for i in range(2, 7)]

    cap = capture_record(work)
    assert cap["status"] == "complete"
    assert [(s["name"], s["role"]) for s in cap["steps"]] == [
        ("torch-profile", "server"), ("health", "health"), ("load", "load")]
    server, health, load = cap["steps"]
    assert server["stop_signal"] == "SIGINT" and server["status"] == "ok"
    assert server["env"] == {"TRACESTORY_EVENT_LOG": "artifacts/serve/torch/serve.sched.jsonl"}
    assert sorted(f["path"] for f in server["files"]) == ["torch/rank0.trace.json.gz", "torch/serve.sched.jsonl"]
    assert sorted(f["path"] for f in load["files"]) == ["torch/load.requests.jsonl", "torch/load.summary.json"]
    assert load["argv"][-4:] == ["--output", "artifacts/serve/torch/load.requests.jsonl",
                                 "--json", "artifacts/serve/torch/load.summary.json"]
    assert health["status"] == "ok" and health["waited_ns"] > 0
    assert cap["settings"]["load"] == {"value": load_words(port), "source": "flag"}
    inv = cap["invocation"]
    assert inv[inv.index("--load") + 1] == load_words(port)
    assert inv[inv.index("--"):] == ["--", "python", "-m", "tracestory.cli", *serve_words(port)[1:]]

    records = jsonl(folder / "load.requests.jsonl")
    sched = jsonl(folder / "serve.sched.jsonl")
    assert len(records) == 6 and all(r["ok"] for r in records)
    # one server process (no torchrun): stopped through its process group; the profiler's start
    # (at iteration 2) and stop (at iteration 6) held the engine thread, and those two iterations
    # say so in the event log, with the seconds the status file recorded (rounded to 0.1 ms there)
    assert server["stopped"] == "process group" and server["stop_ns"] > 0
    blocked = server["profiler_blocked_s"]["0"]
    held = {x["iter"]: x["profiler_ns"] for x in sched if x["type"] == "iteration" and "profiler_ns" in x}
    assert sorted(held) == [2, 6]
    assert abs(held[2] / 1e9 - blocked["start"]) < 1e-4 and abs(held[6] / 1e9 - blocked["stop"]) < 1e-4

    rc = main(["report", str(work / "artifacts" / "serve"), "-o", "r.md", "--json", "r.json"])
    assert rc == 0
    doc = json.loads((work / "r.json").read_text())["batching"]
    assert doc["arrivals"] == sum(1 for x in sched if x["type"] == "arrival") == 6
    assert doc["iterations"] == sum(1 for x in sched if x["type"] == "iteration")
    assert doc["client"]["ok"] == 6 and doc["client"]["output_tokens"] == sum(r["output_tokens"] for r in records)
    assert doc["trace"]["iterations"] == [2, 3, 4, 5, 6]
    text = (work / "r.md").read_text()
    assert "Client side, as the load generator measured it (concurrency 2" in text
    assert "Joined with the trace (5 `iteration N` ranges" in text


def test_load_ending_before_the_range_fails_and_keeps_the_files(work, capsys):
    port = free_port()
    rc = main(["capture", "torch", "--load", load_words(port, n=2), "--range", "iteration", "--skip", "1",
               "--count", "100000", "--", *serve_words(port)])
    assert rc == 1
    base = work / "artifacts" / "serve"
    assert not (base / "torch").exists() and not list(base.glob(".partial-*"))
    kept = base / "failed-torch"
    assert {"serve.sched.jsonl", "load.requests.jsonl", "load.summary.json"} <= {p.name for p in kept.iterdir()}
    # the engine thread ended inside the range: its teardown stopped the profiler, and the
    # iterations it did record are kept apart from complete captures
    seen = sum(1 for x in jsonl(kept / "serve.sched.jsonl") if x["type"] == "iteration")
    assert annotations(kept / "rank0.trace.json.gz") == [f"iteration {i}" for i in range(1, seen)]
    cap = capture_record(work)
    assert cap["status"] == "failed" and cap["kept"] == "artifacts/serve/failed-torch"
    assert seen > 1 and f"region 'iteration' occurred {seen} times" in cap["error"]
    assert f"only {seen - 1} of 100000 were captured" in cap["error"]
    assert all(f["path"].startswith("failed-torch/") for s in cap["steps"] for f in s["files"])
    assert "FAILED" in capsys.readouterr().err


def test_server_that_never_answers_health(work):
    Path("sleeper.py").write_text("import time\ntime.sleep(60)\n")
    rc = main(["capture", "torch", "--load", "--model m --url http://127.0.0.1:9", "--health-timeout", "1",
               "--stop-timeout", "5", "--range", "iteration", "--", "python", "sleeper.py"])
    assert rc == 1
    cap = capture_record(work, "sleeper")
    names = {s["name"]: s for s in cap["steps"]}
    assert names["health"]["status"] == "failed" and "expected HTTP 200 within 1 s" in names["health"]["error"]
    assert names["load"]["error"] == "not run: the server never became healthy"
    assert names["torch-profile"]["stop_signal"] == "SIGINT"


def test_dry_run_shows_server_health_and_load(work, capsys):
    rc = main(["capture", "torch", "--dry-run", "--load", "--model m --output mine.jsonl --url http://h:1",
               "--range", "iteration", "--skip", "3", "--count", "4", "--", *serve_words(1)])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# the server")
    assert out[1].startswith("TRACESTORY_EVENT_LOG=artifacts/serve/torch/serve.sched.jsonl ")
    assert "-m tracestory.capture.runner --out-dir artifacts/serve/torch --range iteration --skip 3 --count 4" in out[1]
    assert out[2] == "# once GET http://h:1/health answers 200:"
    # the user's --output is kept; only the summary is added
    assert out[3].endswith("load --model m --output mine.jsonl --url http://h:1 "
                           "--json artifacts/serve/torch/load.summary.json")


@pytest.mark.parametrize("tool, expected, absent", [
    ("nsys", ["--capture-range=cudaProfilerApi", "--profiler-api"], "--nvtx-capture"),
    ("ncu", ["--profile-from-start", "--profiler-api"], "--nvtx-include"),
])
def test_nsys_and_ncu_bracket_the_server_iteration_with_the_runner(work, capsys, tool, expected, absent):
    rc = main(["capture", tool, "--dry-run", "--load", "--model m", "--range", "iteration", "--",
               *serve_words(1)])
    assert rc == 0
    server = capsys.readouterr().out.splitlines()[1]
    assert all(x in server for x in expected) and absent not in server


@pytest.mark.parametrize("extra, message", [
    ([], "found no --range"),
    (["--range", "iteration", "--active", "2"], "found a --wait/--warmup/--active schedule"),
    (["--range", "iteration", "--warmup-run"], "--warmup-run cannot be used with --load"),
    (["--range", "iteration", "--stop-timeout", "0"], "--stop-timeout: expected a number >= 1"),
])
def test_bad_load_options_exit_2(work, capsys, extra, message):
    rc = main(["capture", "torch", "--load", "--model m", *extra, "--", *serve_words(1)])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_tracestory_workload_runs_our_cli_by_module():
    w = parse_workload(["tracestory", "serve", "--port", "1"])
    assert (w.module, w.args, w.stem) == ("tracestory.cli", ("serve", "--port", "1"), "serve")
    assert w.argv() == [sys.executable, "-m", "tracestory.cli", "serve", "--port", "1"]


def test_report_refuses_a_load_summary_without_its_log(work, capsys):
    Path("s.json").write_text(json.dumps({"config": {}, "summary": {"mode": "poisson", "ttft": {}}}))
    assert main(["report", "s.json", "-o", "r.md"]) == 2
    assert "s.json: a load summary is reported with the scheduler event log" in capsys.readouterr().err


def test_report_names_a_broken_load_summary(work, capsys):
    from conftest import TEST_DATA

    log = TEST_DATA / "serving" / "h200_serve_q12" / "torch" / "serve.sched.jsonl.gz"
    Path("s.json").write_text(json.dumps({"config": {}, "summary": {"mode": "poisson", "ttft": {}}}))
    assert main(["report", str(log), "s.json", "-o", "r.md"]) == 2
    err = capsys.readouterr().err
    assert "s.json: expected a `tracestory load --json` summary, found no key 'target_qps' in \"summary\"" in err
    assert not Path("r.md").exists()
