"""End-to-end CPU torch.profiler captures through the CLI entry point (`tracestory.cli.main`).

Expected values come from the test workload itself (it marks iteration i with a region named
``iter<i>``) and are checked on the produced trace with plain ``gzip`` + ``json``.
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest

from conftest import REPO
from tracestory.cli import main

WORKLOAD = '''
import sys
import torch
from tracestory.capture.region import region

n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
a = torch.ones(16, 16)
for i in range(n):
    with region("BENCHMARK"):
        with region(f"iter{i}"):
            a = torch.mm(a, a) / 16
if "--fail" in sys.argv:
    raise RuntimeError("boom from the workload")
'''


@pytest.fixture
def work(clean_cwd):
    """A clean folder with the workload; no TRACESTORY_* variables, no tracestory.toml."""
    (clean_cwd / "work.py").write_text(WORKLOAD)
    return clean_cwd


def annotations(path: Path) -> collections.Counter:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return collections.Counter(e["name"] for e in events if e.get("cat") == "user_annotation")


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_range_skip_count_profiles_exactly_those_occurrences(work):
    rc = main(["capture", "torch", "--range", "BENCHMARK", "--skip", "2", "--count", "3",
               "--", "python", "work.py", "6"])
    assert rc == 0
    folder = work / "artifacts" / "work"
    trace = folder / "torch" / "rank0.trace.json.gz"
    names = annotations(trace)
    # occurrences 2, 3, 4 of 0..5: three BENCHMARK ranges, each holding its iteration marker
    assert names["BENCHMARK"] == 3
    assert sorted(k for k in names if k.startswith("iter")) == ["iter2", "iter3", "iter4"]
    with gzip.open(trace, "rt") as f:
        ops = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops.count("aten::mm") == 3
    m = manifest(folder)
    cap = m["captures"][-1]
    assert cap["tool"] == "torch" and cap["status"] == "complete"
    assert cap["settings"]["skip"] == {"value": 2, "source": "flag"}
    assert cap["settings"]["with_shapes"] == {"value": False, "source": "default"}
    (step,) = cap["steps"]
    # the workload ran as a supervised child under the runner, shown with the user's interpreter word
    assert not step["in_process"] and step["exit_code"] == 0 and step["duration_ns"] > 0
    assert step["argv"] == ["python", "-m", "tracestory.capture.runner", "--out-dir", "artifacts/work/torch",
                            "--range", "BENCHMARK", "--skip", "2", "--count", "3", "--", "work.py", "6"]
    assert step["signal"] is None and step["interrupted"] is None and step["stop_signal"] is None
    assert step["files"] == [{"path": "torch/rank0.trace.json.gz", "bytes": trace.stat().st_size}]
    assert cap["invocation"] == ["tracestory", "capture", "torch", "--range", "BENCHMARK", "--skip", "2",
                                 "--count", "3", "--", "python", "work.py", "6"]
    assert not list(folder.glob(".partial-*"))


def test_schedule_steps_on_range_exits(work):
    rc = main(["capture", "torch", "--range", "BENCHMARK", "--wait", "1", "--warmup", "1",
               "--active", "2", "--", "python", "work.py", "6"])
    assert rc == 0
    names = annotations(work / "artifacts" / "work" / "torch" / "rank0.trace.json.gz")
    # steps 0 (wait) and 1 (warm-up) are dropped; steps 2 and 3 are recorded
    assert sorted(k for k in names if k.startswith("ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert sorted(k for k in names if k.startswith("iter")) == ["iter2", "iter3"]


def test_whole_run_and_module_workload(work):
    pkg = work / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text(WORKLOAD)
    rc = main(["capture", "torch", "--name", "mod", "--", "python", "-m", "pkg.job", "4"])
    assert rc == 0
    names = annotations(work / "artifacts" / "mod" / "torch" / "rank0.trace.json.gz")
    assert names["BENCHMARK"] == 4
    assert sorted(k for k in names if k.startswith("iter")) == ["iter0", "iter1", "iter2", "iter3"]


@pytest.mark.parametrize("extra, words", [
    (["--range", "NOPE"], ["work.py", "3"]),              # the region never occurs
    (["--range", "BENCHMARK", "--skip", "5"], ["work.py", "3"]),  # fewer occurrences than --skip
    ([], ["work.py", "2", "--fail"]),                    # the workload raises
])
def test_failed_capture_leaves_no_tool_folder(work, extra, words, capsys):
    rc = main(["capture", "torch", *extra, "--", "python", *words])
    assert rc == 1
    folder = work / "artifacts" / "work"
    assert not (folder / "torch").exists()
    assert not list(folder.glob(".partial-*"))
    cap = manifest(folder)["captures"][-1]
    assert cap["status"] == "failed" and cap["steps"][-1]["status"] == "failed"
    # what the failed run did write (the raising workload's whole-run trace) is kept apart
    kept = folder / "failed-torch"
    assert [f["path"] for f in cap["steps"][-1]["files"]] == (
        [f"failed-torch/{p.name}" for p in sorted(kept.iterdir())] if kept.exists() else [])
    assert kept.exists() == ("--fail" in words)
    assert "FAILED" in capsys.readouterr().err


def test_example_with_warmup_run(work):
    example = REPO / "examples" / "tiny_llama.py"
    rc = main(["capture", "torch", "--warmup-run", "--range", "BENCHMARK", "--skip", "1",
               "--", "python3", str(example), "--iters", "3", "--warmup", "1"])
    assert rc == 0
    folder = work / "artifacts" / "tiny_llama"
    names = annotations(folder / "torch" / "rank0.trace.json.gz")
    assert (names["BENCHMARK"], names["attention"], names["mlp"]) == (1, 1, 1)
    steps = manifest(folder)["captures"][-1]["steps"]
    assert [s["name"] for s in steps] == ["warmup-run", "torch-profile"]
    assert steps[0]["argv"] == ["python3", str(example), "--iters", "3", "--warmup", "1"]
    assert steps[0]["exit_code"] == 0 and steps[0]["files"] == []


def test_torchrun_every_rank_writes_its_trace(work):
    rc = main(["capture", "torch", "--torchrun", "2", "--range", "BENCHMARK", "--skip", "1",
               "--", "python", "work.py", "3"])
    assert rc == 0
    folder = work / "artifacts" / "work" / "torch"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.trace.json.gz", "rank1.trace.json.gz"]
    for r in (0, 1):
        names = annotations(folder / f"rank{r}.trace.json.gz")
        assert names["BENCHMARK"] == 1 and "iter1" in names
    (step,) = manifest(work / "artifacts" / "work")["captures"][-1]["steps"]
    assert step["argv"][:4] == ["torchrun", "--nproc_per_node=2", "-m", "tracestory.capture.runner"]


def test_range_cut_short_fails_and_keeps_the_partial_trace(work, capsys):
    # occurrences 4 and 5 of 0..5 exist; --count 5 wants 4..8
    rc = main(["capture", "torch", "--range", "BENCHMARK", "--skip", "4", "--count", "5",
               "--", "python", "work.py", "6"])
    assert rc == 1
    folder = work / "artifacts" / "work"
    assert not (folder / "torch").exists()
    names = annotations(folder / "failed-torch" / "rank0.trace.json.gz")
    assert names["BENCHMARK"] == 2 and sorted(k for k in names if k.startswith("iter")) == ["iter4", "iter5"]
    cap = manifest(folder)["captures"][-1]
    assert cap["status"] == "failed" and cap["kept"] == "artifacts/work/failed-torch"
    assert "only 2 of 5 were captured" in cap["error"]
    assert cap["steps"][-1]["files"][0]["path"] == "failed-torch/rank0.trace.json.gz"
