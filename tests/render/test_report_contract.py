"""The report contract, on reports of every fixture (three Kineto traces, two public Nsight
Systems SQLite exports, the three Nsight Compute inputs alone, and the H200 trace with ncu):

1. the Markdown parses: every code fence is closed, every table row has the header's column
   count and the second row is a delimiter row;
2. every line inside a chart's code fence is at most 100 columns (shell command fences are
   exempt, see the test);
3. every number in prose appears in the JSON results written with the report.

"Prose" here is everything outside code fences: paragraphs, list items, headings AND table
cells (the issue's "every number in prose appears in the JSON results" is only useful if the
tables, which hold most of the numbers, are held to it too). Code fences are charts and
commands; their numbers are drawn from the same results but positioned, not printed as values.
Not numbers: digits inside identifiers (``decode_3``, ``sm90``, ``bf16``), inline code spans
(kernel names, paths, commands), Markdown link targets, list and finding enumerations.

A printed number matches a JSON number when formatting that number in the printed unit gives
the printed text within the printed precision (half a unit in the last printed digit):
durations (``ns``/``us``/``ms``/``s``) against keys ending in ``_ns`` or evidence in ns; sizes
(``B``/``KiB``/``MiB``/``GiB``) against byte-valued keys or evidence; ``%`` against shares and
fractions (x100: keys naming a share or fraction, evidence in fractions) or percents (keys
under a ``pct`` / ``percent`` name); SI-prefixed rates and counts (``TFLOP/s``, ``TB/s``, ``GFLOP``)
against any value; plain numbers against any value, in the unit of their table column when
the header names one (``time (ms)``). A printed number also matches when the same token
(number and unit, on token boundaries) is part of a JSON string value other than a finding's
title, implication or recommendation (those are themselves prose): evidence labels such as
"kernels shorter than 10 us", version strings, names.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import (TEST_DATA, A100_NCCL, H100_BERT, H200_LLAMA, NCU_DETAILS, NCU_RAW, NCU_REP, NSYS_2022,
                      NSYS_2024)

from tracestory.analysis.results import AnalysisOptions, analyze_inputs
from tracestory.ingest import load_inputs
from tracestory.render.build import write_report

CASES = {
    "h200_llama": [H200_LLAMA],
    "h100_bert": [H100_BERT],
    "a100_nccl": [A100_NCCL],
    "nsys_2022": [NSYS_2022],
    "nsys_2024": [NSYS_2024],
    "ncu_raw": [NCU_RAW],
    "ncu_details": [NCU_DETAILS],
    "ncu_rep": [NCU_REP],
    "h200_with_ncu": [H200_LLAMA, NCU_RAW, NCU_REP],
    "telemetry": [TEST_DATA / "telemetry" / "capture_throttled" / "torch" / "rank0.trace.json",
                  TEST_DATA / "telemetry" / "capture_throttled" / "torch" / "telemetry.jsonl"],
}


@lru_cache(maxsize=None)
def _report(case: str, out_dir: str) -> tuple[str, dict]:
    results = analyze_inputs(load_inputs(CASES[case]), AnalysisOptions(command=f"tracestory report {case}",
                                                                       goal="Where does the time go?"))
    md, js = Path(out_dir) / f"{case}.md", Path(out_dir) / f"{case}.json"
    write_report(results, md, json_path=js)
    return md.read_text(encoding="utf-8"), json.loads(js.read_text())


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("contract"))


# ----------------------------------------------------------------------------- Markdown


def _split(text: str) -> tuple[list[str], list[list[str]], bool]:
    """(prose lines, fenced blocks, every fence closed). A block's first item is its fence
    language (``""`` when none)."""
    prose, blocks, cur = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if cur is None:
                cur = [line[3:].strip()]
            else:
                blocks.append(cur)
                cur = None
        elif cur is not None:
            cur.append(line)
        else:
            prose.append(line)
    return prose, blocks, cur is None


def _tables(prose: list[str]) -> list[list[str]]:
    out, cur = [], []
    for line in prose + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            out.append(cur)
            cur = []
    return out


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


@pytest.mark.parametrize("case", list(CASES))
def test_markdown_parses(case, out_dir):
    text, _ = _report(case, out_dir)
    prose, _, closed = _split(text)
    assert closed, "a code fence is not closed"
    assert text.splitlines()[0].startswith("# ")
    for t in _tables(prose):
        n = len(_cells(t[0]))
        assert len(t) >= 2 and re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", t[1]), t[:2]
        assert all(len(_cells(r)) == n for r in t), [r for r in t if len(_cells(r)) != n][:2]


@pytest.mark.parametrize("case", list(CASES))
def test_charts_within_100_columns(case, out_dir):
    """Charts (fences without a language or marked ``text``) stay within 100 columns. Shell
    command fences (``bash``) are exempt: a command holding the inputs' absolute paths must stay
    copy-pasteable, and cutting it would change it."""
    text, _ = _report(case, out_dir)
    _, blocks, _ = _split(text)
    charts = [b[1:] for b in blocks if b[0] in ("", "text")]
    assert charts
    for b in charts:
        wide = [line for line in b if len(line) > 100]
        assert not wide, wide[:2]


# ----------------------------------------------------------------------------- numbers

_TIME = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_BIN = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_UNIT = r"(?:%|x\b|ns\b|us\b|µs\b|ms\b|s\b|[KMGT]iB\b|[kKMGTP]?(?:FLOP/s|FLOP/B|FLOP|B/s|B)\b|per ms\b)"
# a number (or a dotted version, matched literally), then an optional unit
_NUM = re.compile(r"(?<![\w.\-/#])(-?\d+(?:\.\d+)*(?:e[+-]?\d+)?)(?:\s?(" + _UNIT + r"))?(?![\w])")


def _kind(path: str, unit: str | None) -> str:
    """What a JSON number measures, from its key path and (for evidence) its unit."""
    if path.endswith("_ns") or unit in ("ns", "ns_per_step") or "gap_histogram" in path:
        return "time"   # gap_histogram rows are [label, count, total_ns]
    if "bytes" in path or unit == "bytes":
        return "bytes"
    if unit == "fraction" or re.search(r"share|fraction", path):
        return "fraction"
    if re.search(r"percent|pct", path):
        return "percent"
    return "any"


def _pool(doc) -> tuple[list[tuple[float, str]], list[str]]:
    """(JSON numbers with their kind, JSON strings allowed as sources)."""
    nums: list[tuple[float, str]] = []
    strings: list[str] = []

    def walk(v, path="", unit=None):
        if isinstance(v, dict):
            u = v.get("unit") if isinstance(v.get("unit"), str) else None
            for k, x in v.items():
                if k in ("title", "implication", "recommendation"):
                    continue
                walk(x, f"{path}.{k}", u if k == "value" else None)
        elif isinstance(v, list):
            for x in v:
                walk(x, path, unit)
        elif isinstance(v, bool) or v is None:
            return
        elif isinstance(v, (int, float)):
            nums.append((float(v), _kind(path.rsplit(".", 1)[-1] if "gap_histogram" not in path else path,
                                         unit) if "pct" not in path and "percent" not in path
                         else "percent"))
        elif isinstance(v, str):
            strings.append(v)

    walk(doc)
    return nums, strings


def _matches(text: str, unit: str | None, nums, strings, column_unit: str | None) -> bool:
    if text.count(".") > 1:   # a version: only as text
        return any(re.search(r"(?<![\w.])" + re.escape(text) + r"(?![\w.])", s) for s in strings)
    v = float(text)
    dec = len(text.split(".")[1]) if "." in text and "e" not in text else 0
    tol = 0.5 * 10 ** -dec + 1e-9 * max(1.0, abs(v))
    if "e" in text:
        tol = abs(v) * 5e-4
    token = text + ("" if unit is None else (" " if unit not in ("%", "x") else "") + unit)
    for s in strings:   # the token inside a JSON string, on token boundaries
        if re.search(r"(?<![\w.])" + re.escape(token) + r"(?![\w.]\w)", s) or (
                unit is not None and re.search(r"(?<![\w.])" + re.escape(text + unit) + r"(?![\w])", s)):
            return True
    unit = unit or column_unit
    if unit in _TIME:
        return any(abs(x / _TIME[unit] - v) <= tol for x, k in nums if k == "time")
    if unit in _BIN:
        return any(abs(x / _BIN[unit] - v) <= tol for x, k in nums if k == "bytes")
    if unit == "%":
        return any(abs(x * 100 - v) <= tol for x, k in nums if k == "fraction") or \
            any(abs(x - v) <= tol for x, k in nums if k == "percent")
    if unit is not None and unit not in ("x", "per ms"):
        m = re.fullmatch(r"([kKMGTP]?)(FLOP/s|FLOP/B|FLOP|B/s|B)", unit)
        scale = _SI[m.group(1)] if m else 1.0
        return any(abs(x / scale - v) <= tol for x, _ in nums)
    return any(abs(x - v) <= tol for x, _ in nums)


def _clean(s: str) -> str:
    """Inline code, links and images, and list / finding enumerations removed."""
    s = re.sub(r"`[^`]*`|!?\[[^\]]*\]\([^)]*\)", " ", s)
    return re.sub(r"^\s*(#+ )?\d+\. ", " ", s)


def _prose_numbers(prose: list[str]):
    """(token text, unit or None, column unit or None, the line) for every number in prose."""
    header: list[str | None] | None = None   # the current table's column units
    for line in prose:
        if not line.startswith("|"):
            header = None
            for m in _NUM.finditer(_clean(line)):
                yield m.group(1), m.group(2), None, line
            continue
        cells = _cells(line)
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            continue
        if header is None:   # a table's first row is its header
            header = [(re.search(r"\((ns|us|ms|s|%|GiB|MiB|B)\b", c) or [None, None])[1] for c in cells]
            units = [None] * len(cells)
        else:
            units = header
        for c, cu in zip(cells, units):
            for m in _NUM.finditer(_clean(c)):
                yield m.group(1), m.group(2), cu, line


def _missing(case, out_dir):
    text, doc = _report(case, out_dir)
    prose, _, _ = _split(text)
    nums, strings = _pool(doc)
    miss = []
    for tok, unit, cu, line in _prose_numbers(prose):
        if not _matches(tok, unit, nums, strings, cu):
            miss.append((tok + (f" {unit}" if unit else ""), line[:120]))
    return miss


@pytest.mark.parametrize("case", list(CASES))
def test_every_number_in_prose_is_in_the_json(case, out_dir):
    miss = _missing(case, out_dir)
    assert not miss, miss[:10]


def test_the_checker_catches_numbers_from_nowhere(out_dir):
    """The matcher is not vacuous. Every duration and size printed in the H200 report, moved by
    3 units in its last printed digit, must mostly fail to match: a pool of thousands of JSON
    numbers lets some coincide (measured when this test was written: about 1 in 8 durations,
    none of the sizes), so the bar is 80% for durations and 95% for sizes."""
    text, doc = _report("h200_llama", out_dir)
    nums, strings = _pool(doc)
    assert _matches("6.19", "ms", nums, strings, None)            # the GPU busy time
    assert not _matches("777", "GiB", nums, strings, None)
    tally = {"time": [0, 0], "bytes": [0, 0]}
    for tok, unit, cu, _ in _prose_numbers(_split(text)[0]):
        u = unit or cu
        cls = "time" if u in _TIME else "bytes" if u in _BIN else None
        if cls is None or tok.count(".") > 1:
            continue
        dec = len(tok.split(".")[1]) if "." in tok else 0
        moved = f"{float(tok) + 3 * 10 ** -dec:.{dec}f}"
        tally[cls][0] += 1
        tally[cls][1] += not _matches(moved, unit, nums, strings, cu)
    assert tally["time"][0] > 50 and tally["bytes"][0] > 5
    assert tally["time"][1] >= 0.8 * tally["time"][0]
    assert tally["bytes"][1] >= 0.95 * tally["bytes"][0]


# ----------------------------------------------------------------------------- PNG figures


@pytest.mark.parametrize("paths, expected", [
    ([H200_LLAMA], {"breakdown", "timeline", "phases", "memory", "roofline"}),   # roofline: estimate
    ([H200_LLAMA, NCU_RAW, NCU_REP], {"breakdown", "timeline", "phases", "memory", "warp_stalls", "roofline"}),
    ([A100_NCCL], {"breakdown", "timeline", "phases"}),   # no memory samples, no op shapes to estimate
], ids=["h200", "h200_ncu", "a100_nccl"])
def test_every_visualization_as_png(tmp_path, paths, expected):
    """Per trace the figures of write_plots, plus write_hardware_plots: with ncu rows the warp
    stall distribution and the roofline, else the roofline estimated from op shapes."""
    from tracestory.render.build import write_plots_for

    written = write_plots_for(analyze_inputs(load_inputs(paths)), tmp_path, "r")
    assert {p.stem.split("_", 1)[1] for p in written} == expected
    for p in written:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
