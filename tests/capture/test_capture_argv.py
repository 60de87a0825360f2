"""nsys / ncu capture commands, option by option (expected argv written out by hand from the
capture runbooks), plus the pipeline run against stand-in `ncu`/`nsys`
scripts: staging, atomic move, failed steps, missing tools. Real nsys cannot run on the
project's device machine, so nsys is covered by argv and the stand-in only.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tracestory.capture import pipeline
from tracestory.cli import main
from tracestory.errors import ToolNotFound

PY = ["python", "w.py", "--x", "1"]


pytestmark = pytest.mark.usefixtures("clean_cwd")  # an empty folder, no TRACESTORY_* variables


def argv_of(tool, flags, words=PY):
    p = pipeline.plan(tool, words, flags)
    return {s.name: list(s.shown) for s in p.steps}, p


def test_nsys_default():
    steps, _ = argv_of("nsys", {})
    assert steps["nsys-profile"] == [
        "nsys", "profile", "--output=artifacts/w/nsys/w", "--force-overwrite=true",
        "--trace=cuda,nvtx,osrt", "--cuda-memory-usage=true", "--sample=none", "python", "w.py", "--x", "1"]
    assert steps["nsys-export-sqlite"] == [
        "nsys", "export", "--type=sqlite", "--force-overwrite=true",
        "--output=artifacts/w/nsys/w.sqlite", "artifacts/w/nsys/w.nsys-rep"]


def test_nsys_range_mpi_and_options():
    steps, _ = argv_of("nsys", {"range": "BENCHMARK", "mpi": True, "cuda_memory_usage": False,
                                "sample": "cpu", "name": "run"})
    assert steps["nsys-profile"] == [
        "nsys", "profile", "--output=artifacts/run/nsys/run", "--force-overwrite=true",
        "--trace=cuda,nvtx,osrt,mpi", "--cuda-memory-usage=false", "--sample=cpu",
        "--capture-range=nvtx", "--nvtx-capture=BENCHMARK", "--capture-range-end=stop",
        "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0", *PY]


def test_nsys_skip_uses_profiler_api_runner_and_torchrun():
    steps, _ = argv_of("nsys", {"range": "B", "skip": 3, "torchrun": 4})
    assert steps["nsys-profile"] == [
        "nsys", "profile", "--output=artifacts/w/nsys/w", "--force-overwrite=true",
        "--trace=cuda,nvtx,osrt", "--cuda-memory-usage=true", "--sample=none",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "torchrun", "--nproc_per_node=4", "-m", "tracestory.capture.runner",
        "--out-dir", "artifacts/w/nsys", "--profiler-api", "--range", "B", "--skip", "3",
        "--", "w.py", "--x", "1"]


def test_ncu_default_and_csv_exports():
    steps, p = argv_of("ncu", {})
    assert steps["ncu-profile"] == [
        "ncu", "--force-overwrite", "--target-processes", "all", "--set", "full",
        "--clock-control", "none", "--export", "artifacts/w/ncu/w", *PY]
    assert steps["ncu-csv-raw"] == ["ncu", "--import", "artifacts/w/ncu/w.ncu-rep", "--csv", "--page", "raw"]
    assert steps["ncu-csv-details"] == ["ncu", "--import", "artifacts/w/ncu/w.ncu-rep", "--csv",
                                        "--page", "details"]
    assert [s.command for s in p.steps][1:] == [
        "ncu --import artifacts/w/ncu/w.ncu-rep --csv --page raw > artifacts/w/ncu/w_raw.csv",
        "ncu --import artifacts/w/ncu/w.ncu-rep --csv --page details > artifacts/w/ncu/w_details.csv"]


def test_ncu_every_option():
    steps, _ = argv_of("ncu", {"sections": ["SpeedOfLight", "MemoryWorkloadAnalysis"],
                               "launch_skip": 10, "launch_count": 2, "kernel_name": ".*gemm.*",
                               "kernel_name_base": "demangled", "range": "BENCHMARK",
                               "clock_control": "base", "target_processes": "application-only",
                               "torchrun": 8, "out": "out"},
                       ["python3", "-m", "pkg.mod", "--y"])
    assert steps["ncu-profile"] == [
        "ncu", "--force-overwrite", "--target-processes", "application-only",
        "--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis",
        "--launch-skip", "10", "--launch-count", "2", "--kernel-name", "regex:.*gemm.*",
        "--kernel-name-base", "demangled", "--nvtx", "--nvtx-include", "BENCHMARK/",
        "--clock-control", "base", "--export", "out/mod/ncu/mod",
        "torchrun", "--nproc_per_node=8", "-m", "pkg.mod", "--y"]


def test_ncu_skip_and_explicit_regex():
    steps, _ = argv_of("ncu", {"range": "B", "skip": 1, "kernel_name": "regex:^nvjet"}, ["python3", "w.py"])
    assert steps["ncu-profile"] == [
        "ncu", "--force-overwrite", "--target-processes", "all", "--set", "full",
        "--kernel-name", "regex:^nvjet", "--nvtx", "--nvtx-include", "B/", "--profile-from-start", "off",
        "--clock-control", "none", "--export", "artifacts/w/ncu/w",
        "python3", "-m", "tracestory.capture.runner", "--out-dir", "artifacts/w/ncu", "--profiler-api",
        "--range", "B", "--skip", "1", "--", "w.py"]


def test_warmup_run_comes_first():
    steps, p = argv_of("ncu", {"warmup_run": True, "torchrun": 2})
    assert p.steps[0].name == "warmup-run"
    assert list(p.steps[0].shown) == ["torchrun", "--nproc_per_node=2", "w.py", "--x", "1"]


def test_dry_run_prints_exact_commands(capsys, tmp_path):
    rc = main(["capture", "ncu", "--launch-count", "5", "--dry-run", "--", *PY])
    assert rc == 0
    assert capsys.readouterr().out.splitlines() == [
        "ncu --force-overwrite --target-processes all --set full --launch-count 5 --clock-control none "
        "--export artifacts/w/ncu/w python w.py --x 1",
        "ncu --import artifacts/w/ncu/w.ncu-rep --csv --page raw > artifacts/w/ncu/w_raw.csv",
        "ncu --import artifacts/w/ncu/w.ncu-rep --csv --page details > artifacts/w/ncu/w_details.csv"]
    assert not (tmp_path / "artifacts").exists()


def test_env_setting_reaches_argv_and_invocation(monkeypatch):
    monkeypatch.setenv("TRACESTORY_LAUNCH_COUNT", "3")
    steps, p = argv_of("ncu", {})
    assert steps["ncu-profile"][6:8] == ["--launch-count", "3"]
    assert p.invocation == ("tracestory", "capture", "ncu", "--launch-count", "3", "--", *PY)


# ---------------------------------------------------------------- runs with stand-in tools
FAKE_NCU = r'''#!{py}
import sys
a = sys.argv[1:]
if "--import" in a:
    print("ID,Kernel Name\n0,fake_kernel" if a[a.index("--page") + 1] == "raw" else "details of " + a[a.index("--import") + 1])
    sys.exit(0)
if "{fail}" == "yes":
    sys.exit(3)
out = a[a.index("--export") + 1]
open(out + ".ncu-rep", "wb").write(b"x" * 1234)
'''

FAKE_NSYS = r'''#!{py}
import sys
a = sys.argv[1:]
opt = {{k: v for k, _, v in (x[2:].partition("=") for x in a if x.startswith("--"))}}
if a[0] == "profile":
    open(opt["output"] + ".nsys-rep", "wb").write(b"r" * 77)
else:
    open(opt["output"], "wb").write(b"SQLite format 3\0" + b"s" * 100)
'''


def install(bin_dir: Path, name: str, text: str, monkeypatch):
    bin_dir.mkdir(exist_ok=True)
    p = bin_dir / name
    p.write_text(text)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_ncu_pipeline_with_stand_in(tmp_path, monkeypatch):
    install(tmp_path / "bin", "ncu", FAKE_NCU.format(py=sys.executable, fail="no"), monkeypatch)
    (tmp_path / "w.py").write_text("")
    rc = main(["capture", "ncu", "--name", "k", "--", sys.executable, "w.py"])
    assert rc == 0
    folder = tmp_path / "artifacts" / "k"
    assert sorted(p.name for p in (folder / "ncu").iterdir()) == ["k.ncu-rep", "k_details.csv", "k_raw.csv"]
    raw = (folder / "ncu" / "k_raw.csv").read_bytes()
    assert raw == b"ID,Kernel Name\n0,fake_kernel\n"
    m = json.loads((folder / "manifest.json").read_text())
    cap = m["captures"][-1]
    assert cap["status"] == "complete" and m["name"] == "k"
    files = [f for s in cap["steps"] for f in s["files"]]
    assert files == [{"path": "ncu/k.ncu-rep", "bytes": 1234},
                     {"path": "ncu/k_raw.csv", "bytes": len(raw)},
                     {"path": "ncu/k_details.csv", "bytes": (folder / "ncu" / "k_details.csv").stat().st_size}]
    assert all(s["exit_code"] == 0 for s in cap["steps"])
    # the recorded commands name the final folder, never the staging one
    assert ".partial" not in json.dumps(cap)
    assert not list(folder.glob(".partial-*"))


def test_failed_ncu_leaves_nothing_that_looks_finished(tmp_path, monkeypatch):
    install(tmp_path / "bin", "ncu", FAKE_NCU.format(py=sys.executable, fail="yes"), monkeypatch)
    (tmp_path / "w.py").write_text("")
    rc = main(["capture", "ncu", "--name", "k", "--", sys.executable, "w.py"])
    assert rc == 1
    folder = tmp_path / "artifacts" / "k"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]
    cap = json.loads((folder / "manifest.json").read_text())["captures"][-1]
    assert cap["status"] == "failed"
    assert [(s["name"], s["exit_code"], s["status"]) for s in cap["steps"]] == [("ncu-profile", 3, "failed")]


def test_nsys_pipeline_with_stand_in_appends_to_manifest(tmp_path, monkeypatch):
    install(tmp_path / "bin", "nsys", FAKE_NSYS.format(py=sys.executable), monkeypatch)
    (tmp_path / "w.py").write_text("")
    for _ in range(2):
        assert main(["capture", "nsys", "--name", "s", "--range", "B", "--", sys.executable, "w.py"]) == 0
    folder = tmp_path / "artifacts" / "s"
    assert sorted(p.name for p in (folder / "nsys").iterdir()) == ["s.nsys-rep", "s.sqlite"]
    m = json.loads((folder / "manifest.json").read_text())
    assert [c["tool"] for c in m["captures"]] == ["nsys", "nsys"]
    assert m["captures"][-1]["steps"][1]["files"] == [{"path": "nsys/s.sqlite", "bytes": 116}]


def test_missing_tool_raises_before_creating_anything(tmp_path, monkeypatch):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    p = pipeline.plan("nsys", ["/usr/bin/python3", "w.py"], {})
    with pytest.raises(ToolNotFound, match="nsys not found: install NVIDIA Nsight Systems"):
        pipeline.execute(p)
    assert not (tmp_path / "artifacts").exists()


def test_missing_tool_through_cli_is_exit_2(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert main(["capture", "ncu", "--", "/usr/bin/python3", "w.py"]) == 2
    assert "ncu not found: install NVIDIA Nsight Compute" in capsys.readouterr().err
    assert not (tmp_path / "artifacts").exists()
