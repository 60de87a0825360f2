"""tracestory check: the report checklist against Markdown reports.

Three kinds of input:

* every report tracestory writes for the project's fixtures (the three Kineto traces, the two
  Nsight Systems exports, the Nsight Compute fixtures, a trace joined with ncu metrics, the two
  real capture folders of tests/data/capture, the 2- and 4-GPU H200 captures, a memory capture
  and a compiled trace). Each must pass every item (N/A only with the report's own reason).
* one of those reports (H200 Llama) edited in the test: a section removed, a code fence left
  open, a chart line made wider than 100 columns, a table row broken. Each edit must fail the
  item(s) named here and change nothing else.
* a small report written here by hand that satisfies every item (no N/A), for the PASS paths
  that no generated report reaches yet (diffs, memory, stall, multi-GPU charts, Perfetto).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from conftest import A100_NCCL, H100_BERT, H200_LLAMA, NCU_DETAILS, NCU_RAW, NCU_REP, NSYS_2022, NSYS_2024, TEST_DATA
from tracestory.analysis.results import AnalysisOptions, analyze_inputs
from tracestory.cli import main
from tracestory.errors import TraceFormatError
from tracestory.ingest import load_inputs
from tracestory.render.build import write_report
from tracestory.render.checklist import ITEMS, check_file, check_text, width

NCU = TEST_DATA / "ncu"
CAPTURE = TEST_DATA / "capture"

# Inputs of every generated report; capture folders are extracted from their tarballs first.
REPORTS = {
    "h200_llama": [H200_LLAMA], "h100_bert": [H100_BERT], "a100_nccl": [A100_NCCL],
    "nsys_2022": [NSYS_2022], "nsys_2024": [NSYS_2024],
    "ncu_raw": [NCU_RAW], "ncu_details": [NCU_DETAILS], "ncu_rep": [NCU_REP],
    "h200_llama+ncu": [H200_LLAMA, NCU_RAW], "sdpa_ncu_rep": [NCU / "sdpa_flash.ncu-rep.gz"],
    "capture_torch": ["h200_torch"], "capture_ncu": ["h200_ncu"],
    # real multi-GPU captures (several ranks: the multi-GPU section), a memory capture, and the
    # compiled decode trace (CUDA graphs, Triton kernels)
    "tp2_uneven": [TEST_DATA / "multigpu" / "tp2_uneven"], "tp4_uneven": [TEST_DATA / "multigpu" / "tp4_uneven"],
    "memory_capture": [TEST_DATA / "memory" / "tiny_llama_memory"],
    "compiled": [TEST_DATA / "compare" / "decode_max-autotune_b.trace.json.gz"],
}

@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("reports")
    for name in ("h200_torch", "h200_ncu"):
        with tarfile.open(CAPTURE / f"{name}.tar.gz") as tar:
            tar.extractall(tmp / "cap", filter="data")
    out = {}
    for name, paths in REPORTS.items():
        paths = [tmp / "cap" / p if isinstance(p, str) else p for p in paths]
        results = analyze_inputs(load_inputs(paths),
                                 AnalysisOptions(command="tracestory report " + " ".join(str(p) for p in paths)))
        out[name] = write_report(results, tmp / f"{name}.md")
    return out


def _status(c) -> dict[str, str]:
    return {i.number: i.status for i in c.items}


# ------------------------------------------------------------------ generated reports


@pytest.mark.parametrize("name", list(REPORTS))
def test_every_generated_report_passes(name, reports):
    """Every report tracestory writes passes the checklist for the inputs it has."""
    c = check_file(reports[name])
    assert [i.number for i in c.items] == [n for n, _ in ITEMS]
    assert not c.failed, f"{name}: " + "; ".join(f"{i.number} {i.reason}" for i in c.failed)
    # Structure items always hold for what tracestory writes.
    assert all(_status(c)[n] == "PASS" for n in ("S1", "S2", "S3", "S4", "12"))


def test_na_comes_from_what_the_report_states(reports):
    trace_only = _status(check_file(reports["h200_llama"]))
    c = check_file(reports["h200_llama"])
    reasons = {i.number: i.reason for i in c.items}
    for n in ("4", "5", "13.4"):  # no Nsight Compute input: the report opens its section with n/a
        assert trace_only[n] == "N/A" and reasons[n].startswith("n/a: no Nsight Compute input")
    assert trace_only["9"] == "N/A" and "actions log is n/a" in reasons["9"]
    assert trace_only["13.6"] == "N/A" and reasons["13.6"].startswith("single GPU")
    ncu = check_file(reports["ncu_raw"])
    for i in ncu.items:
        if i.number in ("2", "3", "13.1", "13.2"):
            assert i.status == "N/A" and "n/a: the inputs hold no timeline trace" in i.reason, i
    ncu_status = _status(ncu)
    # Observations hold the hardware findings of the kernel metrics (roofline, occupancy).
    assert ncu_status["6"] == ncu_status["8"] == "PASS"
    assert ncu_status["4"] == ncu_status["5"] == ncu_status["13.4"] == ncu_status["13.5"] == "PASS"
    # One rank of a 2-rank run: the multi-GPU timeline is due, and the report says why it is n/a.
    a100 = {i.number: i for i in check_file(reports["a100_nccl"]).items}
    assert a100["13.6"].status == "N/A" and "holds 1 of 2 ranks" in a100["13.6"].reason
    # All ranks of a real 2-GPU run: the multi-GPU chart is there.
    tp2 = {i.number: i for i in check_file(reports["tp2_uneven"]).items}
    assert tp2["13.6"].status == "PASS" and "2 GPU/rank lanes" in tp2["13.6"].reason


# ------------------------------------------------------------------ edited reports


def _edit_baseline(reports):
    text = reports["h200_llama"].read_text()
    return text, _status(check_text(text))


def _changed(before: dict, text: str) -> dict[str, str]:
    after = _status(check_text(text))
    return {k: v for k, v in after.items() if before[k] != v}


def _cut_section(text: str, name: str) -> str:
    start = text.index(f"\n## {name}\n")
    end = text.index("\n## ", start + 1)
    return text[:start] + text[end:]


def test_removed_sections_fail_their_items(reports):
    text, before = _edit_baseline(reports)
    assert _changed(before, _cut_section(text, "Reproduction Guide")) == {"S1": "FAIL", "11": "FAIL"}
    # The memory chart stays due: the Visualizations still give the memory samples and peak.
    assert _changed(before, _cut_section(text, "Observations and Insights")) == {
        "S1": "FAIL", "6": "FAIL", "7": "FAIL", "8": "FAIL"}
    changed = _changed(before, _cut_section(text, "Execution Story"))
    assert changed == {"S1": "FAIL", "2": "FAIL", "3": "FAIL"}
    swapped = text.replace("## Environment\n", "## Environment_\n").replace("## Appendix\n", "## Environment\n")
    assert _changed(before, swapped)["S1"] == "FAIL"


def test_unclosed_fence_fails_s2(reports):
    text, before = _edit_baseline(reports)
    # A code block opened at the very end and never closed.
    assert _changed(before, text.rstrip("\n") + "\n\n```bash\ntracestory report x\n") == {"S2": "FAIL"}
    # Mid-report, the next block's closing line closes it: its ```text opener sits inside.
    start = text.index("```text\ncategory")
    end = text.index("\n```\n", start)
    c = check_text(text[:end] + text[end + 4:])
    s2 = next(i for i in c.items if i.number == "S2")
    assert s2.status == "FAIL" and "was not closed" in s2.reason
    # Left open before a section heading, it swallows the headings after it.
    cut = text.index("\n## Appendix")
    fence_close = text.rindex("\n```\n", 0, cut)
    changed = _changed(before, text[:fence_close] + text[fence_close + 4:])
    assert changed["S2"] == "FAIL" and changed["S1"] == "FAIL"


def test_wide_chart_fails_s3(reports):
    text, before = _edit_baseline(reports)
    anchor = "```text\ncategory"
    wide = text.replace(anchor, anchor[:-len("category")] + "x" * 101 + "\ncategory", 1)
    changed = _changed(before, wide)
    assert changed == {"S3": "FAIL"}
    assert "101 columns" in {i.number: i.reason for i in check_text(wide).items}["S3"]
    exactly = text.replace(anchor, anchor[:-len("category")] + "x" * 100 + "\ncategory", 1)
    assert _changed(before, exactly) == {}
    # Display width: 51 wide characters are 102 columns.
    assert width("漢" * 51) == 102
    assert _changed(before, text.replace(anchor, anchor[:-len("category")] + "漢" * 51 + "\ncategory", 1)) == {
        "S3": "FAIL"}
    # Commands are not charts: a long command line is kept verbatim.
    cmd = "```bash\ntracestory report "
    assert _changed(before, text.replace(cmd, cmd + "y" * 120 + " ")) == {}  # every copy of the command


def test_broken_table_fails_s4(reports):
    text, before = _edit_baseline(reports)
    row = next(ln for ln in text.splitlines() if ln.startswith("| gemm |"))
    assert _changed(before, text.replace(row, row.rsplit(" |", 2)[0] + " |", 1)) == {"S4": "FAIL"}


# ------------------------------------------------------------------ a report that passes all


FULL = """# Hands-On Learning Report: synthetic decode

