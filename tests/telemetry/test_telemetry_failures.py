"""Telemetry that goes wrong: an energy counter that resets, readings that fail or return nonsense,
a sampling thread that dies. None may print a negative energy or fail the run being watched.
NVML is the fake (tracestory.telemetry.fake), with the failure injected by the test; expected
energies are worked out by hand from the counter values the test sets."""

from __future__ import annotations

import errno
import json
import time

import pytest

from tracestory import telemetry
from tracestory.analysis.telemetry import analyze_telemetry
from tracestory.ingest.telemetry import read_telemetry
from tracestory.telemetry.fake import FakeGpu, FakeNvml
from tracestory.telemetry.sampler import SCHEMA, Sampler


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


# ------------------------------------------------------------------ energy counter reset


def test_a_counter_reset_is_summed_not_negative(tmp_path):
    """5000 mJ at the start, the driver reloads (the counter restarts from 0), then 1000 and
    3000 mJ: 0 J before the reset + 3 J after it = 3 J (the raw difference would be -2 J)."""
    gpu = FakeGpu(energy_mj=5_000)
    out = tmp_path / "telemetry.jsonl"
    with telemetry.maybe_sampler(out, rate_hz=10, source=FakeNvml([gpu])) as s:
        assert s.energy_mj(0) == 5_000
        gpu.energy_mj = 1_000                    # reset
        assert s.energy_mj(0) == 6_000           # 5000 summed + 1000
        gpu.energy_mj = 3_000
        assert s.energy_mj(0) == 8_000
    recs = _lines(out)
    energy = [r["gpus"][0]["energy_mj"] for r in recs if r["type"] == "sample" and r["gpus"][0]["energy_mj"]]
    assert energy[0] == 5_000 and energy[-1] == 8_000 and energy == sorted(energy)
    end = recs[-1]
    assert [(x["gpu"], x["before_mj"], x["after_mj"]) for x in end["energy_resets"]] == [(0, 5_000, 1_000)]
    assert end["incomplete"] == []
    # what the report prints: the energy over the whole telemetry (no trace to window it)
    log = read_telemetry(out)
    assert log.warnings == ()
    assert analyze_telemetry(log).gpus[0].energy_j == pytest.approx(3.0)


def test_a_file_with_a_raw_counter_drop_is_continued_and_stated(tmp_path):
    """A file whose counter goes back (written before the sampler continued it): the reader sums
    the segments, (6000 - 5000) + 2500 mJ = 3.5 J, and says so."""
    head = {"type": "header", "schema": SCHEMA, "rate_hz": 20.0, "t0_unix_ns": 10**18, "t0_mono_ns": 0,
            "devices": [{"index": 0, "name": "GPU", "uuid": "GPU-0"}]}
    rows = [head] + [{"type": "sample", "t_unix_ns": 10**18 + k * 50_000_000, "t_mono_ns": k * 50_000_000,
                      "gpus": [{"i": 0, "energy_mj": e, "power_w": 100.0}]}
                     for k, e in enumerate([5_000, 6_000, 1_000, 2_500])] + [{"type": "end"}]
    path = tmp_path / "telemetry.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_telemetry(path)
    assert len(log.warnings) == 1 and "energy counter went back 1 time " in log.warnings[0]
    assert analyze_telemetry(log).gpus[0].energy_j == pytest.approx(3.5)


# ------------------------------------------------------------------ failures inside the sampler


class BreakingNvml(FakeNvml):
    """A fake whose power reading raises once ``broken`` is set (an NVML call failing mid-run)."""

    broken = False

    def power_mw(self, h):
        if self.broken:
            raise RuntimeError("NVML: GPU is lost")
        return super().power_mw(h)


def _run(tmp_path, fake, change, seconds=0.3):
    out = tmp_path / "telemetry.jsonl"
    with telemetry.maybe_sampler(out, rate_hz=50, source=fake) as s:
        change(s)
        time.sleep(seconds)
    return s, _lines(out)


def test_a_reading_that_raises_is_null_and_the_sampling_goes_on(tmp_path):
    fake = BreakingNvml()
    s, recs = _run(tmp_path, fake, lambda s: setattr(fake, "broken", True))
    samples = [r for r in recs if r["type"] == "sample"]
    assert samples[0]["gpus"][0]["power_w"] == 300.0 and samples[-1]["gpus"][0]["power_w"] is None
    assert all(r["gpus"][0]["sm_mhz"] == 1980 for r in samples)          # the other readings go on
    assert len(samples) >= 5
    assert s.incomplete == ["GPU 0 power_w: RuntimeError: NVML: GPU is lost; null where it failed"]
    assert s.incomplete_reason == f"telemetry incomplete: {s.incomplete[0]}"
    assert recs[-1]["type"] == "end" and recs[-1]["incomplete"] == s.incomplete
    warn = read_telemetry(tmp_path / "telemetry.jsonl").warnings
    assert warn == (f"telemetry.jsonl: {s.incomplete_reason}",)


@pytest.mark.parametrize("field,value", [("power_w", -5.0), ("sm_mhz", float("nan")), ("mem_mhz", -1), ("energy_mj", "12"),
                                         ("temp_c", None), ("clock_event_mask", 1.5)])
