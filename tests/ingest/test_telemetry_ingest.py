"""Reading telemetry.jsonl: the handwritten fixture, damage stated, a wrong file refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import TEST_DATA
from tracestory.errors import TraceFormatError
from tracestory.ingest import load_inputs
from tracestory.ingest.telemetry import is_telemetry_file, read_telemetry

FOLDER = TEST_DATA / "telemetry" / "capture_throttled"
FILE = FOLDER / "torch" / "telemetry.jsonl"
BASE = 1790000000000000000


def test_reads_the_handwritten_file():
    log = read_telemetry(FILE)
    assert log.warnings == () and log.ended and log.rate_hz == 10.0
    assert log.n_gpus == 1 and log.devices[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert log.t_unix_ns.tolist() == [BASE + k * 100_000_000 for k in range(8, 18)]
    assert log.readings["sm_mhz"][0].tolist() == [1980, 1980, 1980, 1980, 1500, 1500, 1980, 1980, 1980, 1980]
    assert log.readings["energy_mj"][0][[0, -1]].tolist() == [1000000, 1360000]
    assert log.reasons_mask[0].tolist() == [1, 1, 0, 0, 4, 4, 0, 0, 1, 1]


def test_capture_folder_brings_its_telemetry():
    inputs = load_inputs([FOLDER])
    assert inputs.telemetry is not None and inputs.telemetry.path.endswith("torch/telemetry.jsonl")
    assert inputs.scheduler_log is not None


def test_a_telemetry_file_named_as_input_is_read_as_telemetry(tmp_path):
    inputs = load_inputs([FOLDER / "torch" / "rank0.trace.json", FILE])
    assert len(inputs.traces) == 1 and inputs.telemetry.n_samples == 10
    assert is_telemetry_file(FILE) and not is_telemetry_file(FOLDER / "manifest.json")


def test_damage_is_stated_not_silent(tmp_path):
    lines = FILE.read_text().splitlines()
    sample = json.loads(lines[3])
    sample["gpus"] = []                                        # does not match the header's 1 GPU
    damaged = [lines[0], lines[1], "not json", json.dumps(sample), lines[2], *lines[4:-1], lines[-2][:30]]
    path = tmp_path / "telemetry.jsonl"
    path.write_text("\n".join(damaged) + "\n")
    log = read_telemetry(path)
    text = " | ".join(log.warnings)
    assert ("2 lines not JSON objects ignored (first: line 3); the last line is cut short: the run was "
            "probably killed while writing") in text
    assert "1 sample without t_unix_ns or with a GPU list not matching the header's 1 device" in text
    assert "no end line" in text
    # kept: 0.8 s, 0.9 s, then 1.1 .. 1.7 s (7): the 1.0 s sample was the bad one, the cut
    # copy of 1.7 s is not JSON
    assert log.n_samples == 9 and np.all(np.diff(log.t_unix_ns) > 0)
    assert BASE + 1_000_000_000 not in log.t_unix_ns.tolist()


def test_not_a_telemetry_file_is_one_line(tmp_path):
    p = tmp_path / "telemetry.jsonl"
    p.write_text('{"type": "meta", "version": 1}\n')
    with pytest.raises(TraceFormatError, match="first line is a 'tracestory.telemetry/1' header"):
        read_telemetry(p)


def test_two_telemetry_files_are_refused(tmp_path):
    other = tmp_path / "telemetry.jsonl"
    shutil.copy(FILE, other)
    from tracestory.errors import UsageError

    with pytest.raises(UsageError, match="one GPU telemetry file per report"):
        load_inputs([FOLDER, other])
