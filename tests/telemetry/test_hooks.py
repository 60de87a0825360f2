"""Where telemetry is switched on: bench (energy per repetition, J/token), capture (manifest
record, ncu always off), serve (where its file goes). NVML is the fake, put in place of our
adapter's constructor (``tracestory.telemetry.PynvmlSource``), never of pynvml."""

from __future__ import annotations

import json
import os

import pytest

from tracestory import telemetry
from tracestory.bench.timer import _with_energy, summarize
from tracestory.telemetry.fake import FakeNvml


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setattr(telemetry, "PynvmlSource", lambda: fake)
    monkeypatch.delenv(telemetry.SKIP_ENV, raising=False)
    return fake


def test_energy_per_repetition_from_two_counter_reads():
    st = summarize([1e6] * 10, clock="cuda-events")
    # counter 1000 mJ -> 4000 mJ over 10 repetitions: 3 J, 0.3 J per repetition, 100 ms apart
    e = _with_energy(st, meter=object(), start=(1000, 5_000), end=(4000, 100_005_000), n=10)
    assert (e.energy_j, e.energy_j_per_rep, e.energy_window_ns) == (3.0, 0.3, 100_000_000)
    assert e.to_dict(with_samples=False)["energy_j_per_rep"] == 0.3
    # a counter that did not advance, or no sampler: no energy (None, never 0)
    assert _with_energy(st, object(), (1000, 0), (1000, 10), 10).energy_j_per_rep is None
    assert _with_energy(st, None, None, None, 10).energy_j is None


def test_llama_joules_per_token_per_phase():
    from tracestory.bench.llama import LlamaCase

    st = _with_energy(summarize([1e6] * 4), object(), (0, 0), (1200, 1), 4)   # 0.3 J per call
    def case(phase, batch, seq):
        return LlamaCase(phase, "eager", batch, seq, 512 if phase == "decode" else None, 2, st, None, 1, None, None)
    assert case("decode", 4, 1).to_dict()["joules_per_token"] == pytest.approx(0.3 / 4)        # 4 tokens/call
    assert case("prefill", 2, 128).to_dict()["joules_per_token"] == pytest.approx(0.3 / 256)   # 2 x 128 tokens
    no_energy = LlamaCase("decode", "eager", 1, 1, 8, 1, summarize([1.0]), None, 1, None, None)
    assert no_energy.to_dict()["joules_per_token"] is None


def _bench(tmp_path, *extra):
    from tracestory.cli import main as cli_main

    out = tmp_path / "l.json"
    # --device auto (a CPU here): an explicit --device cpu has no GPU to sample
    rc = cli_main(["bench", "llama", "--preset", "tiny", "--device", "auto", "--layers", "1", "--kv-len", "4",
                   "--warmup-ms", "0", "--rep-ms", "0", "--json", str(out), *extra])
    assert rc == 0
    return tmp_path / "l.telemetry.jsonl"


def test_bench_samples_by_default_beside_its_json(tmp_path, fake_nvml, capsys):
    path = _bench(tmp_path)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert recs[0]["label"] == "bench llama" and recs[-1]["type"] == "end"
    assert f"telemetry: {path}" in capsys.readouterr().out


def test_bench_says_it_is_a_gpu_benchmark_before_running_on_the_cpu(tmp_path, fake_nvml, capsys):
    import torch

    assert not torch.cuda.is_available()   # CI's torch is the CPU build
    _bench(tmp_path)
    assert "bench llama: no CUDA GPU here: this is a GPU benchmark" in capsys.readouterr().err


def test_bench_on_an_explicit_cpu_does_not_sample(tmp_path, fake_nvml, capsys):
    from tracestory.cli import main as cli_main

    rc = cli_main(["bench", "llama", "--preset", "tiny", "--device", "cpu", "--layers", "1", "--kv-len", "4",
                   "--warmup-ms", "0", "--rep-ms", "0", "--json", str(tmp_path / "l.json")])
    assert rc == 0 and not (tmp_path / "l.telemetry.jsonl").exists() and fake_nvml.calls == 0
    assert "no CUDA GPU here" not in capsys.readouterr().err   # --device cpu asked for it


def test_bench_skip_power_monitor_writes_no_file(tmp_path, fake_nvml):
    assert not _bench(tmp_path, "--skip-power-monitor").exists()
    assert fake_nvml.calls == 0


