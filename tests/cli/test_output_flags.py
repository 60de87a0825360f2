"""Every output flag of every command against one boundary (tracestory.outputs):

* the overwrite guard knows every input: the traces, ``--rules`` and ``--peaks`` files, and every
  other output of the same command (``-o r.md --json r.md``, two ``-``);
* ``-`` is standard output in every output flag, and then stdout carries that data only (the
  status text goes to stderr); no file named ``-`` is ever written;
* a command with several outputs writes all of them or none;
* the last tracebacks of the re-audit are one line and exit 2.

The flags that take ``-`` (each exercised below unless said otherwise; ``serve --event-log -`` is
refused: the server prints its status lines on stdout): ``analyze -o``,
``analyze --json``, ``report -o``, ``report --json``, ``report --html``, ``categories -o``,
``check --json``, ``compare -o``, ``compare --json``, ``ranks -o``, ``ranks --json``,
``export perfetto -o``, ``load --json``, ``load --output``; ``load --save-result
--result-filename -``, ``bench --json``, ``bench --profile torch --profile-out -`` and ``eval ppl
--json`` (through the same :func:`tracestory.outputs.prints_to_stderr`; not run here: the first
was tried by hand, the others need torch workloads or a checkpoint).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import H100_BERT, H200_LLAMA, TEST_DATA

from tracestory.cli import main

TP2 = TEST_DATA / "multigpu" / "tp2_uneven"


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(code, err, *words):
    lines = [line for line in err.splitlines() if line.strip()]
    return code == 2 and len(lines) == 1 and all(str(w) in lines[0] for w in words)


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "bert.json.gz"
    shutil.copy(H100_BERT, p)
    return p


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    d = tmp_path / "cwd"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


# ------------------------------------------------------------------ the guard knows every input
RULES = '[[rule]]\ncategory = "gemm"\npattern = "zzz_never"\n'
PEAKS = 'dram_bytes_per_s = 3.0e12\n[flops_per_s]\nbf16 = 9.0e14\n'


@pytest.mark.parametrize("argv", [
    ("report", "{trace}", "-o", "{d}/r.md", "--rules", "{side}", "--json", "{side}"),
    ("report", "{trace}", "-o", "{d}/r.md", "--peaks", "{side}", "--html", "{side}"),
    ("report", "{trace}", "-o", "{side}", "--peaks", "{side}"),
    ("analyze", "{trace}", "--rules", "{side}", "--json", "{side}"),
    ("analyze", "{trace}", "--peaks", "{side}", "--format", "json", "-o", "{side}"),
    ("categories", "{trace}", "--rules", "{side}", "-o", "{side}"),
    ("compare", "{trace}", "{trace}", "--rules", "{side}", "--json", "{side}"),
    ("export", "perfetto", "{trace}", "--rules", "{side}", "-o", "{side}"),
], ids=lambda a: " ".join(a[:1] + a[3:]))
def test_rules_and_peaks_files_are_inputs(argv, capsys, tmp_path, trace):
    side = tmp_path / "side.toml"
    text = PEAKS if "--peaks" in argv else RULES
    side.write_text(text)
    words = [w.format(trace=trace, d=tmp_path, side=side) for w in argv]
    code, _, err = _run(capsys, *words)
    assert _refused(code, err, side, "input") and side.read_text() == text
    assert not (tmp_path / "r.md").exists()


def test_a_file_a_glob_matches_is_an_input(capsys, tmp_path):
    for p in (TP2 / "torch").glob("*.json.gz"):
        shutil.copy(p, tmp_path / p.name)
    member = tmp_path / "rank1.trace.json.gz"
    before = member.read_bytes()
    code, _, err = _run(capsys, "ranks", str(tmp_path / "*.json.gz"), "--workers", "1", "--json", member)
    assert _refused(code, err, member, "input") and member.read_bytes() == before


@pytest.mark.parametrize("argv", [
    ("report", "{trace}", "-o", "{d}/r.md", "--json", "{d}/r.md"),
    ("report", "{trace}", "-o", "{d}/r.md", "--html", "{d}/r.md"),
    ("report", "{trace}", "-o", "{d}/r.md", "--json", "{d}/./r.md"),
    ("analyze", "{trace}", "--format", "json", "-o", "{d}/r.md", "--json", "{d}/r.md"),
    ("compare", "{trace}", "{trace}", "-o", "{d}/r.md", "--json", "{d}/r.md"),
    ("ranks", str(TP2), "-o", "{d}/r.md", "--json", "{d}/r.md", "--workers", "1"),
], ids=lambda a: a[0] + " " + a[-3 if a[0] == "ranks" else -2])
def test_two_flags_naming_one_file_are_refused(argv, capsys, tmp_path, trace):
    words = [w.format(trace=trace, d=tmp_path) for w in argv]
    code, _, err = _run(capsys, *words)
    assert _refused(code, err, "r.md", "same file") and not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("argv", [
    ("report", "{trace}", "-o", "-", "--json", "-"),
    ("compare", "{trace}", "{trace}", "-o", "-", "--json", "-"),
    ("ranks", str(TP2), "-o", "-", "--json", "-", "--workers", "1"),
], ids=lambda a: a[0])
def test_two_flags_on_stdout_are_refused(argv, capsys, trace):
    code, out, err = _run(capsys, *[w.format(trace=trace) for w in argv])
    assert _refused(code, err, "standard output") and out == ""


# ------------------------------------------------------------------ '-' is stdout, data only
def test_export_perfetto_to_stdout(capsys, cwd, trace):
    code, out, err = _run(capsys, "export", "perfetto", trace, "-o", "-")
    doc = json.loads(out)   # stdout is the JSON and nothing else
    names = {e.get("name") for e in doc["traceEvents"]}
    raw = json.loads(gzip.decompress(trace.read_bytes()))
    kernels = {e["name"] for e in raw["traceEvents"] if e.get("cat") == "kernel"}
    assert code == 0 and kernels <= names and "wrote -" in err and list(cwd.iterdir()) == []


def test_report_json_and_html_to_stdout(capsys, cwd, tmp_path, trace):
    code, out, err = _run(capsys, "report", trace, "-o", tmp_path / "r.md", "--json", "-")
    doc = json.loads(out)
    assert code == 0 and str(tmp_path / "r.md") in err and (tmp_path / "r.md").exists()
    assert doc["traces"][0]["source"]["path"] == str(trace)
    code, out, err = _run(capsys, "report", trace, "-o", tmp_path / "s.md", "--html", "-")
    assert code == 0 and out.startswith("<!DOCTYPE html>") and str(tmp_path / "s.md") in err
    assert list(cwd.iterdir()) == []


def test_check_json_to_stdout(capsys, tmp_path, trace):
    report = tmp_path / "r.md"
    assert _run(capsys, "report", trace, "-o", report)[0] == 0
    code, out, err = _run(capsys, "check", report, "--json", "-")
    items = json.loads(out)   # the checklist text went to stderr
    assert code in (0, 1) and len(items) == 1 and ("PASS" in err or "FAIL" in err)


def test_compare_outputs_to_stdout(capsys, trace):
    code, out, err = _run(capsys, "compare", trace, H200_LLAMA, "--json", "-")
    doc = json.loads(out)
    assert code == 0 and doc and "wrote" not in out
    code, out, err = _run(capsys, "compare", trace, H200_LLAMA, "-o", "-")
    assert code == 0 and out.startswith("#") and not out.lstrip("#").startswith("{")


def test_ranks_outputs_to_stdout(capsys, cwd):
    code, out, err = _run(capsys, "ranks", TP2, "--json", "-", "--workers", "1")
    doc = json.loads(out)
    assert code == 0 and "2 ranks" in err and doc
    code, out, err = _run(capsys, "ranks", TP2, "-o", "-", "--workers", "1")
    assert code == 0 and out.startswith("# Multi-GPU analysis: 2 ranks") and list(cwd.iterdir()) == []


def _load(cwd, *words):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}"   # bound, not listening: refused
    try:
        return subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--base-url", url, "--model", "org/m",
                               "--num-prompts", "2", "--max-concurrency", "1", "--no-progress", *words],
                              cwd=cwd, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    finally:
        port.close()


def test_load_json_and_output_to_stdout(tmp_path):
    p = _load(tmp_path, "--json", "-")
    doc = json.loads(p.stdout)   # the result block went to stderr
    assert p.returncode == 1 and doc["summary"]["failed"] == 2 and "Serving Benchmark Result" in p.stderr
    p = _load(tmp_path, "--output", "-")
    records = [json.loads(line) for line in p.stdout.splitlines()]
    assert p.returncode == 1 and len(records) == 2 and all(r["error"] for r in records)
    assert list(tmp_path.iterdir()) == []   # no file named '-', no telemetry beside it


def test_serve_event_log_dash_is_refused(capsys, cwd):
    """The server's stdout carries its status lines: its event log cannot share it."""
    code, out, err = _run(capsys, "serve", "--event-log", "-")
    assert _refused(code, err, "--event-log", "'-'") and out == "" and list(cwd.iterdir()) == []