## Executive Summary

Decode attention takes 62% of GPU time and runs at 72% of DRAM bandwidth: it is memory-bound.
Recommendation: use a paged decode attention kernel.

## Environment

- GPU: 2 x NVIDIA H200
- Rank 0 of world size 2

## Codebase Analysis Summary

FlashAttention and cuBLAS kernels, eager mode.

## Goal Interpretation

**Original Goal**: why is decode slow?

## Actions Log

**Action 1.1: capture**

```bash
python3 run.py --profile
```

**Action 1.2: patch the attention call**

```diff
- x = attn(q, k, v)
+ x = flash_attn(q, k, v)
```

## Execution Story

```text
Time 0.0 ms: CPU range 'decode_0' begins
Time 0.2 ms: GPU execution begins (launch latency 12 us)
├── Kernel: rms_norm (0.02 ms)
├── Kernel: attention (0.45 ms)
└── Kernel: mlp (0.35 ms)
```

## Visualizations

GPU time breakdown by category:

```text
attention │██████████████   0.45 ms  62.0%
mlp       │██████████       0.35 ms  38.0%
```

```text
GPU 0 │####....####
GPU 1 │###.....####
      (ms) 0    5    10
```

```text
GPU memory allocated (GiB)
4 │   ####
0 │###    ##
  (ms) 0   50   100
```

