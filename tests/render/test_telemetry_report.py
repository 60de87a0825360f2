"""The report on a capture folder with GPU telemetry: the section, the finding, J/token, the JSON
key and the PNG; no section without telemetry; damage stated."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import TEST_DATA
from tracestory.cli import main as cli_main
from tracestory.render.checklist import check_file

FOLDER = TEST_DATA / "telemetry" / "capture_throttled"


def _report(tmp_path, inputs, *extra):
    out = tmp_path / "r" / "report.md"
    rc = cli_main(["report", *map(str, inputs), "-o", str(out), "--json", str(tmp_path / "r" / "report.json"), *extra])
    assert rc == 0
    return out.read_text(), json.loads((tmp_path / "r" / "report.json").read_text())


def test_section_finding_and_json(tmp_path):
    text, doc = _report(tmp_path, [FOLDER])
    sec = text.split("## GPU Telemetry\n", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Hardware Behavior Analysis") < text.index("## GPU Telemetry") < text.index(
        "## Observations and Insights")
    assert "10 samples at 10.0 Hz over 900 ms; statistics over the traced window" in sec
    assert "| 0 NVIDIA H100 80GB HBM3 | 6 | 1500 / 1980 / 1980 MHz | 2619 / 2619 / 2619 MHz | 200.0 / 600.0 / 700.0 W | 310 J (energy counter) |" in sec
    assert "| 0 | software power cap | slowdown | 200 ms | 2 |" in sec
    assert "GPU 0 throttled in the traced window: SM clock down to 1500 MHz" in sec
    assert "decode 32.5 J/token" in sec and "prefill 0.58 J/token" in sec
    assert " window |" in sec and "[===" in sec                 # the ASCII timeline marks the window
    chart = sec.split("```text\n", 1)[1].split("```", 1)[0]
    assert all(len(line) <= 100 for line in chart.splitlines())
    t = doc["telemetry"]
    assert t["gpus"][0]["energy_j"] == pytest.approx(310.0)
    assert t["tokens"]["decode_j_per_token"] == pytest.approx(32.5)
    assert t["findings"][0]["rule"] == "gpu_clock_drop"
    assert len(t["timeline"]["t_unix_ns"]) == 10 and t["timeline"]["gpus"][0]["sm_mhz"][4] == 1500
    items = {i.number: i for i in check_file(tmp_path / "r" / "report.md").items}
    assert items["S1"].status == "PASS" and items["S3"].status == "PASS"     # structure, chart width


def test_plot_is_written_and_linked(tmp_path):
    pytest.importorskip("matplotlib")
    text, _ = _report(tmp_path, [FOLDER], "--plots")
    assert (tmp_path / "r" / "report_telemetry.png").is_file()
    assert "![GPU telemetry](report_telemetry.png)" in text


def test_no_section_without_telemetry_and_limitation_only_when_recorded_off(tmp_path):
    plain, doc = _report(tmp_path, [FOLDER / "torch" / "rank0.trace.json"])
    assert "## GPU Telemetry" not in plain and "telemetry" not in doc
    assert "no GPU telemetry" not in plain
    folder = tmp_path / "cap"
    shutil.copytree(FOLDER, folder)
    (folder / "torch" / "telemetry.jsonl").unlink()
    m = json.loads((folder / "manifest.json").read_text())
    m["captures"][0]["telemetry"] = {"status": "off", "reason": "--skip-power-monitor"}
    (folder / "manifest.json").write_text(json.dumps(m))
    text, _ = _report(tmp_path / "b", [folder])
    assert "## GPU Telemetry" not in text
    assert "no GPU telemetry (clocks, power) in the torch capture: the sampler was off (--skip-power-monitor)." in text


def test_damaged_telemetry_is_stated_in_the_report(tmp_path):
    folder = tmp_path / "cap"
    shutil.copytree(FOLDER, folder)
    f = folder / "torch" / "telemetry.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:-1] + [lines[-1][:20]]))            # end line cut short: a killed run
    text, doc = _report(tmp_path, [folder])
    assert "the last line is cut short: the run was probably killed while writing" in text
    assert "no end line: the sampler did not stop cleanly" in text
    assert any(x["analysis"] == "GPU telemetry" for x in doc["limitations"])
