"""manifest.json, artifact folders and the report sections written from them.

Fixtures: tests/data/capture/h200_{torch,ncu}.tar.gz, real captures made on an H200 through
the CLI (see tests/data/capture/README.md). Expected values are read from the manifest with
plain ``json`` in the test, or computed by hand (unit conversions written out).
"""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import tarfile

import pytest

from conftest import REPO, TEST_DATA
from tracestory.capture.artifacts import load_artifact_folder
from tracestory.capture.environment import collect_environment, external_profiler
from tracestory.capture.manifest import SCHEMA, read_manifest, write_manifest
from tracestory.cli import main
from tracestory.errors import TraceFormatError, UsageError
from tracestory.render.manifest_sections import (render_actions_log, render_environment,
                                                 render_reproduction)

CAPTURE_DATA = TEST_DATA / "capture"


def extract(name, tmp_path):
    with tarfile.open(CAPTURE_DATA / f"{name}.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    return tmp_path / name


@pytest.fixture
def torch_folder(tmp_path):
    return extract("h200_torch", tmp_path)


@pytest.fixture
def ncu_folder(tmp_path):
    return extract("h200_ncu", tmp_path)


def test_artifact_folder_lists_files_per_tool(torch_folder, ncu_folder):
    t = load_artifact_folder(torch_folder)
    assert t.manifest == json.loads((torch_folder / "manifest.json").read_text())
    assert t.torch == (torch_folder / "torch" / "rank0.trace.json.gz",)
    assert t.trace_files == [torch_folder / "torch" / "rank0.trace.json.gz"]
    n = load_artifact_folder(ncu_folder)
    assert n.ncu_raw_csv == (ncu_folder / "ncu" / "h200_ncu_raw.csv",)
    assert n.ncu_details_csv == (ncu_folder / "ncu" / "h200_ncu_details.csv",)
    assert n.trace_files == [ncu_folder / "ncu" / "h200_ncu_raw.csv"]  # one source per report
    assert n.torch == () and n.nsys_sqlite == ()


def test_artifact_folder_prefers_exports_and_ignores_staging(tmp_path):
    f = tmp_path / "a"
    for rel in ("nsys/r.nsys-rep", "nsys/r.sqlite", "nsys/other.nsys-rep", "ncu/k.ncu-rep",
                "ncu/k_raw.csv", "ncu/solo.ncu-rep", ".partial-torch/rank0.trace.json.gz"):
        (f / rel).parent.mkdir(parents=True, exist_ok=True)
        (f / rel).write_bytes(b"")
    write_manifest(f, {"schema": SCHEMA, "name": "a", "environment": {}, "captures": []})
    names = [p.relative_to(f).as_posix() for p in load_artifact_folder(f).trace_files]
    assert names == ["nsys/r.sqlite", "nsys/other.nsys-rep", "ncu/k_raw.csv", "ncu/solo.ncu-rep"]


def test_artifact_folder_errors(tmp_path):
    with pytest.raises(UsageError, match="expected an artifact folder"):
        load_artifact_folder(tmp_path / "nope")
    with pytest.raises(TraceFormatError, match="manifest.json"):
        load_artifact_folder(tmp_path)
    (tmp_path / "manifest.json").write_text('{"schema": "other/9"}')
    with pytest.raises(TraceFormatError, match="other/9"):
        read_manifest(tmp_path)


def test_fixture_manifests_describe_the_capture(torch_folder, ncu_folder):
    m = json.loads((torch_folder / "manifest.json").read_text())
    cap = m["captures"][0]
    assert [s["name"] for s in cap["steps"]] == ["warmup-run", "torch-profile"]
    size = (torch_folder / "torch" / "rank0.trace.json.gz").stat().st_size
    assert cap["steps"][1]["files"] == [{"path": "torch/rank0.trace.json.gz", "bytes": size}]
    n = json.loads((ncu_folder / "manifest.json").read_text())
    files = {f["path"]: f["bytes"] for s in n["captures"][0]["steps"] for f in s["files"]}
    for rel in ("ncu/h200_ncu_raw.csv", "ncu/h200_ncu_details.csv"):
        assert files[rel] == (ncu_folder / rel).stat().st_size


def test_render_environment(torch_folder):
    m = json.loads((torch_folder / "manifest.json").read_text())
    env = m["environment"]
    text = render_environment(m)
    gib = env["gpus"][0]["memory_bytes"] / 2**30
    assert f"| GPU | 1 x NVIDIA H200 (compute capability 9.0, {gib:.0f} GiB memory, 132 SMs) |" in text  # 3 digits
    for key, label in (("driver_version", "Driver"), ("torch", "PyTorch"), ("triton", "Triton"),
                       ("python", "Python"), ("cuda_runtime", "CUDA runtime (torch)")):
        assert f"| {label} | {env[key]} |" in text
    assert "| Nsight Systems | n/a (nsys not on PATH) |" in text
    assert "\x1b" not in text  # nvidia-smi's terminal underline is stripped
    assert "GPU0\t X \t0-15" in text
    assert text.count("```") % 2 == 0


def test_render_environment_without_gpu():
    m = {"environment": {"gpus": [], "gpu_count": 0, "python": "3.11.7", "topology": None}}
    text = render_environment(m)
    assert "| GPU | n/a (no CUDA GPU visible to torch.cuda or nvidia-smi at capture time) |" in text
    assert "| Driver | n/a (nvidia-smi not available) |" in text
    assert "GPU topology: n/a" in text


def test_render_actions_log(ncu_folder):
    m = json.loads((ncu_folder / "manifest.json").read_text())
    text = render_actions_log(m)
    steps = m["captures"][0]["steps"]
    for j, s in enumerate(steps, 1):
        assert f"**Action 1.{j}: {s['name']}**" in text
        assert s["command"] in text
        assert s["started_at"] in text
    # 3 significant digits: 32_695_735_561 ns = 32.7 s; 832_182_605 ns = 832 ms; 49_227_786 B = 46.9 MiB
    assert steps[0]["duration_ns"] == 32_695_735_561 and "took 32.7 s, exit code 0." in text
    assert "took 832 ms, exit code 0." in text
    assert "- `ncu/h200_ncu.ncu-rep` (46.9 MiB)" in text
    assert "- `launch_count` = `12` (flag)" in text


def test_render_actions_log_failed_capture():
    m = {"captures": [{"tool": "ncu", "status": "failed", "error": "step ncu-profile failed: exit code 3",
                       "started_at": "t0", "duration_ns": 1_500_000, "settings": {},
                       "workload": {"cwd": "/w"},
                       "steps": [{"name": "ncu-profile", "command": "ncu x", "started_at": "t0",
                                  "duration_ns": 1_500_000, "exit_code": 3, "status": "failed",
                                  "error": "exit code 3", "files": []}]}]}
    text = render_actions_log(m)
    assert "### Phase 1: capture with ncu (failed)" in text
    assert "took 1.50 ms, exit code 3." in text and "Failed: exit code 3" in text
    assert "no `ncu/` folder was written by it" in text


def test_render_reproduction(torch_folder):
    m = json.loads((torch_folder / "manifest.json").read_text())
    text = render_reproduction(m)
    cap = m["captures"][0]
    assert "- GPU: NVIDIA H200 or similar (compute capability 9.0), 1 visible" in text
    assert " ".join(cap["invocation"]) in text
    assert f"cd {cap['workload']['cwd']}" in text
    assert cap["steps"][0]["command"] in text  # the warm-up run
    assert "tracestory report artifacts/h200_torch" in text
    assert "    └── rank0.trace.json.gz  (10.8 KiB)" in text  # 11080 B / 1024
    assert render_reproduction(m) == text  # deterministic


def test_collect_environment_here(tmp_path):
    env = collect_environment(REPO / "examples" / "tiny_llama.py")
    import torch

    assert env["python"] == platform.python_version()
    assert env["hostname"] == socket.gethostname()
    assert env["torch"] == torch.__version__
    assert env["gpu_count"] == len(env["gpus"])
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert env["git"]["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    assert env["git"]["repo"] == str(REPO)
    outside = collect_environment(tmp_path / "x.py")["git"]
    assert outside["repo"] is None and outside["commit"] is None


def test_external_profiler_detection():
    # variable names as seen in an ncu child on the H200 (tests/data/capture/README.md)
    assert external_profiler({"NSYS_PROFILING_SESSION_ID": "7"}) == "nsys"
    assert external_profiler({"NV_NSIGHT_INJECTION_TRANSPORT_TYPE": "2", "NV_TPS_LAUNCH_TOKEN": "x"}) == "ncu"
    assert external_profiler({"CUDA_INJECTION64_PATH": "/opt/ncu/libInjection.so"}) == "ncu"
    assert external_profiler({"NV_CUDA_LIB_VERSION": "13.0", "PATH": "/bin"}) is None


def test_nested_capture_under_ncu_recorded_no_torch_profiler():
    m = json.loads((CAPTURE_DATA / "h200_nested_under_ncu_manifest.json").read_text())
    cap = m["captures"][0]
    assert cap["external_profiler"] == "ncu" and cap["status"] == "complete"
    assert cap["steps"][0]["files"] == []  # no torch trace: ncu holds the data


def test_report_on_capture_folder(torch_folder, tmp_path):
    out = tmp_path / "report.md"
    assert main(["report", str(torch_folder), "-o", str(out)]) == 0
    text = out.read_text()
    m = json.loads((torch_folder / "manifest.json").read_text())
    for heading, body in (("Environment", render_environment(m)), ("Actions Log", render_actions_log(m)),
                          ("Reproduction Guide", render_reproduction(m))):
        assert f"## {heading}\n\n{body.strip()}" in text
