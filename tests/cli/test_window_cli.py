"""--window / --steps / --steady-state on analyze and report, and compare's gates and identical
inputs, end to end; expected values from the plain JSON of the fixtures."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil

import pytest

from conftest import TEST_DATA
from tracestory.cli import main

TP2 = TEST_DATA / "multigpu" / "tp2_even" / "torch" / "rank0.trace.json.gz"
TP2_R1 = TEST_DATA / "multigpu" / "tp2_even" / "torch" / "rank1.trace.json.gz"
EAGER = TEST_DATA / "compare" / "decode_default_a.trace.json.gz"      # eager, slower
COMPILED = TEST_DATA / "compare" / "decode_default_b.trace.json.gz"   # torch.compile, faster


def events(path):
    return json.load(gzip.open(path))["traceEvents"]


def ns(us) -> int:
    return round(us * 1000)


def gpu_op_time(path) -> int:
    return sum(ns(e["dur"]) for e in events(path) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))


def test_report_says_which_steps_it_describes(tmp_path):
    out, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main(["report", str(TP2), "--steps", "5:6", "-o", str(out), "--json", str(js)]) == 0
    md = out.read_text()
    summary = md.split("## Executive Summary", 1)[1].split("\n## ", 1)[0]
    assert "**Part of the trace described** (`--steps 5:6`)" in summary
    assert "steps kept: ProfilerStep#5 .. ProfilerStep#6 (2)" in summary
    step = {e["name"]: e for e in events(TP2) if e.get("cat") == "user_annotation"}
    doc = json.loads(js.read_text())
    (w,) = doc["window"]["traces"]
    assert doc["window"]["request"] == "--steps 5:6"
    assert w["start_ns"] == ns(step["ProfilerStep#5"]["ts"])
    assert w["end_ns"] == ns(step["ProfilerStep#6"]["ts"]) + ns(step["ProfilerStep#6"]["dur"])
    assert w["steps_kept"] == ["ProfilerStep#5", "ProfilerStep#6"] and w["steps_dropped"] == []
    # the analysis is of the window: its kernel count is the window's
    assert doc["traces"][0]["gpu"]["kernel_count"] == w["kernels_kept"] == 52
    assert w["kernels_total"] == sum(1 for e in events(TP2) if e.get("cat") == "kernel")


def test_analyze_steady_state_json(tmp_path):
    js = tmp_path / "a.json"
    assert main(["analyze", str(TP2), "--steady-state", "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    (w,) = doc["window"]["traces"]
    assert "without its first step" in doc["window"]["rule"] and "1.5x" in doc["window"]["rule"]
    assert [d["step"] for d in w["steps_dropped"]] == ["ProfilerStep#4", "ProfilerStep#5"]
    assert w["steps_kept"] == ["ProfilerStep#6", "ProfilerStep#7"]


def test_analyze_time_window_counts(tmp_path, capsys):
    ev = [e for e in events(TP2) if e.get("ph") == "X" and e.get("cat") not in ("Trace", "overhead")]
    t0 = min(ns(e["ts"]) for e in ev)
    expect = sum(1 for e in ev if e["cat"] == "kernel" and t0 + 2_000_000 <= ns(e["ts"]) < t0 + 6_000_000)
    assert main(["analyze", str(TP2), "--window", "2:6", "--format", "json", "-o", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["traces"][0]["gpu"]["kernel_count"] == expect
    assert doc["window"]["traces"][0]["start_ms"] == 2.0


def test_whole_trace_has_no_window_key(tmp_path):
    js = tmp_path / "a.json"
    assert main(["analyze", str(TP2), "--json", str(js)]) == 0
    assert "window" not in json.loads(js.read_text())


def test_no_steps_exit_2_one_line(tmp_path, capsys):
    assert main(["report", str(EAGER), "--steady-state", "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs steps" in err and str(EAGER) in err
    assert not (tmp_path / "r.md").exists()


def test_window_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(TP2), "--steps", "1:2", "--steady-state"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_bad_window_exit_2(capsys):
    assert main(["analyze", str(TP2), "--window", "5:1"]) == 2
    assert "--window: expected END after START" in capsys.readouterr().err


# ------------------------------------------------------------------ compare


def test_compare_identical_inputs_are_named(tmp_path, capsys):
    copy = tmp_path / "copy.trace.json.gz"
    shutil.copyfile(EAGER, copy)
    md, js = tmp_path / "c.md", tmp_path / "c.json"
    assert main(["compare", str(EAGER), str(copy), "--gate", "0", "-o", str(md), "--json", str(js)]) == 0
    sha = hashlib.sha256(EAGER.read_bytes()).hexdigest()
    out = capsys.readouterr()
    assert "The two inputs are identical (same SHA-256" in out.out
    assert "1.00x" not in out.out
    doc = json.loads(js.read_text())
    assert doc["identical"] == sha
    assert doc["findings"][0]["title"] == "The two inputs are identical (same SHA-256)"
    assert all(not g["regressed"] and g["change"] == 0 for g in doc["gates"])
    text = md.read_text()
    assert f"The two inputs are identical (same SHA-256 `{sha[:16]}`)" in text and "as fast as" not in text
    speedup_rows = [l for l in text.splitlines() if l.startswith(("| wall (", "| GPU busy (", "| GPU op time ("))]
    assert speedup_rows and all(l.endswith("| identical |") for l in speedup_rows)


def test_compare_gate_regression_exit_1_one_line_each(tmp_path, capsys):
    js = tmp_path / "c.json"
    # A = the compiled (faster) run, B = eager: B regresses
    assert main(["compare", str(COMPILED), str(EAGER), "--gate", "5", "--json", str(js)]) == 1
    err = [l for l in capsys.readouterr().err.splitlines() if l]
    a, b = gpu_op_time(COMPILED), gpu_op_time(EAGER)
    change = 100 * (b - a) / a
    assert change > 5
    line = next(l for l in err if l.startswith("regression: GPU op time"))
    assert f"({change:+.1f}%, gate 5%)" in line
    doc = json.loads(js.read_text())
    assert doc["identical"] is None
    assert {g["name"] for g in doc["gates"]} == {"wall", "busy", "gpu_time"}
    # exactly one stderr line per regressed metric
    assert len([l for l in err if l.startswith("regression: ")]) == sum(g["regressed"] for g in doc["gates"])


def test_compare_gate_passes_exit_0(capsys):
    assert main(["compare", str(EAGER), str(COMPILED), "--gate", "5"]) == 0
    err = capsys.readouterr().err
    assert "regression" not in err and "within their gates" in err


def test_compare_per_metric_gate(capsys):
    ka = sum(1 for e in events(EAGER) if e.get("cat") == "kernel")
    kb = sum(1 for e in events(COMPILED) if e.get("cat") == "kernel")
    assert kb != ka
    worse, better = (EAGER, COMPILED) if ka > kb else (COMPILED, EAGER)   # worse: more kernels
    lo, hi = min(ka, kb), max(ka, kb)
    pct = 100 * (hi - lo) / lo
    # more kernels in B than the gate allows: exit 1, the line names the counts
    assert main(["compare", str(better), str(worse), "--gate-metric", f"kernels={pct - 0.5:.3f}"]) == 1
    assert f"regression: kernels {lo:,} -> {hi:,} ({pct:+.1f}%" in capsys.readouterr().err
    assert main(["compare", str(better), str(worse), "--gate-metric", f"kernels={pct + 0.5:.3f}"]) == 0


def test_compare_gate_on_a_metric_a_side_lacks_exit_2(capsys):
    assert main(["compare", str(EAGER), str(COMPILED), "--gate-metric", "iteration=3"]) == 2
    # each file holds one iteration (tests/data/compare/README.md): no family of >= 2 phases
    assert ("--gate-metric iteration: expected iteration median on both sides, found no iteration family in "
            "decode_default_a and decode_default_b") in capsys.readouterr().err
    assert main(["compare", str(EAGER), str(COMPILED), "--gate-metric", "speed=3"]) == 2
    assert main(["compare", str(EAGER), str(COMPILED), "--gate-metric", "wall"]) == 2
    assert main(["compare", str(EAGER), str(COMPILED), "--gate", "-1"]) == 2


def test_compare_steps_on_both_sides(tmp_path):
    js = tmp_path / "c.json"
    assert main(["compare", str(TP2), str(TP2_R1), "--steps", "5:6", "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert doc["window"]["request"] == "--steps 5:6"
    for side, path in zip(("a", "b"), (TP2, TP2_R1), strict=True):
        step = {e["name"]: e for e in events(path) if e.get("cat") == "user_annotation"}
        tw = doc["window"]["traces"]["ab".index(side)]
        assert tw["start_ns"] == ns(step["ProfilerStep#5"]["ts"])
        assert tw["steps_kept"] == ["ProfilerStep#5", "ProfilerStep#6"]
        assert doc[side]["kernel_count"] == tw["kernels_kept"]


def test_analyze_tables_say_which_part(capsys):
    assert main(["analyze", str(TP2), "--steps", "5:6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Part of the trace described (--steps 5:6)")
    assert "52 of 122 kernels" in out   # 52: 26 kernels in each of ProfilerStep#5 and #6 (Phase table)


def test_window_refuses_summaries_and_kernel_metrics(tmp_path, capsys):
    summary = TEST_DATA / "nsys" / "cuda_gpu_kern_sum.csv"
    assert main(["analyze", str(summary), "--window", "1:2"]) == 2
    assert "expected a trace with a timeline" in capsys.readouterr().err
    ncu = TEST_DATA / "h200" / "llama1layer_ncu_raw.csv"
    llama = TEST_DATA / "h200" / "llama2layer_eager_decode.trace.json.gz"
    assert main(["report", str(llama), str(ncu), "--window", "0:5", "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert str(ncu) in err and "cannot restrict Nsight Compute kernel metrics" in err
