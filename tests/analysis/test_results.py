"""One results model: the report, its findings and its JSON quote the same roofline figures, and
every expensive analysis runs once per run of one report."""

from __future__ import annotations

import csv
import json
import re
import sys

import pytest
from conftest import H200_LLAMA, NCU_RAW

from tracestory.analysis.results import AnalysisOptions, analyze_inputs
from tracestory.cli import main
from tracestory.ingest import load_inputs

PEAK_BW = 1.0e12     # the peaks file below: a DRAM roof far from the H200's 4.8 TB/s datasheet
PEAKS_TOML = f"""name = "H200"
dram_bytes_per_s = {PEAK_BW!r}
source = "peaks written by the test"

[flops_per_s]
bf16 = 1.0e15
fp32 = 6.0e13
"""


def _hand_pct_of_roof() -> dict[str, float]:
    """Per ncu kernel name, % of the DRAM roof read from the raw CSV by hand: ncu reports DRAM
    bytes in Kbyte (1000 B) and the duration in us; every kernel of this capture (decode
    element-wise and reduction kernels, arithmetic intensity < 1.1 FLOP/B, far left of any
    ridge point) is memory-bound, so its % of roof is (bytes / duration) / peak bandwidth."""
    with open(NCU_RAW, newline="") as f:
        rows = list(csv.reader(f))
    head, units = rows[0], rows[1]
    col = {name: head.index(name) for name in ("Kernel Name", "dram__bytes_read.sum", "dram__bytes_write.sum",
                                               "gpu__time_duration.sum")}
    assert (units[col["dram__bytes_read.sum"]], units[col["gpu__time_duration.sum"]]) == ("Kbyte", "us")
    out = {}
    for r in rows[2:]:
        nbytes = (float(r[col["dram__bytes_read.sum"]]) + float(r[col["dram__bytes_write.sum"]])) * 1000
        seconds = float(r[col["gpu__time_duration.sum"]]) * 1e-6
        out[r[col["Kernel Name"]]] = 100 * nbytes / seconds / PEAK_BW
    assert len(out) == len(rows) - 2 == 6   # names are unique: one point per name
    return out


def test_peaks_report_findings_and_json_agree(tmp_path):
    peaks = tmp_path / "peaks.toml"
    peaks.write_text(PEAKS_TOML)
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main(["report", str(H200_LLAMA), str(NCU_RAW), "--peaks", str(peaks), "-o", str(md),
                 "--json", str(js)]) == 0
    hand = _hand_pct_of_roof()
    doc = json.loads(js.read_text())
    text = md.read_text()

    # JSON: every ncu kernel on the roofline of the --peaks file
    assert doc["ncu_peaks"]["NVIDIA H200"]["dram_bytes_per_s"] == PEAK_BW
    assert {k["name"]: k["bound"] for k in doc["kernels"]} == dict.fromkeys(hand, "memory")
    for k in doc["kernels"]:
        assert k["roofline"]["pct_of_roof"] == pytest.approx(hand[k["name"]], rel=1e-9)

    # the bound finding (JSON and Markdown): each top memory-bound kernel's share of its roof
    (bound,) = [f for f in doc["traces"][0]["findings"] if f["rule"] == "bound"]
    ev = {e["label"]: e["value"] for e in bound["evidence"]}
    assert ev["source"] == "Nsight Compute counters"
    for i in (1, 2, 3):
        name = ev[f"memory-bound #{i}"]
        assert ev[f"memory-bound #{i} share of its roof"] == pytest.approx(hand[name] / 100, rel=1e-9)
        # the report shows a finding's first evidence lines (render.sections.observations.EVIDENCE_SHOWN);
        # the JSON holds every one, checked above
        line = f"- memory-bound #{i} share of its roof: {hand[name]:.1f}%\n"
        if bound["severity"] == "info":   # one bullet under "Also checked": the evidence is in the JSON
            assert ev["placed share of all kernel time"] < 0.25 and f"- {bound['title']}." in text
        else:
            assert line in text or (i > 1 and "more in the JSON output" in text)

    # the Hardware section: its roofline legend prints each placed kernel's % of roof
    hardware = text.split("## Hardware Behavior Analysis", 1)[1].split("\n## ", 1)[0]
    assert "legend: / = DRAM roof 1.00 TB/s" in hardware
    legend = re.findall(r"^  [A-Z] (.+?)… +AI .* memory (\d+)% of roof$", hardware, re.M)
    assert len(legend) == 5   # the sixth kernel counts no FLOPs: not drawn, listed as not placed
    for prefix, pct in legend:
        (name,) = [n for n in hand if n.startswith(prefix)]
        assert pct == f"{hand[name]:.0f}"


