"""GPU telemetry against real NVML on a CUDA machine (pytest -m gpu; needs nvidia-ml-py: without it these fail, they are not skipped)."""

from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def _matmul_loop(seconds: float) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()


def test_real_nvml_sampler_sees_power_and_energy_during_a_matmul_loop(tmp_path):
    from tracestory import telemetry

    out = tmp_path / "telemetry.jsonl"
    with telemetry.maybe_sampler(out, rate_hz=20) as s:
        assert s is not None, "NVML should be usable on a GPU machine"
        _matmul_loop(1.0)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    samples = [r for r in recs if r["type"] == "sample"]
    assert recs[0]["devices"] and recs[-1]["type"] == "end"
    assert len(samples) >= 15                        # 1 s at 20 Hz, plus start and stop samples
    gpu = int(torch.cuda.current_device())
    index = s.index_of_uuid(str(torch.cuda.get_device_properties(gpu).uuid))
    index = 0 if index is None else index
    power = [r["gpus"][index]["power_w"] for r in samples]
    # the counter is read once per energy period and at both ends (null in between)
    energy = [r["gpus"][index]["energy_mj"] for r in samples if r["gpus"][index]["energy_mj"] is not None]
    assert len(energy) >= 2
    sm = [r["gpus"][index]["sm_mhz"] for r in samples]
    assert max(power) > 0
    assert energy[-1] > energy[0] and all(b >= a for a, b in zip(energy, energy[1:]))
    assert max(sm) > 0
    assert recs[-1]["cpu_ns_per_sample"] is not None


def test_bench_timer_measures_energy_per_repetition():
    from tracestory import telemetry
    from tracestory.bench.timer import measure

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with telemetry.maybe_sampler(None) as s:
        assert s is not None
        st = measure(lambda: a @ a, warmup_ms=50, rep_ms=400)
    assert st.energy_j is not None and st.energy_j > 0
    assert st.energy_j_per_rep == pytest.approx(st.energy_j / st.n)
    # power over the window within what a GPU can draw (10 W .. 1.5 kW)
    watts = st.energy_j / (st.energy_window_ns / 1e9)
    assert 10 < watts < 1500


def test_bench_llama_prints_and_writes_joules_per_token(tmp_path, capsys):
    from tracestory.cli import main as cli_main

    out = tmp_path / "l.json"
    rc = cli_main(["bench", "llama", "--preset", "llama-3-8b", "--layers", "2", "--phase", "decode", "prefill",
                   "--kv-len", "512", "--seq", "512", "--rep-ms", "300", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["results"]
    jpt = {r["phase"]: r["joules_per_token"] for r in res}
    assert jpt["decode"] > 0 and jpt["prefill"] > 0
    assert jpt["decode"] > jpt["prefill"]           # batch-1 decode reads all weights for one token
    assert "J/tok" in capsys.readouterr().out
    assert (tmp_path / "l.telemetry.jsonl").is_file()