def test_bench_under_ncu_does_not_sample(tmp_path, fake_nvml, monkeypatch):
    monkeypatch.setenv("NV_COMPUTE_PROFILER_PERFWORKS_DIR", "/x")     # what ncu sets in the profiled process
    assert not _bench(tmp_path).exists()


def _capture_telemetry(tmp_path, tool, **flags):
    from tracestory.capture import pipeline

    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "w.py"
    script.write_text("pass\n")
    p = pipeline.plan(tool, ["python", str(script)], {"out": str(tmp_path / "artifacts"), **flags})
    p.staging.mkdir(parents=True)
    rec: dict = {}
    with pipeline._telemetry(p, rec) as sampler:
        child_env = os.environ.get(telemetry.SKIP_ENV)
    return p, rec, sampler, child_env


def test_capture_samples_into_the_tool_folder_and_children_do_not(tmp_path, fake_nvml, monkeypatch):
    p, rec, sampler, child_env = _capture_telemetry(tmp_path, "torch")
    assert sampler is not None and child_env == "1"
    assert rec["telemetry"] == {"status": "on", "rate_hz": 20.0, "gpus": 1, "sampled_by": "the capture process"}
    assert (p.staging / "telemetry.jsonl").is_file()
    assert telemetry.SKIP_ENV not in os.environ           # restored after the capture


def test_capture_ncu_is_always_off_and_says_so(tmp_path, fake_nvml):
    p, rec, sampler, child_env = _capture_telemetry(tmp_path, "ncu")
    assert sampler is None and child_env == "1" and fake_nvml.calls == 0
    assert rec["telemetry"]["status"] == "off" and "Nsight Compute" in rec["telemetry"]["reason"]
    assert not (p.staging / "telemetry.jsonl").exists()


def test_capture_skip_power_monitor_and_no_nvml(tmp_path, fake_nvml, monkeypatch, capsys):
    _, rec, sampler, _ = _capture_telemetry(tmp_path, "nsys", skip_power_monitor=True)
    assert sampler is None and rec["telemetry"] == {"status": "off", "reason": "--skip-power-monitor"}
    monkeypatch.setattr(telemetry, "PynvmlSource", lambda: FakeNvml(fail_init="nvmlInit failed (no driver)"))
    _, rec, sampler, _ = _capture_telemetry(tmp_path / "b", "torch")
    assert rec["telemetry"] == {"status": "off", "reason": "nvmlInit failed (no driver)"}
    assert capsys.readouterr().err == "GPU telemetry off: nvmlInit failed (no driver)\n"


def test_serve_writes_beside_the_event_log_or_at_the_env_path(tmp_path, fake_nvml, capsys):
    from tracestory.serve import ServeOptions, _telemetry

    with _telemetry(ServeOptions(device="cuda", event_log=str(tmp_path / "s.sched.jsonl"))) as s:
        assert s.path == tmp_path / "telemetry.jsonl"
    with _telemetry(ServeOptions(device="cuda", event_log=str(tmp_path / "s.jsonl"), telemetry_path=str(tmp_path / "t.jsonl"))) as s:
        assert s.path == tmp_path / "t.jsonl"
    with _telemetry(ServeOptions(device="cuda", event_log=str(tmp_path / "s.jsonl"), power_monitor=False)) as s:
        assert s is None
    assert capsys.readouterr().err == ""
    with _telemetry(ServeOptions(device="cuda")) as s:                 # nowhere to write: off, in one line
        assert s is None
    assert capsys.readouterr().err == ("GPU telemetry off: no --event-log or $TRACESTORY_TELEMETRY to write "
                                       "telemetry.jsonl to\n")
    calls = fake_nvml.calls
    with _telemetry(ServeOptions(device="cpu", event_log=str(tmp_path / "c.jsonl"))) as s:   # no GPU in use
        assert s is None
    assert capsys.readouterr().err == "" and fake_nvml.calls == calls


def test_flags_exist_on_every_command():
    from tracestory.cli import build_parser

    parser = build_parser()
    for argv in (["bench", "llama"], ["serve"], ["load", "--model", "m"], ["capture", "torch"], ["capture", "ncu"]):
        args = parser.parse_args([*argv, "--skip-power-monitor"])
        assert args.skip_power_monitor is True