def test_a_bad_value_is_null_and_stated(tmp_path, field, value):
    gpu = FakeGpu()
    s, recs = _run(tmp_path, FakeNvml([gpu]), lambda s: setattr(gpu, field, value), seconds=0.1)
    key = {"clock_event_mask": "reasons_mask"}.get(field, field)
    last = [r for r in recs if r["type"] == "sample"][-1]["gpus"][0]
    assert last[key] is None
    assert len(s.incomplete) == 1 and s.incomplete[0].startswith(f"GPU 0 {key}: not a finite non-negative number")


def test_an_nvml_error_after_the_start_is_stated(tmp_path):
    gpu = FakeGpu()
    s, _ = _run(tmp_path, FakeNvml([gpu]), lambda s: gpu.unsupported.add("temp_c"), seconds=0.1)
    assert s.incomplete == ["GPU 0 temp_c: NVML error after the start (temp_c: Not Supported); null where it failed"]


class _FullDisk:
    def write(self, _):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        pass


def test_a_dying_sampling_thread_does_not_reach_the_caller(tmp_path):
    """The file stops being writable mid-run (a full disk): the thread ends, stop() does not
    raise, and the reasons are kept."""
    s, recs = _run(tmp_path, FakeNvml(), lambda s: setattr(s, "_fh", _FullDisk()))
    assert s.incomplete[0] == "sampling stopped (OSError: [Errno 28] No space left on device)"
    assert any(x.startswith("the last sample failed") for x in s.incomplete)
    assert recs[0]["type"] == "header" and recs[-1]["type"] != "end"     # what was written before is kept


def test_a_source_that_fails_to_start_turns_telemetry_off(tmp_path, capsys):
    class Broken(FakeNvml):
        def device_count(self):
            raise RuntimeError("driver/library version mismatch")

    with telemetry.maybe_sampler(tmp_path / "t.jsonl", source=Broken()) as s:
        assert s is None
    assert capsys.readouterr().err == ("GPU telemetry off: NVML failed while starting (RuntimeError: driver/library "
                                       "version mismatch)\n")
    assert not (tmp_path / "t.jsonl").exists()


def test_stop_never_raises_even_when_the_source_shutdown_fails(tmp_path):
    class BadShutdown(FakeNvml):
        def shutdown(self):
            raise RuntimeError("NVML shutdown: uninitialized")

    s = Sampler(BadShutdown(), tmp_path / "t.jsonl", rate_hz=20).start()
    s.stop()
    assert s.incomplete == ["NVML shutdown failed (RuntimeError: NVML shutdown: uninitialized)"]


# ------------------------------------------------------------------ a capture is not failed by it


@pytest.fixture
def breaking_nvml(monkeypatch):
    fake = BreakingNvml()
    monkeypatch.setattr(telemetry, "PynvmlSource", lambda: fake)
    monkeypatch.delenv(telemetry.SKIP_ENV, raising=False)
    return fake


def test_capture_records_incomplete_telemetry_and_its_steps_decide(tmp_path, breaking_nvml, capsys):
    from tracestory.capture import pipeline

    script = tmp_path / "w.py"
    script.write_text("pass\n")
    p = pipeline.plan("torch", ["python", str(script)], {"out": str(tmp_path / "artifacts")})
    p.staging.mkdir(parents=True)
    rec: dict = {}
    with pipeline._telemetry(p, rec) as sampler:
        breaking_nvml.broken = True
        time.sleep(0.2)
    assert sampler is not None and rec["telemetry"]["status"] == "on"
    assert rec["telemetry"]["incomplete"] == ("telemetry incomplete: GPU 0 power_w: RuntimeError: NVML: GPU is "
                                              "lost; null where it failed")
    assert capsys.readouterr().err == f"GPU {rec['telemetry']['incomplete']}\n"


WORKLOAD = '''
import time
import torch
from tracestory.capture.region import region

a = torch.ones(16, 16)
for i in range(3):
    with region("BENCHMARK"):
        a = torch.mm(a, a) / 16
time.sleep(0.3)
'''


def test_a_real_capture_with_a_failing_sampler_is_complete(clean_cwd, breaking_nvml, monkeypatch, capsys):
    """The re-audit's case: an exception inside the telemetry sampler while a CPU torch capture
    runs. The capture exits 0 and is complete; the manifest and the report's Limitations say
    the telemetry is incomplete and why."""
    from tracestory.cli import main

    real_start = Sampler.start

    def start_then_break(self):
        out = real_start(self)
        breaking_nvml.broken = True          # every later power reading raises
        return out

    monkeypatch.setattr(Sampler, "start", start_then_break)
    (clean_cwd / "work.py").write_text(WORKLOAD)
    assert main(["capture", "torch", "--name", "t", "--", "python", "work.py"]) == 0
    folder = clean_cwd / "artifacts" / "t"
    cap = json.loads((folder / "manifest.json").read_text())["captures"][-1]
    reason = "telemetry incomplete: GPU 0 power_w: RuntimeError: NVML: GPU is lost; null where it failed"
    assert cap["status"] == "complete" and cap["telemetry"]["incomplete"] == reason
    assert cap["telemetry"]["file"] == "torch/telemetry.jsonl"
    assert main(["report", str(folder), "-o", str(clean_cwd / "r.md")]) == 0
    assert reason in (clean_cwd / "r.md").read_text()