# ------------------------------------------------------------------ all or nothing
def test_report_set_is_all_or_nothing(capsys, tmp_path, trace):
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.md").write_text("old report\n")
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    # the Markdown is written first, then the JSON fails (its folder is a file)
    code, _, err = _run(capsys, "report", trace, "-o", out / "r.md", "--json", blocker / "a.json")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (out / "r.md").read_text() == "old report\n" and sorted(p.name for p in out.iterdir()) == ["r.md"]
    code, _, err = _run(capsys, "report", trace, "-o", out / "r.md", "--json", out / "a.json", "--html", "--plots")
    names = sorted(p.name for p in out.iterdir())
    pngs = [n for n in names if n.endswith(".png")]
    assert code == 0 and [n for n in names if not n.endswith(".png")] == ["a.json", "r.html", "r.md"] and pngs
    # the page was rendered while the set was staged: every plot is embedded from there
    assert (out / "r.html").read_text().count("data:image/png;base64,") == len(pngs)


# ------------------------------------------------------------------ tracebacks, now one line
def test_missing_peaks_and_rules_files(capsys, trace, tmp_path):
    for flag in ("--peaks", "--rules"):
        code, _, err = _run(capsys, "analyze", trace, flag, "/missing.toml")
        assert _refused(code, err, "/missing.toml", flag)
        code, _, err = _run(capsys, "report", trace, "-o", tmp_path / "r.md", flag, tmp_path)
        assert _refused(code, err, tmp_path, "a folder")
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(17 << 20)   # a settings file is a few KB: 17 MiB is refused before it is decoded
    code, _, err = _run(capsys, "analyze", trace, "--peaks", big)
    assert _refused(code, err, big, "at most 16 MiB")


