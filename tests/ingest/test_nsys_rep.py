"""export_nsys_rep: reuse of a fresh export, the ToolNotFound hint, and the nsys argv (nsys is
not installed here: a stand-in script named nsys on PATH records its argv and writes a copy of
a real export)."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
from conftest import NSYS_2022

from tracestory.errors import ToolNotFound, TraceFormatError
from tracestory.ingest.nsys_rep import export_nsys_rep


def test_without_nsys_the_hint_says_the_command(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really a report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ToolNotFound) as e:
        export_nsys_rep(rep)
    msg = str(e.value)
    assert f"nsys export --type sqlite --force-overwrite true --output {tmp_path / 'run.sqlite'} {rep}" in msg


def test_fresh_export_is_reused(tmp_path, monkeypatch):
    rep = tmp_path / "run.qdrep"
    rep.write_bytes(b"x")
    out = tmp_path / "run.sqlite"
    shutil.copy(NSYS_2022, out)
    os.utime(rep, (1000, 1000))  # report older than the export
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert export_nsys_rep(rep) == out


def _fake_nsys(tmp_path, body):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nsys"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_stale_export_is_redone_with_nsys(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"x")
    log = tmp_path / "argv.txt"
    bindir = _fake_nsys(tmp_path, f'echo "$@" > {log}\n{shutil.which("cp")} {NSYS_2022} "$7"\n')
    monkeypatch.setenv("PATH", str(bindir))
    out = export_nsys_rep(rep)
    assert out == tmp_path / "run.sqlite" and out.read_bytes()[:15] == b"SQLite format 3"
    assert log.read_text().split() == ["export", "--type", "sqlite", "--force-overwrite", "true",
                                       "--output", str(out), str(rep)]


def test_failing_nsys(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"x")
    monkeypatch.setenv("PATH", str(_fake_nsys(tmp_path, 'echo "bad report" >&2\nexit 3\n')))
    with pytest.raises(TraceFormatError, match="exit code 3: bad report"):
        export_nsys_rep(rep)
