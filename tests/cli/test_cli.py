"""The CLI end to end: JSON sums against plain JSON sums, bad input, the demo."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import KINETO_FIXTURES
from tracestory.cli import main


def plain_gpu_sums(path):
    events = json.load(gzip.open(path))["traceEvents"]
    ns = lambda e: round(e["dur"] * 1000)
    kernels = [ns(e) for e in events if e.get("cat") == "kernel"]
    memops = [ns(e) for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    return len(kernels), sum(kernels), len(memops), sum(memops)


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name)
def test_analyze_json_sums_match_plain_json(path, tmp_path, capsys):
    out = tmp_path / "a.json"
    assert main(["analyze", str(path), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tracestory.analysis/1"
    (t,) = doc["traces"]
    kc, kt, mc, mt = plain_gpu_sums(path)
    gpu = t["gpu"]
    assert (gpu["kernel_count"], gpu["kernel_time_ns"], gpu["memop_count"], gpu["memop_time_ns"]) == (kc, kt, mc, mt)
    assert sum(c["time_ns"] for c in t["categories"]) == kt + mt
    assert sum(c["count"] for c in t["categories"]) == kc + mc
    assert gpu["busy_ns"] <= gpu["sum_ns"] == kt + mt
    assert gpu["idle_ns"] == gpu["window_ns"] - gpu["busy_ns"]
    for c in t["categories"]:
        p = c["time_ns"] / (kt + mt)
        assert c["percent"] == pytest.approx(100 * p)
        assert c["amdahl_max_speedup"] == pytest.approx(1 / (1 - p))
        assert c["whatif_speedup"] == pytest.approx(1 / ((1 - p) + p / 2))


def test_speedup_factor_option(tmp_path):
    out = tmp_path / "a.json"
    path = KINETO_FIXTURES[0]
    assert main(["analyze", str(path), "-k", "4", "--json", str(out)]) == 0
    c = json.loads(out.read_text())["traces"][0]["categories"][0]
    _, kt, _, mt = plain_gpu_sums(path)
    p = c["time_ns"] / (kt + mt)
    assert c["whatif_speedup"] == pytest.approx(1 / ((1 - p) + p / 4))


@pytest.mark.parametrize("content", [b"not json at all", b'{"traceEvents": []}', b'{"foo": 1}'])
def test_bad_input_exit_2_one_line(tmp_path, capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    assert main(["analyze", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err


def test_truncated_gzip_exit_2(tmp_path, capsys):
    data = KINETO_FIXTURES[1].read_bytes()
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(data[: len(data) // 3])
    assert main(["report", str(bad), "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and err.count("\n") == 1
    assert not (tmp_path / "r.md").exists()


def test_missing_file_exit_2(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_demo_writes_report(tmp_path, capsys):
    assert main(["demo", "--output-dir", str(tmp_path / "d")]) == 0
    printed = capsys.readouterr().out.split()
    report = tmp_path / "d" / "report.md"
    # every file it wrote, the report first
    assert printed == [str(report), str(tmp_path / "d" / "analysis.json"), str(tmp_path / "d" / "report.html")]
    assert all(Path(p).is_file() for p in printed)
    text = report.read_text()
    assert text.startswith("# ") and "## Execution Story" in text
    assert json.loads((tmp_path / "d" / "analysis.json").read_text())["traces"][0]["gpu"]["kernel_count"] == 848


def test_output_never_overwrites_an_input(tmp_path, capsys):
    src = tmp_path / "t.json.gz"
    src.write_bytes(KINETO_FIXTURES[1].read_bytes())
    before = src.read_bytes()
    assert main(["analyze", str(src), "--json", str(src)]) == 2
    assert main(["report", str(src), "-o", str(src)]) == 2
    assert src.read_bytes() == before
    assert "that is not an input, found the input" in capsys.readouterr().err


def test_report_on_ncu_only_capture_folder(tmp_path):
    """A capture folder with only Nsight Compute output still gets a full report."""
    import csv
    import tarfile

    from conftest import TEST_DATA

    with tarfile.open(TEST_DATA / "capture" / "h200_ncu.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    folder = tmp_path / "h200_ncu"
    manifest = json.loads((folder / "manifest.json").read_text())
    out = tmp_path / "r.md"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    text = out.read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[:2] == ["## Executive Summary", "## Environment"] and headings[-1] == "## Appendix"
    assert manifest["environment"]["gpus"][0]["name"] in text
    assert "no timeline trace" in text  # the Execution Story says why it is empty
    with open(folder / "ncu" / "h200_ncu_raw.csv", newline="") as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("=="))]
    assert "Kernel Name" in rows[0]
    assert len(rows) - 2 == 12  # header + units rows
    assert text.count("### `") == 5  # the top 5 of the 12 kernels, each with its four blocks
    assert text.count("**Warp stall reasons**") == 5
    assert "12 kernels" in text
