"""Inputs that are not a plain timeline, read (or refused) as what they are.

* a CUPTI range-profiler trace (real: HolisticTraceAnalysis' test data, tests/data/PROVENANCE.md)
  is read, its ``cuda_profiler_range`` events as the kernels, without a timeline;
* an nsys export with no CUDA activity is refused in one line, as Kineto refuses the same; the
  input is derived from a real export (the extrap field file, its CUPTI activity tables dropped in
  a copy), since no real export without them was found;
* an ncu result where ncu measured nothing for some kernels keeps that fact; derived from the
  real H200 raw-page CSV (the metric cells of five of its six kernels blanked in a copy, as ncu
  leaves them when it collects nothing);
* ``nsys stats`` in its default column format is refused with a line saying ``--format csv``
  (hand-built in the shape Nsight Systems prints, tests/data/kinds/make_hand_built.py).

Expected counts are read with json / sqlite3 / csv here, not with tracestory.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import sqlite3

import pytest
from conftest import TEST_DATA

from tracestory.cli import main
from tracestory.errors import TraceFormatError
from tracestory.ingest import load_inputs
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.ncu import kernel_metrics_to_json, load_ncu
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

KINDS = TEST_DATA / "kinds"
RANGE_PROFILER = KINDS / "hta_cupti_range_profiler_alexnet.json.gz"
EXTRAP = TEST_DATA / "field" / "extra-p_extrap__a100_exgpu_s10_old_nsys.sqlite"
NCU_RAW = TEST_DATA / "h200" / "llama1layer_ncu_raw.csv"


def test_range_profiler_trace_is_read_without_a_timeline():
    events = json.loads(gzip.decompress(RANGE_PROFILER.read_bytes()))["traceEvents"]
    ranges = [e for e in events if e.get("cat") == "cuda_profiler_range"]
    assert len(ranges) == 77 and not any(e.get("cat") == "kernel" for e in events)
    t = load_kineto(RANGE_PROFILER)
    assert len(t.kernels) == len(ranges)
    assert sorted(t.name(c) for c in t.kernels["name"]) == sorted(e["name"] for e in ranges)
    assert t.meta.extra["cuda_profiler_ranges"] == 77
    assert t.meta.has_timeline is False


def test_range_profiler_report_is_written(tmp_path, capsys):
    assert main(["report", str(RANGE_PROFILER), "-o", str(tmp_path / "r.md")]) == 0
    assert "ProfilerActivity.CUDA" not in capsys.readouterr().err


def _nsys_without_gpu(tmp_path):
    p = tmp_path / "cpu_only.sqlite"
    shutil.copy(EXTRAP, p)
    con = sqlite3.connect(p)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for t in tables:
        if t.startswith("CUPTI_ACTIVITY_KIND_") and t != "CUPTI_ACTIVITY_KIND_RUNTIME":
            con.execute(f"DROP TABLE {t}")
    calls = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)").fetchone()[0]
    con.commit()
    con.close()
    return p, calls


def test_nsys_export_without_cuda_events_is_refused(tmp_path):
    p, calls = _nsys_without_gpu(tmp_path)
    assert calls == 18  # runtime/driver calls of the C program, by SQL
    with pytest.raises(TraceFormatError) as e:
        load_nsys_sqlite(p)
    msg = str(e.value)
    assert str(p) in msg and "none on the GPU" in msg and f"{calls:,} CUDA API calls" in msg and "\n" not in msg
    # the CPU side alone is still readable when asked for
    assert len(load_nsys_sqlite(p, require_gpu=False)[0].api) == calls


def test_nsys_export_without_cuda_events_exits_2_like_kineto(tmp_path, capsys):
    p, _ = _nsys_without_gpu(tmp_path)
    assert main(["report", str(p), "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none on the GPU" in err
    assert not (tmp_path / "r.md").exists()


def test_ncu_kernels_without_metrics_are_named(tmp_path):
    rows = list(csv.reader(NCU_RAW.open(newline="")))
    header, units, body = rows[0], rows[1], rows[2:]
    ident = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
             "Grid Size", "Device", "CC"}
    for r in body[1:]:  # ncu measured only the first kernel
        for i, h in enumerate(header):
            if h not in ident and not h.startswith("launch__"):
                r[i] = ""
    p = tmp_path / "partly_measured_raw.csv"
    with p.open("w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows([header, units, *body])
    km = load_ncu(p)
    assert len(km) == len(body) == 6
    assert [k.name for k in km.without_metrics] == [r[header.index("Kernel Name")] for r in body[1:]]
    assert [k.name for k in km.with_metrics] == [body[0][header.index("Kernel Name")]]
    assert any(w.startswith("5 of 6 profiled kernels have no metrics") for w in km.warnings)
    assert [r["has_metrics"] for r in kernel_metrics_to_json(km)] == [True] + [False] * 5
    # the untouched file: every kernel measured, no warning
    full = load_ncu(NCU_RAW)
    assert full.without_metrics == () and not any("no metrics" in w for w in full.warnings)


def test_nsys_stats_column_format_says_format_csv(tmp_path, capsys):
    src = KINDS / "nsys_stats_column_format.txt"
    with pytest.raises(TraceFormatError) as e:
        load_inputs([src])
    assert "--format csv" in str(e.value) and "\n" not in str(e.value)
    assert main(["report", str(src), "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nsys stats --format csv" in err