COUNTED = ("join_ncu", "roofline", "memory_timeline", "gap_causes", "derive_findings", "estimate_roofline")


@pytest.mark.parametrize("inputs, expected", [
    ([H200_LLAMA, NCU_RAW], {"join_ncu": 1, "roofline": 1, "memory_timeline": 1, "gap_causes": 1,
                             "derive_findings": 1, "estimate_roofline": 0}),
    ([H200_LLAMA], {"join_ncu": 0, "roofline": 0, "memory_timeline": 1, "gap_causes": 1,
                    "derive_findings": 1, "estimate_roofline": 1}),
], ids=["trace_and_ncu", "trace_only"])
def test_each_analysis_runs_once_per_report(tmp_path, monkeypatch, inputs, expected):
    calls = dict.fromkeys(COUNTED, 0)
    from tracestory.analysis import claims, gaps, memory, ncu_join, roofline
    originals = {"join_ncu": ncu_join.join_ncu, "roofline": roofline.roofline, "memory_timeline": memory.memory_timeline,
                 "gap_causes": gaps.gap_causes, "derive_findings": claims.derive_findings,
                 "estimate_roofline": roofline.estimate_roofline}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    # every module-level binding of these functions, wherever it was imported (lazy imports read
    # the defining module's attribute at call time, so they are caught too)
    for mod in [m for n, m in sys.modules.items() if n.startswith("tracestory") and m is not None]:
        for name, fn in originals.items():
            if getattr(mod, name, None) is fn:
                monkeypatch.setattr(mod, name, counting(name, fn))
    assert main(["report", *map(str, inputs), "-o", str(tmp_path / "r.md"),
                 "--json", str(tmp_path / "r.json"), "--plots"]) == 0
    assert calls == expected


def test_results_are_frozen_and_print_short():
    r = analyze_inputs(load_inputs([H200_LLAMA]), AnalysisOptions(goal="why?"))
    assert len(repr(r)) < 300 and len(repr(r.runs[0])) < 300 and len(repr(r.inputs)) < 300
    with pytest.raises(AttributeError):
        r.runs = ()
    # Results.findings: typed records of every run's findings (tests/tables/test_api_records.py)
    assert [(f.rule, f.title) for f in r.findings] == [(f.rule, f.title) for f in r.runs[0].findings]
    assert r.options.goal == "why?"


def test_peaks_reach_the_shape_estimate_too(tmp_path):
    """Without ncu input the roofline is estimated from op shapes; the --peaks file's bandwidth is
    the roof of that estimate in the JSON, in the bound finding and in the Hardware section."""
    peaks = tmp_path / "peaks.toml"
    peaks.write_text(PEAKS_TOML)
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main(["report", str(H200_LLAMA), "--peaks", str(peaks), "-o", str(md), "--json", str(js)]) == 0
    trace = json.loads(js.read_text())["traces"][0]
    assert trace["peaks"]["dram_bytes_per_s"] == PEAK_BW
    points = {p["label"]: p for p in trace["roofline_estimate"]["points"]}
    for p in points.values():
        if p["bound"] == "memory":
            assert p["pct_of_roof"] == pytest.approx(100 * p["achieved_bytes_per_s"] / PEAK_BW, rel=1e-9)
    (bound,) = [f for f in trace["findings"] if f["rule"] == "bound"]
    ev = {e["label"]: e["value"] for e in bound["evidence"]}
    assert ev["source"] == "estimated from op shapes"
    name = ev["memory-bound #1"]
    assert ev["memory-bound #1 share of its roof"] == pytest.approx(points[name]["pct_of_roof"] / 100, rel=1e-9)
    assert "legend: / = DRAM roof 1.00 TB/s" in md.read_text()
