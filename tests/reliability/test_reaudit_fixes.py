"""The failures the re-audit script (tests/reliability/reaudit.py) found, each as a test of the
normal suite: what a new user hit, and the one line they now get.

Expected values come from reading the damaged files by hand (the kernel count of the fixture by
python json, the byte written), not from tracestory.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import TEST_DATA

from tracestory.cli import main

DECODE = TEST_DATA / "graphs" / "manual_graph_decode.trace.json.gz"
TP2 = TEST_DATA / "multigpu" / "tp2_even"
SCHED = TEST_DATA / "telemetry" / "capture_throttled" / "torch" / "serve.sched.jsonl"


def _one_line(capsys, code, *words):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert str(w) in lines[0], (w, lines[0])
    return lines[0]


def _doc() -> dict:
    return json.loads(gzip.decompress(DECODE.read_bytes()))


def _kernels(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("command", ["analyze", "categories", "export"])
def test_a_byte_that_is_not_utf8_is_one_line(tmp_path, capsys, gz, command):
    # a kernel name's first byte replaced by 0xf3 (a UTF-8 lead byte without its continuation)
    text = json.dumps(_doc()).encode()
    i = text.index(b'"name": "', text.index(b'"cat": "kernel"')) + len(b'"name": "')
    bad = text[:i] + b"\xf3" + text[i + 1:]
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(bad) if gz else bad)
    argv = {"analyze": ["analyze", p], "categories": ["categories", p, "-o", tmp_path / "c.json"],
            "export": ["export", "perfetto", p, "-o", tmp_path / "p.json.gz"]}[command]
    _one_line(capsys, main([str(a) for a in argv]), p, "not UTF-8")
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "p.json.gz").exists()


def test_a_jsonl_file_with_a_bad_byte_is_one_line(tmp_path, capsys):
    # a scheduler log whose meta line holds a byte that is not UTF-8 (inside "tracestory-serve"): no
    # longer sniffed as a log, so read as a JSON trace, where msgspec raised UnicodeDecodeError
    data = bytearray(SCHED.read_bytes())
    data[data.index(b"tracestory-serve")] = 0xF4
    p = tmp_path / "serve.sched.jsonl"
    p.write_bytes(bytes(data))
    _one_line(capsys, main(["analyze", str(p)]), p, "not UTF-8")


def test_kernels_all_of_zero_ns_are_refused(tmp_path, capsys):
    doc = _doc()
    n = len(_kernels(doc))
    assert n == 120            # the fixture, counted by python json
    for e in _kernels(doc):
        e["dur"] = 0
    p = tmp_path / "zero.trace.json"
    p.write_text(json.dumps(doc))
    _one_line(capsys, main(["analyze", str(p)]), p, "120 kernels, all of 0 ns")


def test_a_rank_with_kernels_all_of_zero_ns_is_refused_by_ranks(tmp_path, capsys):
    d = tmp_path / "tp2"
    shutil.copytree(TP2, d)
    member = d / "torch" / "rank1.trace.json.gz"
    doc = json.loads(gzip.decompress(member.read_bytes()))
    for e in _kernels(doc):
        e["dur"] = 0
    member.write_bytes(gzip.compress(json.dumps(doc).encode()))
    _one_line(capsys, main(["ranks", str(d), "--workers", "1"]), member, "all of 0 ns")


@pytest.mark.parametrize("odd", ["fifo", "folder"])
@pytest.mark.parametrize("command", ["analyze", "ranks"])
def test_a_rank_member_that_is_not_a_file_is_refused_not_skipped(tmp_path, capsys, odd, command):
    # before: the member was skipped; analyze went on with rank 0 alone and said nothing
    d = tmp_path / "tp2"
    shutil.copytree(TP2, d)
    member = d / "torch" / "rank1.trace.json.gz"
    member.unlink()
    os.mkfifo(member) if odd == "fifo" else member.mkdir()
    argv = ["analyze", str(d)] if command == "analyze" else ["ranks", str(d), "--workers", "1"]
    _one_line(capsys, main(argv), member, "FIFO" if odd == "fifo" else "a folder")


def test_a_plain_folder_member_that_is_not_a_file_is_refused(tmp_path, capsys):
    d = tmp_path / "traces"
    d.mkdir()
    shutil.copy(DECODE, d / "a.trace.json.gz")
    os.mkfifo(d / "b.trace.json.gz")
    _one_line(capsys, main(["analyze", str(d)]), d / "b.trace.json.gz", "FIFO")


def test_an_unreadable_manifest_is_one_line(tmp_path, capsys, monkeypatch):
    d = tmp_path / "cap"
    shutil.copytree(TEST_DATA / "telemetry" / "capture_throttled", d)
    manifest = d / "manifest.json"
    real = Path.read_text

    def denied(self, *a, **k):   # root ignores chmod: the error open() gives any other user
        if self == manifest:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", denied)
    _one_line(capsys, main(["analyze", str(d)]), manifest, "permission denied")


def test_an_unclosed_ipv6_url_is_one_line(capsys):
    _one_line(capsys, main(["load", "--model", "m", "--base-url", "http://[::1", "--num-prompts", "1"]),
              "--base-url", "Invalid IPv6 URL")


def _sched_lines() -> list[dict]:
    return [json.loads(ln) for ln in SCHED.read_text().splitlines() if ln.strip()]


def _write_lines(p: Path, lines: list[dict]) -> Path:
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_scheduler_log_times_beyond_int64_are_refused(tmp_path, capsys):
    lines = _sched_lines()
    assert lines[1]["type"] == "arrival"      # the fixture's second line, read by hand
    lines[1]["t_ns"] = 2 ** 70
    p = _write_lines(tmp_path / "serve.sched.jsonl", lines)
    _one_line(capsys, main(["report", str(p), "-o", str(tmp_path / "r.md")]), p, "within int64", str(2 ** 70))
    assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("what", ["arrival", "iteration"])
def test_scheduler_log_written_twice_is_refused(tmp_path, capsys, what):
    lines = _sched_lines()
    again = [x for x in lines if x["type"] == what][:1]
    p = _write_lines(tmp_path / "serve.sched.jsonl", lines + again)
    words = ("arriving twice",) if what == "arrival" else ("written twice",)
    _one_line(capsys, main(["report", str(p), "-o", str(tmp_path / "r.md")]), p, *words)


def test_scheduler_log_iterations_all_of_zero_ns_are_refused(tmp_path, capsys):
    lines = _sched_lines()
    n = 0
    for x in lines:
        if x["type"] == "iteration":
            x["t_end_ns"] = x["t_start_ns"]
            n += 1
    assert n == 4                              # the fixture's iteration lines, counted by hand
    p = _write_lines(tmp_path / "serve.sched.jsonl", lines)
    _one_line(capsys, main(["report", str(p), "-o", str(tmp_path / "r.md")]), p, "4 iterations, all of 0 ns")


TELEMETRY = TEST_DATA / "telemetry" / "capture_throttled" / "torch" / "telemetry.jsonl"
TEL_TRACE = TEST_DATA / "telemetry" / "capture_throttled" / "torch" / "rank0.trace.json"


@pytest.mark.parametrize("value", [2 ** 70, 0])
def test_telemetry_samples_out_of_range_or_at_one_instant_are_stated_on_the_terminal(tmp_path, capsys, value):
    # 2^70 ns overflowed int64 (OverflowError traceback); 0 for every sample put them all at one
    # instant, read without a word
    lines = [json.loads(ln) for ln in TELEMETRY.read_text().splitlines()]
    samples = [x for x in lines if x["type"] == "sample"]
    assert len(samples) == 10                  # the fixture, counted by hand
    for x in samples:
        x["t_unix_ns"] = value
    p = _write_lines(tmp_path / "telemetry.jsonl", lines)
    code = main(["analyze", str(TEL_TRACE), str(p)])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    expect = "10 samples without t_unix_ns" if value else "9 samples not later than the sample before"
    assert any(ln.startswith(f"{p}: warning: ") and expect in ln for ln in err.splitlines()), err


LOAD_SUMMARY = TEST_DATA / "tp_serve_cpu" / "torch" / "load.summary.json"
LOAD_SCHED = TEST_DATA / "tp_serve_cpu" / "torch" / "serve.sched.jsonl"


@pytest.mark.parametrize("key,value", [("ok", 2 ** 70), ("elapsed_ns", -5), ("output_tokens_per_s", -1.5)])
def test_load_summary_numbers_out_of_range_are_refused(tmp_path, capsys, key, value):
    doc = json.loads(LOAD_SUMMARY.read_text())
    assert key in doc["summary"]
    doc["summary"][key] = value
    p = tmp_path / "load.summary.json"
    p.write_text(json.dumps(doc))
    _one_line(capsys, main(["report", str(LOAD_SCHED), str(p), "-o", str(tmp_path / "r.md")]), p, f"summary.{key}")


def test_nsys_kernels_of_zero_ns_are_stated(tmp_path, capsys):
    import sqlite3
    src = TEST_DATA / "nsys_graphs" / "graph_whole.sqlite"
    p = tmp_path / "g.sqlite"
    shutil.copy(src, p)
    con = sqlite3.connect(p)
    n = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    graphs = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()[0]
    con.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start')
    con.commit()
    con.close()
    code = main(["analyze", str(p)])
    err = capsys.readouterr().err
    assert code == 0, err
    # tracestory keeps one row per graph launch among the kernels: n + graphs in all, n of them 0 ns
    assert f"{p}: warning: {n} of {n + graphs} kernels last 0 ns" in err, err


def test_ncu_kernels_of_zero_ns_are_stated(tmp_path, capsys):
    import csv
    import io
    rows = list(csv.reader(io.StringIO(gzip.decompress((TEST_DATA / "ncu" / "triton_rmsnorm_raw.csv.gz").read_bytes())
                                       .decode())))
    col = rows[0].index("gpu__time_duration.sum")
    assert len(rows) == 3 and rows[1][col] == "us" and rows[2][col] == "31.200000"   # header, units, 1 kernel
    rows[2][col] = "0"
    p = tmp_path / "raw.csv"
    with p.open("w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
    code = main(["analyze", str(p)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"{p}: warning: 1 of 1 kernels with a duration of 0 ns" in err, err


@pytest.mark.parametrize("target", ["", "out/"])
@pytest.mark.parametrize("command", ["report --json", "report --html", "report -o", "categories -o", "export -o",
                                     "compare --json", "ranks -o"])
def test_an_empty_output_name_or_a_folder_path_is_refused(tmp_path, capsys, monkeypatch, target, command):
    # before: "" was taken as "no output" (exit 0, nothing written), "out/" wrote a file named "out"
    monkeypatch.chdir(tmp_path)
    cmd, flag = command.split()
    argv = {"report": ["report", DECODE], "categories": ["categories", DECODE],
            "export": ["export", "perfetto", DECODE], "compare": ["compare", DECODE, DECODE],
            "ranks": ["ranks", TP2, "--workers", "1"]}[cmd]
    argv = [*argv, flag, target] + (["-o", "r.md"] if cmd == "report" and flag != "-o" else [])
    _one_line(capsys, main([str(a) for a in argv]), flag, "an empty name" if not target else "a folder path")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing written"


def test_demo_with_an_empty_output_folder_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line(capsys, main(["demo", "--output-dir", ""]), "--output-dir", "an empty name")
    assert list(tmp_path.iterdir()) == []


def _finished(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if line.strip() and json.loads(line).get("type") == "finish")


@pytest.mark.parametrize("sent, ok", [(0, 0), (40, 40)])
def test_a_load_summary_not_of_the_logs_run_is_stated(tmp_path, capsys, sent, ok):
    # the CPU TP capture's log finished 23 requests (counted below) and its summary sent 23, ok 23:
    # a summary that sent none, or that counts 40 successes, cannot be of that run
    src = TEST_DATA / "tp_serve_cpu" / "torch"
    assert _finished(src / "serve.sched.jsonl") == 23
    doc = json.loads((src / "load.summary.json").read_text())
    assert (doc["summary"]["sent"], doc["summary"]["ok"]) == (23, 23)
    doc["summary"].update(sent=sent, ok=ok, failed=0)
    (tmp_path / "load.summary.json").write_text(json.dumps(doc))
    code = main(["report", str(src / "serve.sched.jsonl"), str(tmp_path / "load.summary.json"),
                 "-o", str(tmp_path / "r.md"), "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 0
    assert "load.summary.json: warning: the load summary" in err and "not of the same run" in err
    lims = json.loads((tmp_path / "r.json").read_text())["limitations"]
    assert any("not of the same run" in str(x) for x in lims)


def test_the_load_summary_of_the_logs_own_run_gives_no_warning(tmp_path, capsys):
    src = TEST_DATA / "tp_serve_cpu" / "torch"
    code = main(["report", str(src / "serve.sched.jsonl"), str(src / "load.summary.json"),
                 "-o", str(tmp_path / "r.md")])
    assert code == 0 and "warning" not in capsys.readouterr().err