Open the exported trace in Perfetto (ui.perfetto.dev) to explore it interactively.

## Hardware Behavior Analysis

### `attention`

- achieved occupancy 47%, limited by shared memory
- SM throughput 68%, tensor pipe 35%
- DRAM throughput 72%: memory-bound

```text
Warp stall reasons (% of stall cycles)
long_scoreboard ████████ 42%
barrier         █████    28%
```

```text
Roofline (log-log): attention at AI 1.0 FLOP/byte, memory-bound
```

## Observations and Insights

### 1. Decode attention is memory-bound

**Observation**: attention is 62% of GPU time, 20% slower than expected at 4096 tokens;
peak allocated memory 4.0 GiB.

**Implication**: decode latency follows the KV cache size.

**Recommendation**: a paged KV cache kernel.

## Reproduction Guide

```bash
python3 run.py --profile
```

## Appendix

**Artifacts**

- `artifacts/run1/trace.json.gz`
"""


def test_hand_written_report_passes_every_item(tmp_path, capsys):
    c = check_text(FULL)
    assert {i.number: i.status for i in c.items if i.status != "PASS"} == {}
    p = tmp_path / "full.md"
    p.write_text(FULL)
    assert main(["check", str(p)]) == 0
    assert "24 PASS, 0 FAIL, 0 N/A" in capsys.readouterr().out


def test_pass_paths_turn_into_na_or_fail_when_data_is_absent():
    # No diff, and the report says the workload was not modified: 10 is N/A.
    no_diff = FULL.replace("**Action 1.2: patch the attention call**\n\n```diff\n- x = attn(q, k, v)\n"
                           "+ x = flash_attn(q, k, v)\n```\n", "No code modifications were made.\n")
    assert _status(check_text(no_diff))["10"] == "N/A"
    # An action without its command fails 9.
    assert _status(check_text(FULL.replace("```bash\npython3 run.py --profile\n```\n\n**Action 1.2",
                                           "**Action 1.2", 1)))["9"] == "FAIL"
    # One GPU, no memory numbers: 13.6 and 13.3 are N/A.
    single = FULL.replace("- Rank 0 of world size 2\n", "").replace("peak allocated memory 4.0 GiB", "no memory data")
    s = _status(check_text(single))
    assert (s["13.3"], s["13.6"]) == ("N/A", "N/A")
    # A guide whose commands were never run, and that says nothing about verification, fails 11.
    assert _status(check_text(FULL.replace("## Reproduction Guide\n\n```bash\npython3 run.py --profile",
                                           "## Reproduction Guide\n\n```bash\npython3 other.py")))["11"] == "FAIL"
    # A finding without a number fails 6.
    vague = "### 2. Something vague\n\n**Implication**: x. **Recommendation**: y.\n\n## Reproduction Guide"
    assert _status(check_text(FULL.replace("## Reproduction Guide", vague)))["6"] == "FAIL"


# ------------------------------------------------------------------ command


def test_check_command_exit_codes(tmp_path, reports, capsys):
    assert main(["check", str(reports["h200_llama"])]) == 0
    assert "S1  PASS" in capsys.readouterr().out
    no_tools = tmp_path / "no_tools.md"   # the interactive-viewer line removed: item 14 fails
    no_tools.write_text("\n".join(ln for ln in reports["h200_llama"].read_text().splitlines()
                                  if "erfetto" not in ln and "Nsight" not in ln) + "\n")
    assert main(["check", str(no_tools)]) == 1
    assert "14  FAIL" in capsys.readouterr().out
    js = tmp_path / "c.json"
    assert main(["check", str(no_tools), "--json", str(js)]) == 1
    assert '"number": "14"' in js.read_text()
    not_report = tmp_path / "x.md"
    not_report.write_text("just text\n")
    assert main(["check", str(not_report)]) == 2
    assert "no '## ' heading" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "missing.md")]) == 2
    binary = tmp_path / "b.md"
    binary.write_bytes(b"\xff\xfe\x00")
    assert main(["check", str(binary)]) == 2
    with pytest.raises(TraceFormatError):
        check_file(binary)
