"""The load session as one library call (tracestory.loadgen.session.run_session), against the stub
SSE server on loopback: what it returns and writes, and a telemetry sampler that fails while the
load runs (the fake NVML of tracestory.telemetry.fake, its power reading made to raise), which
must be stated, never turn a successful load into a failure."""

from __future__ import annotations

import json

from tracestory import telemetry
from tracestory.cli import build_parser
from tracestory.loadgen.session import run_session
from tracestory.telemetry.fake import FakeNvml
from tracestory.telemetry.sampler import Sampler

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)


def _args(url, tmp_path, *more):
    return build_parser().parse_args(["load", "--base-url", url, "--model", "m", "--num-prompts", "3",
                                      "--max-concurrency", "1", "--random-input-len", "3", "--random-output-len", "4",
                                      "--no-progress", "--json", str(tmp_path / "load.summary.json"), *more])


def test_run_session_returns_the_outcome_and_writes_the_files(stub_server, tmp_path, capsys):
    url = stub_server(Stub())
    out = run_session(_args(url, tmp_path, "--skip-power-monitor", "--output", str(tmp_path / "r.jsonl")), {})
    assert out.exit_code == 0 and out.result["completed"] == 3 and out.telemetry_incomplete is None
    assert out.written == (str(tmp_path / "r.jsonl"), str(tmp_path / "load.summary.json"))
    # the stub streams max_tokens (4) tokens per request: 3 x 4
    assert out.result["total_output_tokens"] == 12
    doc = json.loads((tmp_path / "load.summary.json").read_text())
    assert doc["summary"]["ok"] == 3 and doc["config"]["telemetry_incomplete"] is None
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 3
    stdout = capsys.readouterr().out
    assert "Serving Benchmark Result" in stdout and f"wrote {tmp_path / 'load.summary.json'}" in stdout


class _Breaking(FakeNvml):
    broken = False

    def power_mw(self, h):
        if self.broken:
            raise RuntimeError("NVML: GPU is lost")
        return super().power_mw(h)


def test_a_failing_sampler_is_stated_and_the_load_still_succeeds(stub_server, tmp_path, monkeypatch, capsys):
    fake = _Breaking()
    monkeypatch.setattr(telemetry, "PynvmlSource", lambda: fake)
    monkeypatch.delenv(telemetry.SKIP_ENV, raising=False)
    real_start = Sampler.start

    def start_then_break(self):
        started = real_start(self)
        fake.broken = True
        return started

    monkeypatch.setattr(Sampler, "start", start_then_break)
    url = stub_server(Stub())
    out = run_session(_args(url, tmp_path), {})
    reason = "telemetry incomplete: GPU 0 power_w: RuntimeError: NVML: GPU is lost; null where it failed"
    assert out.exit_code == 0 and out.result["completed"] == 3 and out.telemetry_incomplete == reason
    assert json.loads((tmp_path / "load.summary.json").read_text())["config"]["telemetry_incomplete"] == reason
    end = json.loads((tmp_path / "load.summary.telemetry.jsonl").read_text().splitlines()[-1])
    assert end["type"] == "end" and end["incomplete"] == [reason.removeprefix("telemetry incomplete: ")]
    assert f"load: GPU {reason}" in capsys.readouterr().err
