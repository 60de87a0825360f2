"""Captures that survive: Ctrl-C, SIGTERM, SIGKILL, SIGSEGV and SIGABRT during ``capture torch``,
and workloads that cannot start refused before anything runs.

The capture runs as a real ``python -m tracestory.cli capture torch ...`` process in its own
session, so a SIGINT to its process group is what a Ctrl-C at the terminal sends. The workload
below writes ``reached`` (holding its pid) at a known point and then waits or crashes there;
expected trace contents are read from that structure by hand (three ``BENCHMARK`` occurrences,
``iter<i>`` inside occurrence i) and checked on the files with plain ``gzip`` + ``json``.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracestory.cli import main

WORKLOAD = '''
import os, signal, sys, time
import torch
from tracestory.capture.region import region

mode = sys.argv[1]
a = torch.ones(8, 8)

def reached():
    with open("reached.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace("reached.tmp", "reached")

for i in range(3):
    with region("BENCHMARK"):
        with region(f"iter{i}"):
            a = torch.mm(a, a) / 8
            if mode == "inside" and i == 1:
                reached()
                time.sleep(300)
if mode == "after":
    reached()
    time.sleep(300)
elif mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "abort":
    os.abort()
'''

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def work(clean_cwd):
    (clean_cwd / "work.py").write_text(WORKLOAD)
    return clean_cwd


def start_capture(work: Path, mode: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "tracestory.cli", "capture", "torch", *extra,
                             "--stop-timeout", "60", "--", "python", "work.py", mode],
                            cwd=work, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_reached(work: Path, proc: subprocess.Popen, timeout_s: float = 240) -> int:
    """The workload's pid once it reached its waiting point."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (work / "reached").exists():
            return int((work / "reached").read_text())
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"capture ended early ({proc.returncode}): {out}\n{err}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the workload never reached its waiting point")


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def annotations(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        return sorted(e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation")


def capture_record(work: Path) -> dict:
    m = json.loads((work / "artifacts" / "work" / "manifest.json").read_text())
    return m["captures"][-1]


def test_ctrl_c_after_the_range_completed_keeps_the_trace_as_a_complete_capture(work):
    proc = start_capture(work, "after", "--range", "BENCHMARK", "--skip", "1", "--count", "2")
    wait_reached(work, proc)
    # the range closed before `reached`: its trace is already on disk, whole
    staged = work / "artifacts" / "work" / ".partial-torch" / "rank0.trace.json.gz"
    assert annotations(staged) == ["BENCHMARK", "BENCHMARK", "iter1", "iter2"]
    os.killpg(proc.pid, signal.SIGINT)          # what a Ctrl-C at the terminal sends
    code, out, err = finish(proc)
    assert code == 0, err
    folder = work / "artifacts" / "work"
    assert annotations(folder / "torch" / "rank0.trace.json.gz") == ["BENCHMARK", "BENCHMARK", "iter1", "iter2"]
    cap = capture_record(work)
    assert cap["status"] == "complete" and cap["interrupted"] == "SIGINT"
    assert "stopped by SIGINT after the capture had completed" in cap["note"]
    (step,) = cap["steps"]
    assert step["stop_signal"] == "SIGINT" and step["interrupted"] == "SIGINT" and step["stopped_by"] == "SIGINT"
    assert step["exit_code"] == 128 + signal.SIGINT and step["status"] == "ok"
    assert "note: the workload was stopped by SIGINT" in out
    assert not list(folder.glob(".partial-*")) and not (folder / "failed-torch").exists()


def test_ctrl_c_inside_the_range_keeps_what_the_profiler_had(work):
    proc = start_capture(work, "inside", "--range", "BENCHMARK", "--count", "3")
    wait_reached(work, proc)
    os.killpg(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGINT
    folder = work / "artifacts" / "work"
    assert not (folder / "torch").exists()
    # occurrence 0 is whole; occurrence 1 was cut by the interrupt (its regions closed by it)
    assert annotations(folder / "failed-torch" / "rank0.trace.json.gz") == [
        "BENCHMARK", "BENCHMARK", "iter0", "iter1"]
    cap = capture_record(work)
    assert cap["status"] == "failed" and cap["interrupted"] == "SIGINT"
    assert cap["kept"] == "artifacts/work/failed-torch"
    assert "interrupted by SIGINT: 1 of --count 3 occurrences of region 'BENCHMARK' were captured" in cap["error"]
    assert cap["steps"][0]["files"] == [{"path": "failed-torch/rank0.trace.json.gz",
                                         "bytes": (folder / "failed-torch" / "rank0.trace.json.gz").stat().st_size}]
    assert "FAILED" in err and "failed-torch" in err


def test_sigterm_to_the_capture_is_forwarded_and_the_whole_run_so_far_is_kept(work):
    proc = start_capture(work, "after")          # whole-run mode
    wait_reached(work, proc)
    os.kill(proc.pid, signal.SIGTERM)            # the capture only, as a job scheduler would
    code, _, _ = finish(proc)
    assert code == 128 + signal.SIGTERM
    folder = work / "artifacts" / "work"
    assert annotations(folder / "failed-torch" / "rank0.trace.json.gz") == [
        "BENCHMARK", "BENCHMARK", "BENCHMARK", "iter0", "iter1", "iter2"]
    cap = capture_record(work)
    assert cap["status"] == "failed" and cap["interrupted"] == "SIGTERM"
    assert cap["steps"][0]["stop_signal"] == "SIGTERM"
    assert "interrupted by SIGTERM: the trace holds the run until then" in cap["error"]


def test_sigterm_to_the_workload_inside_the_range(work):
    proc = start_capture(work, "inside", "--range", "BENCHMARK", "--count", "3")
    child = wait_reached(work, proc)
    os.kill(child, signal.SIGTERM)               # the workload only
    code, _, _ = finish(proc)
    assert code == 1                             # the capture itself was not interrupted
    cap = capture_record(work)
    assert cap["status"] == "failed" and "interrupted" not in cap
    assert "interrupted by SIGTERM: 1 of --count 3 occurrences" in cap["error"]
    assert cap["steps"][0]["exit_code"] == 128 + signal.SIGTERM and cap["steps"][0]["stop_signal"] is None
    assert annotations(work / "artifacts" / "work" / "failed-torch" / "rank0.trace.json.gz") == [
        "BENCHMARK", "BENCHMARK", "iter0", "iter1"]


@pytest.mark.parametrize("mode, sig", [("kill", "SIGKILL"), ("segv", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_crash_after_the_range_names_the_signal_and_keeps_the_complete_trace(work, mode, sig):
    proc = start_capture(work, "after" if mode == "kill" else mode,
                         "--range", "BENCHMARK", "--skip", "1", "--count", "2")
    if mode == "kill":
        os.kill(wait_reached(work, proc), signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == 1, err
    folder = work / "artifacts" / "work"
    assert not (folder / "torch").exists()
    kept = folder / "failed-torch"
    assert sorted(p.name for p in kept.iterdir()) == ["rank0.trace.json.gz"]   # no temporary, no status file
    assert annotations(kept / "rank0.trace.json.gz") == ["BENCHMARK", "BENCHMARK", "iter1", "iter2"]
    cap = capture_record(work)
    (step,) = cap["steps"]
    assert cap["status"] == "failed" and step["signal"] == sig and step["exit_code"] == -getattr(signal, sig)
    assert f"the workload was killed by {sig}" in cap["error"]
    assert "complete traces written before: 1 of 1 rank" in cap["error"]


def test_manifest_is_written_before_the_workload_runs(work):
    proc = start_capture(work, "after")
    wait_reached(work, proc)
    cap = capture_record(work)                   # read while the workload is still running
    assert cap["status"] == "running" and cap["pid"] == proc.pid
    assert [(s["name"], s["status"]) for s in cap["steps"]] == [("torch-profile", "running")]
    os.killpg(proc.pid, signal.SIGINT)
    assert finish(proc)[0] == 128 + signal.SIGINT
    assert capture_record(work)["status"] == "failed"


@pytest.mark.parametrize("words, message", [
    (["nosuchprog"], "nosuchprog: expected a Python script (`-- python script.py ARGS`, or "
                     "`-- python -m module ARGS`), found no such file"),
    (["python", "missing.py"], "missing.py: expected a Python script"),
    (["python", "-m", "nosuchmodule"], "nosuchmodule: expected a module that `python -m` can run, found none"),
    (["python", "-m", "tracestory.nosuchmodule"], "tracestory.nosuchmodule: expected a module"),
    (["python", "-m", "tracestory"], "tracestory: expected a module"),     # a package without __main__
])
def test_a_workload_that_cannot_start_is_refused_before_anything_runs(work, capsys, words, message):
    rc = main(["capture", "torch", "--", *words])
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not (work / "artifacts").exists()


@pytest.mark.parametrize("tool, words, message", [
    ("nsys", [sys.executable, "missing.py"], "missing.py: expected a Python script"),
    ("ncu", [sys.executable, "missing.py"], "missing.py: expected a Python script"),
    ("nsys", ["python3.99", "work.py"], "python3.99 not found: the workload's interpreter is not on PATH"),
    ("ncu", ["python", "-m", "nosuchmodule"], None),   # another interpreter's path: not checked here
])
def test_missing_workload_refused_for_every_tool(work, capsys, monkeypatch, tool, words, message):
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    rc = main(["capture", tool, "--dry-run" if message is None else "--name=w", "--", *words])
    err = capsys.readouterr().err
    if message is None:
        assert rc == 0          # a dry run checks nothing; the real run is below
        from tracestory.capture import pipeline
        from tracestory.capture.workload import _same_interpreter

        p = pipeline.plan(tool, words, {})
        if _same_interpreter("python"):
            with pytest.raises(Exception, match="nosuchmodule: expected a module"):
                pipeline.check_workload(p)
        else:
            pipeline.check_workload(p)
        return
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not (work / "artifacts").exists()


def test_module_workload_in_the_current_folder_is_accepted(work):
    pkg = work / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bench.py").write_text(WORKLOAD)
    from tracestory.capture.workload import check_startable, parse_workload

    check_startable(parse_workload(["python", "-m", "mypkg.bench"]), interpreter=sys.executable)


def test_capture_folder_holding_the_workload_is_refused(work, capsys):
    tool_folder = work / "artifacts" / "work" / "torch"
    tool_folder.mkdir(parents=True)
    (tool_folder / "work.py").write_text(WORKLOAD)
    rc = main(["capture", "torch", "--", "python", "artifacts/work/torch/work.py", "after"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "artifacts/work/torch: expected no input inside the capture folder torch/, found the input " \
           "artifacts/work/torch/work.py inside it" in err
    assert (tool_folder / "work.py").read_text() == WORKLOAD


def test_unwritable_artifact_root_is_one_line(work, capsys):
    Path("afile").write_text("x")
    rc = main(["capture", "torch", "--out", "afile", "--", "python", "work.py", "after"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tracestory: error: afile")
    assert Path("afile").read_text() == "x"


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (the workload has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_sigkill_of_the_capture_then_the_next_capture_keeps_what_it_left(work):
    proc = start_capture(work, "after", "--range", "BENCHMARK", "--skip", "1", "--count", "2")
    child = wait_reached(work, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 120      # the workload is told its capture died (SIGTERM) and ends
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child)
    cap = capture_record(work)             # all the killed capture could write: it was running
    assert cap["status"] == "running" and cap["steps"][-1]["status"] == "running"

    (work / "reached").unlink()
    assert main(["capture", "torch", "--range", "BENCHMARK", "--skip", "1", "--count", "2",
                 "--", "python", "work.py", "ends"]) == 0
    m = json.loads((work / "artifacts" / "work" / "manifest.json").read_text())
    old, new = m["captures"]
    assert old["status"] == "failed" and "ended before it finished" in old["error"]
    assert old["steps"][-1]["status"] == "failed" and old["kept"] == "artifacts/work/failed-torch"
    assert new["status"] == "complete"
    folder = work / "artifacts" / "work"
    assert sorted(p.name for p in (folder / "failed-torch").iterdir()) == ["rank0.trace.json.gz"]
    for f in (folder / "failed-torch" / "rank0.trace.json.gz", folder / "torch" / "rank0.trace.json.gz"):
        assert annotations(f) == ["BENCHMARK", "BENCHMARK", "iter1", "iter2"]


STAND_IN_NSYS = r'''#!{py}
import signal, sys, time
a = sys.argv[1:]
out = dict(x[2:].partition("=")[::2] for x in a if x.startswith("--"))["output"]
if a[0] == "profile":
    def stop(*_):
        open(out + ".nsys-rep", "wb").write(b"r" * 77)   # nsys writes its report when stopped
        sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    open("{reached}", "w").write("1")
    time.sleep(300)
'''


def test_ctrl_c_under_nsys_keeps_its_report_apart_and_skips_the_export(work):
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(STAND_IN_NSYS.format(py=sys.executable, reached=work / "reached"))
    (bin_dir / "nsys").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tracestory.cli", "capture", "nsys", "--", sys.executable,
                             "work.py", "after"], cwd=work, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (work / "reached").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGINT, err
    folder = work / "artifacts" / "work"
    assert not (folder / "nsys").exists()
    assert sorted(p.name for p in (folder / "failed-nsys").iterdir()) == ["work.nsys-rep"]
    cap = capture_record(work)
    assert cap["status"] == "failed" and cap["interrupted"] == "SIGINT"
    (step,) = cap["steps"]                       # the SQLite export never ran
    assert step["name"] == "nsys-profile" and step["exit_code"] == 0 and step["stop_signal"] == "SIGINT"
    assert step["error"] == "interrupted by SIGINT (exit code 0)"
    assert step["files"] == [{"path": "failed-nsys/work.nsys-rep", "bytes": 77}]