def test_demo_output_dir_that_cannot_be_a_folder(capsys, tmp_path):
    f = tmp_path / "FILE"
    f.write_text("x")
    code, _, err = _run(capsys, "demo", "--output-dir", f)
    assert _refused(code, err, f, "a folder") and f.read_text() == "x"
    code, _, err = _run(capsys, "demo", "--output-dir", "/proc/tracestory-demo")
    assert _refused(code, err, "/proc/tracestory-demo")


def test_full_stdout_is_one_line(trace):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "tracestory.cli", "analyze", str(trace)], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "no space left" in lines[0], p.stderr


def _kineto(tmp_path, name, kernel_args):
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": 5, "grid": [1, 1, 1], "block": [1, 1, 1], **kernel_args}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 8, "dur": 1,
         "args": {"correlation": kernel_args.get("correlation", 5)}},
    ]
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events}))
    return p


@pytest.mark.parametrize("args", [{"correlation": 2 ** 64}, {"grid": [2 ** 40, 1, 1]}, {"block": [2 ** 64, 1, 1]}],
                         ids=["correlation 2^64", "grid 2^40", "block 2^64"])
def test_out_of_range_integers_are_one_line(args, capsys, tmp_path):
    p = _kineto(tmp_path, "big.json", args)
    code, _, err = _run(capsys, "analyze", p)
    assert _refused(code, err, p, "out of range")
