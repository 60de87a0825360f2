"""A real CPU torch capture with the capture process sampling a fake NVML (put in place of our
adapter's constructor): the file lands in the tool folder, the manifest records it, the
workload's process sees TRACESTORY_SKIP_POWER_MONITOR=1, and the report reads it back."""

from __future__ import annotations

import json

from tracestory import telemetry
from tracestory.cli import main
from tracestory.telemetry.fake import FakeGpu, FakeNvml

WORKLOAD = '''
import os, sys, time
import torch
from tracestory.capture.region import region

open("child_env.txt", "w").write(os.environ.get("TRACESTORY_SKIP_POWER_MONITOR", "unset"))
a = torch.ones(16, 16)
for i in range(3):
    with region("BENCHMARK"):
        a = torch.mm(a, a) / 16
time.sleep(0.3)
'''


def test_capture_torch_samples_into_its_tool_folder(clean_cwd, monkeypatch, capsys):
    fake = FakeNvml([FakeGpu(name="NVIDIA H100 80GB HBM3", power_w=123.0, clock_event_mask=0x20)],
                    integrate_energy=True)
    monkeypatch.setattr(telemetry, "PynvmlSource", lambda: fake)
    (clean_cwd / "work.py").write_text(WORKLOAD)
    assert main(["capture", "torch", "--name", "t", "--", "python", "work.py"]) == 0
    folder = clean_cwd / "artifacts" / "t"
    recs = [json.loads(x) for x in (folder / "torch" / "telemetry.jsonl").read_text().splitlines()]
    assert recs[0]["label"] == "capture torch" and recs[-1]["type"] == "end"
    samples = [r for r in recs if r["type"] == "sample"]
    assert len(samples) >= 3 and all(r["gpus"][0]["reasons"] == ["sw_thermal"] for r in samples)
    assert samples[-1]["gpus"][0]["energy_mj"] > samples[0]["gpus"][0]["energy_mj"]   # 123 W integrated
    cap = json.loads((folder / "manifest.json").read_text())["captures"][-1]
    assert cap["telemetry"]["status"] == "on" and cap["telemetry"]["file"] == "torch/telemetry.jsonl"
    assert cap["telemetry"]["bytes"] == (folder / "torch" / "telemetry.jsonl").stat().st_size
    assert all(f["path"] != "torch/telemetry.jsonl" for s in cap["steps"] for f in s.get("files", []))
    assert (clean_cwd / "child_env.txt").read_text() == "1"
    assert "torch/telemetry.jsonl" in capsys.readouterr().out          # listed with the capture's files
    # the report reads it back: a CPU trace has no GPU kernels, so the whole telemetry is used
    assert main(["report", str(folder), "-o", str(clean_cwd / "r.md")]) == 0
    text = (clean_cwd / "r.md").read_text()
    assert "## GPU Telemetry" in text and "software thermal slowdown" in text
