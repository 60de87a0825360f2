"""The telemetry sampler against a fake NVML whose readings the test sets."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tracestory import telemetry
from tracestory.errors import UsageError
from tracestory.telemetry import decode_reasons
from tracestory.telemetry.fake import FakeGpu, FakeNvml
from tracestory.telemetry.sampler import Sampler


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_records_what_the_fake_says_at_the_rate_asked(tmp_path):
    gpu = FakeGpu(name="NVIDIA H100 80GB HBM3", sm_mhz=1410, mem_mhz=2619, power_w=250.5, energy_mj=7_000,
                  temp_c=61, util_gpu=97, util_mem=40, clock_event_mask=0x4)
    fake = FakeNvml([gpu, FakeGpu(uuid="GPU-1", sm_mhz=345, power_w=70.0)])
    out = tmp_path / "telemetry.jsonl"
    changed_at = []
    with telemetry.maybe_sampler(out, rate_hz=50, source=fake, label="test") as s:
        assert telemetry.active() is s
        time.sleep(0.3)
        gpu.sm_mhz, gpu.energy_mj = 1200, 9_000
        changed_at.append(time.time_ns())
        time.sleep(0.3)
    assert telemetry.active() is None
    recs = _lines(out)
    head, samples, end = recs[0], [r for r in recs if r["type"] == "sample"], recs[-1]
    assert head["type"] == "header" and head["schema"] == "tracestory.telemetry/1" and head["rate_hz"] == 50.0
    assert [d["name"] for d in head["devices"]] == ["NVIDIA H100 80GB HBM3", "Fake GPU"]
    assert end["type"] == "end" and end["samples"] == len(samples) == s.samples
    # 0.6 s at 50 Hz: 30 periods plus the start and stop samples; a loaded CI machine may
    # run the thread late (counted as ``late``), never more often than asked
    assert 15 <= len(samples) <= 32
    assert len(samples) + end["late"] >= 25
    gaps = [b["t_mono_ns"] - a["t_mono_ns"] for a, b in zip(samples, samples[1:])]
    assert sorted(gaps)[len(gaps) // 2] >= 15e6          # median gap near 20 ms, not faster
    for r in samples:
        g0, g1 = r["gpus"]
        before = r["t_unix_ns"] < changed_at[0]
        assert g0["sm_mhz"] in ((1410,) if before else (1410, 1200))
        assert (g0["power_w"], g0["mem_mhz"], g0["temp_c"], g0["util_gpu"], g0["util_mem"]) == (250.5, 2619, 61, 97, 40)
        assert g0["reasons_mask"] == 4 and g0["reasons"] == ["sw_power_cap"]
        assert (g1["sm_mhz"], g1["power_w"]) == (345, 70.0)
    assert samples[0]["gpus"][0]["energy_mj"] == 7_000 and samples[-1]["gpus"][0]["energy_mj"] == 9_000
    assert samples[-1]["gpus"][0]["sm_mhz"] == 1200
    # the two stamps of one sample agree with the header's pair (same instant, two clocks)
    for r in samples:
        wall = r["t_unix_ns"] - head["t0_unix_ns"]
        mono = r["t_mono_ns"] - head["t0_mono_ns"]
        assert abs(wall - mono) < 50e6


def test_an_unsupported_reading_is_null_and_named_in_the_header(tmp_path):
    fake = FakeNvml([FakeGpu(unsupported={"energy_mj", "temp_c"})])
    out = tmp_path / "t.jsonl"
    with telemetry.maybe_sampler(out, source=fake) as s:
        assert s.energy_mj(0) is None
    recs = _lines(out)
    assert recs[0]["devices"][0]["unsupported"] == ["energy_mj", "temp_c"]
    assert all(r["gpus"][0]["energy_mj"] is None and r["gpus"][0]["temp_c"] is None
               for r in recs if r["type"] == "sample")


# NVML's documented values (nvml.h, nvmlClocksEventReason*), written here as the second source
NVML_BITS = {"GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
             "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
             "HwPowerBrakeSlowdown": 0x80, "DisplayClockSetting": 0x100}
OUR_NAME = {"GpuIdle": "gpu_idle", "ApplicationsClocksSetting": "applications_clocks", "SwPowerCap": "sw_power_cap",
            "HwSlowdown": "hw_slowdown", "SyncBoost": "sync_boost", "SwThermalSlowdown": "sw_thermal",
            "HwThermalSlowdown": "hw_thermal", "HwPowerBrakeSlowdown": "hw_power_brake",
            "DisplayClockSetting": "display_clocks"}


@pytest.mark.parametrize("nvml_name", sorted(NVML_BITS))
def test_each_documented_bit_decodes_to_its_name(nvml_name):
    assert decode_reasons(NVML_BITS[nvml_name]) == (OUR_NAME[nvml_name],)


def test_several_bits_and_an_unknown_one():
    assert decode_reasons(0x4 | 0x40 | 0x800) == ("sw_power_cap", "hw_thermal", "unknown_0x800")
    assert decode_reasons(0) == ()
    assert telemetry.SLOWDOWN_REASONS == {"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}


def test_no_nvml_is_one_line_and_no_failure(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    with telemetry.maybe_sampler(out, source=FakeNvml(fail_init="nvmlInit failed (Driver Not Loaded)")) as s:
        assert s is None
    err = capsys.readouterr().err
    assert err == "GPU telemetry off: nvmlInit failed (Driver Not Loaded)\n"
    assert not out.exists()


def test_module_missing_is_one_line(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)      # import pynvml -> ImportError
    why: list[str] = []
    with telemetry.maybe_sampler(tmp_path / "t.jsonl", why=why) as s:
        assert s is None
    err = capsys.readouterr().err.splitlines()
    assert err == ["GPU telemetry off: nvidia-ml-py is not installed (pip install 'tracestory[telemetry]')"]
    assert why == ["nvidia-ml-py is not installed (pip install 'tracestory[telemetry]')"]


def test_no_gpu_is_one_line(tmp_path, capsys):
    with telemetry.maybe_sampler(tmp_path / "t.jsonl", source=FakeNvml([])) as s:
        assert s is None
    assert capsys.readouterr().err == "GPU telemetry off: NVML sees no GPU\n"


def test_asked_off_writes_nothing_and_says_nothing(tmp_path, capsys, monkeypatch):
    fake = FakeNvml()
    with telemetry.maybe_sampler(tmp_path / "a.jsonl", enabled=False, source=fake) as s:
        assert s is None
    monkeypatch.setenv(telemetry.SKIP_ENV, "1")
    with telemetry.maybe_sampler(tmp_path / "b.jsonl", source=fake) as s:
        assert s is None
    assert list(tmp_path.iterdir()) == [] and fake.calls == 0
    assert capsys.readouterr().err == ""


def test_rate_out_of_range_and_unwritable_path_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="expected 10 to 100 Hz, found 500"):
        with telemetry.maybe_sampler(tmp_path / "t.jsonl", rate_hz=500, source=FakeNvml()):
            pass
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UsageError, match="expected a writable telemetry file"):
        with telemetry.maybe_sampler(tmp_path / "a-file" / "t.jsonl", source=FakeNvml()):
            pass


def test_a_killed_run_keeps_what_was_flushed(tmp_path):
    """Lines are flushed every flush_s: without stop(), the file already holds the header and
    the samples of the first flush."""
    out = tmp_path / "t.jsonl"
    s = Sampler(FakeNvml(), out, rate_hz=100, flush_s=0.05).start()
    try:
        time.sleep(0.3)
        recs = _lines(out)          # read while it runs, as after a kill
        assert recs[0]["type"] == "header"
        assert sum(r["type"] == "sample" for r in recs) >= 2
    finally:
        s.stop()


def test_sampler_thread_is_a_daemon(tmp_path):
    s = Sampler(FakeNvml(), None, rate_hz=20).start()
    try:
        t = next(t for t in threading.enumerate() if t.name == "tracestory-telemetry")
        assert t.daemon
    finally:
        s.stop()
    assert s.samples >= 2        # the start and the stop sample


def test_the_energy_counter_is_read_once_per_energy_period_and_at_both_ends(tmp_path):
    """NVML's energy read is the slow one (ms on a VM): the sampler reads it at the first and
    last sample and when energy_period_s has passed since the last read; the other readings are
    in every sample."""
    fake = FakeNvml([FakeGpu(energy_mj=1_000)])
    out = tmp_path / "telemetry.jsonl"
    with Sampler(fake, out, rate_hz=50, energy_period_s=0.25):
        time.sleep(0.8)
    recs = _lines(out)
    assert recs[0]["energy_period_s"] == 0.25
    samples = [r for r in recs if r["type"] == "sample"]
    with_energy = [r["t_mono_ns"] for r in samples if r["gpus"][0]["energy_mj"] is not None]
    assert samples[0]["gpus"][0]["energy_mj"] == 1_000 and samples[-1]["gpus"][0]["energy_mj"] == 1_000
    assert all(r["gpus"][0]["power_w"] is not None for r in samples)
    # about 0.8 s / 0.25 s reads in between, plus the last: far fewer than the ~40 samples
    assert 3 <= len(with_energy) <= 6 < len(samples)
    gaps = [b - a for a, b in zip(with_energy, with_energy[1:-1])]
    assert all(g >= 0.25e9 for g in gaps)
