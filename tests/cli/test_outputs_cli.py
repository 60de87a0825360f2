"""Every command's outputs go through one boundary: an output never overwrites an input (by
name, through a hardlink or symlink, or as a member of an input folder), '-' is standard output,
and a write error is one line with exit 2, leaving no partial file."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import H100_BERT, TEST_DATA

from tracestory.cli import main


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "bert.json.gz"
    shutil.copy(H100_BERT, p)
    return p


def _refused(code, err, path):
    lines = [line for line in err.splitlines() if line.strip()]
    return code == 2 and len(lines) == 1 and str(path) in lines[0]


def test_html_output_naming_the_input_is_refused_before_anything_is_written(capsys, tmp_path, trace):
    before = trace.read_bytes()
    code, _, err = _run(capsys, "report", trace, "-o", tmp_path / "r.md", "--html", trace)
    assert _refused(code, err, trace) and trace.read_bytes() == before
    assert not (tmp_path / "r.md").exists()


def test_categories_and_check_refuse_their_inputs(capsys, tmp_path, trace):
    before = trace.read_bytes()
    code, _, err = _run(capsys, "categories", trace, "-o", trace)
    assert _refused(code, err, trace) and trace.read_bytes() == before
    report = tmp_path / "r.md"
    assert _run(capsys, "report", trace, "-o", report)[0] == 0
    text = report.read_text()
    code, _, err = _run(capsys, "check", report, "--json", report)
    assert _refused(code, err, report) and report.read_text() == text


def test_output_inside_an_input_folder_and_hardlink_aliases(capsys, tmp_path):
    folder = tmp_path / "tp2"
    shutil.copytree(TEST_DATA / "multigpu" / "tp2_uneven", folder)
    member = next(p for p in folder.rglob("*.json.gz"))
    before = member.read_bytes()
    code, _, err = _run(capsys, "export", "perfetto", folder, "-o", member)
    assert _refused(code, err, member) and member.read_bytes() == before
    alias = tmp_path / "alias.json.gz"
    os.link(member, alias)
    code, _, err = _run(capsys, "report", folder, "-o", tmp_path / "r.md", "--json", alias)
    assert _refused(code, err, alias) and member.read_bytes() == before


def test_dash_is_standard_output(capsys, trace):
    code, out, err = _run(capsys, "report", trace, "-o", "-")
    assert code == 0 and out.startswith("# ") and "## Executive Summary" in out
    code, out, err = _run(capsys, "categories", trace, "-o", "-")
    assert code == 0 and json.loads(out)["categories"] and "category" in err   # the table went to stderr


def test_write_error_is_one_line_and_leaves_the_old_file(capsys, tmp_path, trace):
    # A folder given as the output file, and a missing parent that is a file.
    code, _, err = _run(capsys, "report", trace, "-o", tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = _run(capsys, "report", trace, "-o", blocker / "r.md")
    assert code == 2 and len(err.strip().splitlines()) == 1 and blocker.read_text() == "x"
    # /dev/full: the write fails; nothing else is touched.
    if os.path.exists("/dev/full"):
        code, _, err = _run(capsys, "report", trace, "-o", tmp_path / "r.md", "--json", "/dev/full")
        assert code == 2 and len(err.strip().splitlines()) == 1
