"""Damaged inputs through the command line: every case ends either in exit code 2 with exactly
one stderr line naming the file, or in exit code 0 with the numbers a direct reading of the file
gives (the csv module, sqlite3 or the ncu-report binding, never tracestory's readers) and, where
anything of the undamaged file is missing, the damage stated.

The damaged files are made here, from the repository's fixtures: truncations at fixed fractions,
bit flips from fixed random draws, odd values written with SQL or into CSV cells, damaged SQLite pages,
damaged gzip streams, special files. Each case's outcome is tallied per class; with
``TRACESTORY_RELIABILITY_TALLY=FILE`` the tally is written there as JSON.

Oracles
-------
* "undamaged" numbers come from a direct reading of the pristine fixture;
* for a truncation, the kernels loaded must be a subset of the undamaged ones with equal values,
  and fewer than those only with a warning;
* for a bit flip or an odd value, the numbers must equal the undamaged ones, or come with a
  warning, or equal a direct reading of the damaged file whose rows and cells are laid out as
  the undamaged file's (a digit changed inside a value: the file's own number, which no format
  here can check).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest
from conftest import NCU_DETAILS, NCU_RAW, NCU_REP, NSYS_2022, NSYS_2024, TEST_DATA

from tracestory.cli import main

FIELD_NSYS = TEST_DATA / "field" / "extra-p_extrap__a100_exgpu_s10_old_nsys.sqlite"
NCU_DIR = TEST_DATA / "ncu"
NSYS_CSV_DIR = TEST_DATA / "nsys"
SQLITES = (NSYS_2022, NSYS_2024, FIELD_NSYS)
NCU_CSVS = (NCU_DETAILS, NCU_RAW, NCU_DIR / "sdpa_flash_details.csv.gz", NCU_DIR / "triton_rmsnorm_raw.csv.gz")
NCU_REPS = (NCU_REP, NCU_DIR / "triton_rmsnorm.ncu-rep.gz")
NSYS_CSVS = tuple(sorted(NSYS_CSV_DIR.glob("*.csv")))
CUTS = (0.1, 0.3, 0.5, 0.7, 0.9, 0.99)
DRAWS = range(6)  # random.Random(draw): the same damage on every run
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
OVERFLOW_NS = 1 << 62

TALLY: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def _tally():
    yield
    out = os.environ.get("TRACESTORY_RELIABILITY_TALLY")
    if out:
        rows = {}
        for (cls, outcome), n in sorted(TALLY.items()):
            rows.setdefault(cls, {})[outcome] = n
        Path(out).write_text(json.dumps(rows, indent=1) + "\n")


# ----------------------------------------------------------------------------- running
def _plain(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _flip(data: bytes, draw: int, count: int = 16, start: int = 0) -> bytes:
    rng = random.Random(draw)
    b = bytearray(data)
    for _ in range(count):
        i = rng.randrange(start, len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


class Run:
    """One CLI run: exit code, stderr lines, the reader's warnings, the JSON document."""

    def __init__(self, code: int, err: list[str], warnings: list[str], doc: dict | None):
        self.code, self.err, self.warnings, self.doc = code, err, warnings, doc


def run_cli(capsys, caplog, tmp_path, command: str, path: Path) -> Run:
    caplog.set_level(logging.WARNING, logger="tracestory.ingest")
    caplog.clear()
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    if command == "analyze":
        args = ["analyze", str(path), "--json", str(out)]
    else:
        args = ["report", str(path), "-o", str(tmp_path / "report.md"), "--json", str(out)]
    capsys.readouterr()
    code = main(args)
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    warnings = [r.getMessage() for r in caplog.records if r.name == "tracestory.ingest"]
    assert code in (0, 2), (code, err)
    if code == 2:
        assert len(lines) == 1 and str(path) in lines[0], err
        return Run(code, lines, warnings, None)
    assert all(str(path) in w for w in warnings), warnings
    return Run(code, lines, warnings, json.loads(out.read_text()))


def _trace_warnings(doc: dict) -> list[str]:
    out = []
    for t in doc["traces"]:
        src = t["source"]
        out += list(src.get("warnings") or ()) + list((src.get("extra") or {}).get("warnings") or ())
    return out


def settle(cls: str, run: Run, loaded, undamaged, as_written=None, truncated: bool = False) -> None:
    """The case's verdict (see the module docstring), tallied under ``cls``."""
    if run.code == 2:
        TALLY[cls, "refused (exit 2, one line)"] += 1
        return
    if truncated:
        assert loaded <= undamaged, (loaded, undamaged)
        if loaded != undamaged:
            assert run.warnings, "kernels missing without a warning"
            TALLY[cls, "loaded, damage stated"] += 1
        else:
            TALLY[cls, "loaded, complete"] += 1
        return
    if loaded == undamaged:
        TALLY[cls, "loaded, damage stated" if run.warnings else "loaded, undamaged numbers"] += 1
    elif run.warnings:
        TALLY[cls, "loaded, damage stated"] += 1
    else:
        assert as_written is not None and loaded == as_written, (loaded, as_written, undamaged)
        TALLY[cls, "loaded, a value changed inside a cell, read as written"] += 1


# ----------------------------------------------------------------------- direct readings
def sql_kernels(path: Path) -> Counter | None:
    """(name, duration) multiset of the kernels with possible times, by sqlite3 alone; None
    when SQLite cannot read the kernel table."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        rows = con.execute(f'SELECT s.value, k."end" - k.start FROM {KERNEL} k LEFT JOIN StringIds s '
                           f'ON s.id = k.demangledName WHERE k.start >= 0 AND k."end" >= k.start '
                           f'AND k."end" < {OVERFLOW_NS}').fetchall()
        con.close()
    except sqlite3.Error:
        return None
    return Counter(rows)


def json_kernel_count_time(doc: dict) -> tuple[int, int]:
    return (sum(t["gpu"]["kernel_count"] for t in doc["traces"]),
            sum(t["gpu"]["kernel_time_ns"] for t in doc["traces"]))


def _count_time(c: Counter | None) -> tuple[int, int] | None:
    return None if c is None else (sum(c.values()), sum(d * n for (_, d), n in c.items()))


_SCALE = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


def ncu_csv_durations(text: str) -> dict[int, int] | None:
    """{kernel ID: duration ns} of an ncu CSV by the csv module alone; None when unreadable."""
    try:
        start = text.index('"ID","Process ID"')
        rows = list(csv.reader(io.StringIO(text[start:])))
        h = rows[0]
        if "Metric Name" in h:
            i, s, n, u, v = (h.index(c) for c in ("ID", "Section Name", "Metric Name", "Metric Unit", "Metric Value"))
            # metric rows stop after their value: no empty rule cells (fewer cells than the header)
            return {int(r[i]): round(float(r[v].replace(",", "")) * _SCALE[r[u]]) for r in rows[1:]
                    if len(r) > v and r[s] == "GPU Speed Of Light Throughput" and r[n] == "Duration"}
        i, d = h.index("ID"), h.index("gpu__time_duration.sum")
        unit = rows[1][d]
        return {int(r[i]): round(float(r[d].replace(",", "")) * _SCALE[unit]) for r in rows[2:] if len(r) == len(h)}
    except (ValueError, KeyError, IndexError, csv.Error):
        return None


def _layout(text: str) -> list[int] | None:
    try:
        return [len(r) for r in csv.reader(io.StringIO(text))]
    except csv.Error:
        return None


def json_ncu(doc: dict) -> dict[int, int]:
    return {k["id"]: k["duration_ns"] for k in doc["kernels"]}


def rep_actions(path: Path) -> list[tuple[str, int]] | None:
    """(name, duration ns) of every action with a name and a duration, by the ncu-report
    binding alone; None when it cannot load the file."""
    import ncu_report as nr

    try:
        ctx = nr.load_report(str(path))
        out = []
        for ri in range(ctx.num_ranges()):
            rng = ctx.range_by_idx(ri)
            for ai in range(rng.num_actions()):
                a = rng.action_by_idx(ai)
                name = a.name(nr.IAction.NameBase_DEMANGLED)
                m = a.metric_by_name("gpu__time_duration.sum") if name else None
                if name and m is not None and m.has_value():
                    scale = _SCALE.get(m.unit() or "ns", 1)
                    out.append((name, round(m.as_double() * scale)))
        return out
    except Exception:  # noqa: BLE001 - the binding raises plain exceptions on bad files
        return None


def json_rep(doc: dict) -> list[tuple[str, int]]:
    return [(k["name"], k["duration_ns"]) for k in doc["kernels"]]


# ---------------------------------------------------------------------- nsys SQLite
@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("fixture", SQLITES, ids=lambda p: p.name[:12])
def test_sqlite_truncated(fixture, cut, tmp_path, capsys, caplog):
    data = fixture.read_bytes()
    p = tmp_path / "cut.sqlite"
    p.write_bytes(data[:int(len(data) * cut)])
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    loaded = json_kernel_count_time(r.doc) if r.code == 0 else None
    undamaged = _count_time(sql_kernels(fixture))
    if r.code == 0:
        assert loaded == undamaged and not r.warnings  # nothing of what is read may be lost
    settle("nsys SQLite: truncated", r, loaded, undamaged)


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize("fixture", SQLITES, ids=lambda p: p.name[:12])
def test_sqlite_bit_flips(fixture, draw, tmp_path, capsys, caplog):
    p = tmp_path / "flip.sqlite"
    p.write_bytes(_flip(fixture.read_bytes(), draw, start=100))
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    loaded = json_kernel_count_time(r.doc) if r.code == 0 else None
    settle("nsys SQLite: bit flips", r, loaded, _count_time(sql_kernels(fixture)), _count_time(sql_kernels(p)))


@pytest.mark.parametrize("draw", range(4))
@pytest.mark.parametrize("fixture", SQLITES, ids=lambda p: p.name[:12])
def test_sqlite_page_overwritten(fixture, draw, tmp_path, capsys, caplog):
    data = bytearray(fixture.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    rng = random.Random(draw)
    n = rng.randrange(1, len(data) // page)
    data[n * page:(n + 1) * page] = rng.randbytes(page)
    p = tmp_path / "page.sqlite"
    p.write_bytes(data)
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    loaded = json_kernel_count_time(r.doc) if r.code == 0 else None
    settle("nsys SQLite: damaged page", r, loaded, _count_time(sql_kernels(fixture)), _count_time(sql_kernels(p)))


ODD_SQL = {
    "end before start": f'UPDATE {KERNEL} SET "end" = start - 100 WHERE rowid % 5 = 0',
    "overflowing end": f'UPDATE {KERNEL} SET "end" = 9223372036854775807 WHERE rowid % 7 = 0',
    "negative start": f"UPDATE {KERNEL} SET start = -5 WHERE rowid % 3 = 0",
    "every end before start": f'UPDATE {KERNEL} SET "end" = start - 1',
    "text time": f"UPDATE {KERNEL} SET start = 'abc' WHERE rowid = 2",
    "fractional time": f'UPDATE {KERNEL} SET "end" = "end" + 0.5 WHERE rowid = 2',
    "no end column": f'ALTER TABLE {KERNEL} DROP COLUMN "end"',
    "undecodable name": f"UPDATE StringIds SET value = x'fffe00' WHERE id IN (SELECT demangledName FROM {KERNEL})",
    "numeric name": f"UPDATE StringIds SET value = 12345 WHERE id IN (SELECT demangledName FROM {KERNEL})",
    "no StringIds": "DROP TABLE StringIds",
}


@pytest.mark.parametrize("case", ODD_SQL)
@pytest.mark.parametrize("fixture", (NSYS_2022, NSYS_2024), ids=lambda p: p.name[:12])
def test_sqlite_odd_values(fixture, case, tmp_path, capsys, caplog):
    p = tmp_path / "odd.sqlite"
    shutil.copy(fixture, p)
    con = sqlite3.connect(p)
    for (view,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        con.execute(f'DROP VIEW "{view}"')  # views naming the column would block the DROP COLUMN
    con.execute(ODD_SQL[case])
    con.commit()
    con.close()
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    undamaged = _count_time(sql_kernels(fixture))
    if case in ("end before start", "overflowing end", "negative start"):
        assert r.code == 0
        expected = _count_time(sql_kernels(p))  # the rows with possible times, by SQL
        assert json_kernel_count_time(r.doc) == expected != undamaged
        assert any("rows dropped" in w for w in _trace_warnings(r.doc)) and r.warnings
    elif case in ("every end before start", "text time", "fractional time", "no end column"):
        assert r.code == 2
    else:  # names damaged, times intact: the times are still right
        assert r.code == 0 and json_kernel_count_time(r.doc) == undamaged
        if case == "no StringIds":
            assert any("not in StringIds (no StringIds table)" in w for w in _trace_warnings(r.doc))
    loaded = json_kernel_count_time(r.doc) if r.code == 0 else None
    settle("nsys SQLite: odd values", r, loaded, undamaged, _count_time(sql_kernels(p)))


# ---------------------------------------------------------------------- nsys stats CSV
def nsys_csv_numbers(text: str) -> tuple[int, int] | None:
    """(kernel count, kernel time ns) of an nsys stats CSV by the csv module alone: timeline
    rows not named ``[CUDA mem...`` (count 1, their duration) or summary rows (Instances, Total
    Time); None for a file without such a table."""
    rows = list(csv.reader(io.StringIO(text)))
    for i, h in enumerate(rows):
        if "Duration (ns)" in h and "Name" in h:
            d, n = h.index("Duration (ns)"), h.index("Name")
            body = [r for r in rows[i + 1:] if len(r) == len(h) and not r[n].startswith("[CUDA mem")]
            return len(body), sum(int(r[d]) for r in body)
        if "Total Time (ns)" in h and "Instances" in h and "Range" not in h and "Style" not in h:
            t, c = h.index("Total Time (ns)"), h.index("Instances")
            body = [r for r in rows[i + 1:] if len(r) == len(h)]
            return sum(int(r[c]) for r in body), sum(int(r[t]) for r in body)
    return None


KERNEL_CSVS = tuple(p for p in NSYS_CSVS if nsys_csv_numbers(p.read_text()) is not None)


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("fixture", NSYS_CSVS, ids=lambda p: p.name)
def test_nsys_csv_truncated(fixture, cut, tmp_path, capsys, caplog):
    data = fixture.read_bytes()
    p = tmp_path / "cut.csv"
    p.write_bytes(data[:int(len(data) * cut)])
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    if r.code == 0:
        assert r.warnings and _trace_warnings(r.doc)  # every cut here falls inside a row
    TALLY["nsys stats CSV: truncated", "refused (exit 2, one line)" if r.code else "loaded, damage stated"] += 1


def _with_cell(text: str, header_cell: str, row: int, value: str) -> str:
    """``text`` with the cell under ``header_cell`` of data row ``row`` (0-based) replaced."""
    rows = list(csv.reader(io.StringIO(text)))
    i = next(k for k, r in enumerate(rows) if header_cell in r)
    rows[i + 1 + row][rows[i].index(header_cell)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


ODD_CSV = [
    ("cuda_gpu_trace_2024.csv", "Duration (ns)", 1, "-300", "drop"),
    ("cuda_gpu_trace_2024.csv", "Duration (ns)", 1, "1e30", "drop"),
    ("cuda_gpu_trace_2024.csv", "Start (ns)", 1, "", "drop"),
    ("gputrace_legacy.csv", "Duration (ns)", 1, "-60", "drop"),
    ("cuda_gpu_kern_sum.csv", "Total Time (ns)", 0, "-1000", "drop"),
    ("cuda_gpu_kern_sum.csv", "Instances", 1, "0", "drop"),
    ("cuda_gpu_kern_sum.csv", "Total Time (ns)", 0, "9000", "stated"),   # Avg x Instances disagrees
    ("cuda_gpu_kern_sum.csv", "Time (%)", 2, "1.0", "stated"),           # Time (%) sums to 91
    ("cuda_gpu_kern_sum.csv", "Total Time (ns)", 0, "1,0x0", "refuse"),
    ("gpukernsum_2022.4.csv", "Instances", 0, "-4", "drop"),
]


@pytest.mark.parametrize("name,cell,row,value,expect", ODD_CSV, ids=[f"{a}-{b}-{d}" for a, b, _, d, _ in ODD_CSV])
def test_nsys_csv_odd_values(name, cell, row, value, expect, tmp_path, capsys, caplog):
    text = _with_cell((NSYS_CSV_DIR / name).read_text(), cell, row, value)
    p = tmp_path / name
    p.write_text(text)
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    if expect == "refuse":
        assert r.code == 2
    else:
        assert r.code == 0 and r.warnings and _trace_warnings(r.doc)
        count, time_ns = json_kernel_count_time(r.doc)
        if expect == "drop":  # the damaged row is not counted: the file's other rows, read directly
            pristine = list(csv.reader(io.StringIO(text)))
            hdr = next(k for k, rr in enumerate(pristine) if cell in rr)
            del pristine[hdr + 1 + row]
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(pristine)
            assert (count, time_ns) == nsys_csv_numbers(buf.getvalue())
        else:
            assert (count, time_ns) == nsys_csv_numbers(text)
    TALLY["nsys stats CSV: odd values", "refused (exit 2, one line)" if r.code else "loaded, damage stated"] += 1


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize("fixture", KERNEL_CSVS, ids=lambda p: p.name)
def test_nsys_csv_bit_flips(fixture, draw, tmp_path, capsys, caplog):
    text = fixture.read_bytes()
    damaged = _flip(text, draw, count=3)
    p = tmp_path / "flip.csv"
    p.write_bytes(damaged)
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    loaded = json_kernel_count_time(r.doc) if r.code == 0 else None
    d_text = damaged.decode("utf-8", "replace")
    as_written = None
    if _layout(d_text) == _layout(text.decode()):
        try:
            as_written = nsys_csv_numbers(d_text)
        except ValueError:
            as_written = None
    settle("nsys stats CSV: bit flips", r, loaded, nsys_csv_numbers(text.decode()), as_written)


# ---------------------------------------------------------------------- ncu CSV
@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("fixture", NCU_CSVS, ids=lambda p: p.name)
def test_ncu_csv_truncated(fixture, cut, tmp_path, capsys, caplog):
    data = _plain(fixture)
    p = tmp_path / ("cut_" + fixture.name.removesuffix(".gz"))
    p.write_bytes(data[:int(len(data) * cut)])
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    undamaged = ncu_csv_durations(data.decode())
    loaded = json_ncu(r.doc) if r.code == 0 else None
    if r.code == 0:
        assert loaded.items() <= undamaged.items()
        loaded, undamaged = set(loaded.items()), set(undamaged.items())
    settle("ncu CSV: truncated", r, loaded, undamaged, truncated=True)


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize("fixture", NCU_CSVS, ids=lambda p: p.name)
def test_ncu_csv_bit_flips(fixture, draw, tmp_path, capsys, caplog):
    data = _plain(fixture)
    damaged = _flip(data, draw, count=4)
    p = tmp_path / ("flip_" + fixture.name.removesuffix(".gz"))
    p.write_bytes(damaged)
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    loaded = json_ncu(r.doc) if r.code == 0 else None
    d_text = damaged.decode("utf-8", "replace")
    as_written = ncu_csv_durations(d_text) if _layout(d_text) == _layout(data.decode()) else None
    settle("ncu CSV: bit flips", r, loaded, ncu_csv_durations(data.decode()), as_written)


# ---------------------------------------------------------------------- ncu report
@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("fixture", NCU_REPS, ids=lambda p: p.name)
def test_ncu_rep_truncated(fixture, cut, tmp_path, capsys, caplog):
    data = _plain(fixture)
    p = tmp_path / "cut.ncu-rep"
    p.write_bytes(data[:int(len(data) * cut)])
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    pristine = tmp_path / "whole.ncu-rep"
    pristine.write_bytes(data)
    undamaged = rep_actions(pristine)
    loaded = json_rep(r.doc) if r.code == 0 else None
    if r.code == 0:
        assert loaded == undamaged[:len(loaded)]  # a prefix: what is cut is at the end
        loaded, undamaged = set(loaded), set(undamaged)
    settle("ncu report: truncated", r, loaded, undamaged, truncated=True)


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize("fixture", NCU_REPS, ids=lambda p: p.name)
def test_ncu_rep_bit_flips(fixture, draw, tmp_path, capsys, caplog):
    data = _plain(fixture)
    p = tmp_path / "flip.ncu-rep"
    p.write_bytes(_flip(data, draw, count=8))
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    pristine = tmp_path / "whole.ncu-rep"
    pristine.write_bytes(data)
    loaded = json_rep(r.doc) if r.code == 0 else None
    undamaged = rep_actions(pristine)
    if r.code == 0 and loaded != undamaged:
        assert len(loaded) < len(undamaged) and r.warnings or loaded == rep_actions(p)
    settle("ncu report: bit flips", r, loaded, undamaged, rep_actions(p))


# ---------------------------------------------------------------------- gzip layers
def _gz_cases():
    src = gzip.compress(_plain(NCU_DIR / "triton_rmsnorm_raw.csv.gz"), mtime=0)
    rep = NCU_REP.read_bytes()
    bomb = gzip.compress(b"0" * (64 << 20), mtime=0)
    return {
        "csv: stream cut at 50%": ("x_raw.csv.gz", src[:len(src) // 2]),
        "csv: trailer cut": ("x_raw.csv.gz", src[:-3]),
        "csv: deflate bytes flipped": ("x_raw.csv.gz", src[:40] + bytes(b ^ 0x5A for b in src[40:80]) + src[80:]),
        "csv: gzip of garbage": ("x_raw.csv.gz", b"\x1f\x8b" + os.urandom(200)),
        "csv: 64 MiB bomb above a 16 MiB limit": ("x_raw.csv.gz", bomb),
        "rep: stream cut at 50%": ("x.ncu-rep.gz", rep[:len(rep) // 2]),
        "rep: deflate bytes flipped": ("x.ncu-rep.gz", rep[:40] + bytes(b ^ 0x5A for b in rep[40:80]) + rep[80:]),
        "rep: only the magic": ("x.ncu-rep.gz", b"\x1f\x8b"),
        "rep: 64 MiB bomb above a 16 MiB limit": ("x.ncu-rep.gz", bomb),
    }


GZ_CASES = _gz_cases()


@pytest.mark.parametrize("case", list(GZ_CASES))
def test_damaged_gzip_refused(case, tmp_path, capsys, caplog, monkeypatch):
    name, data = GZ_CASES[case]
    monkeypatch.setenv("TRACESTORY_MAX_INPUT_BYTES", "16M")
    p = tmp_path / name
    p.write_bytes(data)
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    assert r.code == 2
    TALLY["gzip layer", "refused (exit 2, one line)"] += 1


# ---------------------------------------------------------------------- special files
def test_special_files_refused_before_opening(tmp_path, capsys, caplog):
    """A FIFO would block the open forever; a character device never ends. The names below are
    sniffed by name (no open before the reader), so the reader's own refusal is what answers."""
    fifo = tmp_path / "pipe.ncu-rep"
    os.mkfifo(fifo)
    dev = tmp_path / "zero.ncu-rep"
    dev.symlink_to("/dev/zero")
    for p in (fifo, dev):
        r = run_cli(capsys, caplog, tmp_path, "analyze", p)
        assert r.code == 2 and ("FIFO" in r.err[0] or "device" in r.err[0])
        TALLY["special files", "refused (exit 2, one line)"] += 1


def test_fifo_named_like_a_trace_refused_through_the_cli(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        proc = subprocess.run([sys.executable, "-m", "tracestory.cli", "analyze", str(fifo)], capture_output=True,
                              text=True, timeout=10, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("analyze blocked on opening a FIFO")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and str(fifo) in lines[0] and "FIFO" in lines[0]


def test_huge_sparse_file_refused(tmp_path, capsys, caplog):
    p = tmp_path / "huge.json"
    with open(p, "wb") as f:
        f.truncate(8 << 30)  # 8 GiB of nothing: no blocks stored
    if os.stat(p).st_blocks * 512 >= 1 << 20:
        pytest.fail("this filesystem stores sparse files in full; the case cannot be made here")
    r = run_cli(capsys, caplog, tmp_path, "analyze", p)
    assert r.code == 2 and "sparse" in r.err[0]
    TALLY["special files", "refused (exit 2, one line)"] += 1


# ---------------------------------------------------------------------- report command
REPORT_CASES = [
    ("sqlite cut at 50%", NSYS_2024, lambda d: d[:len(d) // 2], "cut.sqlite"),
    ("sqlite bit flips", NSYS_2024, lambda d: _flip(d, 4, start=100), "flip.sqlite"),
    ("ncu details cut at 90%", NCU_DETAILS, lambda d: d[:int(len(d) * 0.9)], "cut_details.csv"),
    ("ncu report cut at 90%", NCU_REP, lambda d: gzip.decompress(d)[:int(len(gzip.decompress(d)) * 0.9)], "c.ncu-rep"),
    ("ncu report cut at 50%", NCU_REP, lambda d: gzip.decompress(d)[:len(gzip.decompress(d)) // 2], "c.ncu-rep"),
    ("nsys stats cut at 90%", NSYS_CSV_DIR / "cuda_gpu_kern_sum.csv", lambda d: d[:int(len(d) * 0.9)], "cut.csv"),
    ("ncu raw gzip cut", NCU_DIR / "sdpa_flash_raw.csv.gz", lambda d: d[:len(d) // 2], "x_raw.csv.gz"),
]


@pytest.mark.parametrize("case,fixture,mutate,name", REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_report_on_damaged_inputs(case, fixture, mutate, name, tmp_path, capsys, caplog):
    p = tmp_path / name
    p.write_bytes(mutate(fixture.read_bytes()))
    r = run_cli(capsys, caplog, tmp_path, "report", p)
    if r.code == 0:
        assert r.warnings, "a damaged input reported without its damage stated"
        assert (tmp_path / "report.md").stat().st_size > 0
    TALLY["report command", "refused (exit 2, one line)" if r.code else "loaded, damage stated"] += 1


def test_damage_stated_in_the_terminal_of_a_real_run(tmp_path):
    """Outside pytest's log capture, each warning is one ``FILE: warning: ...`` line on stderr."""
    text = NCU_DETAILS.read_text()
    p = tmp_path / "cut_details.csv"
    p.write_text(text[:int(len(text) * 0.9)])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "tracestory.cli", "analyze", str(p)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and all(ln.startswith(f"{p}: warning: ") for ln in lines), lines
    assert any("its last kernel (ID 5" in ln for ln in lines)


def test_pristine_fixtures_load_without_warnings(tmp_path, capsys, caplog):
    """The checks above must not cry wolf: the undamaged fixtures state no damage."""
    for p in (*SQLITES, *NCU_CSVS, *NCU_REPS, *NSYS_CSVS):
        r = run_cli(capsys, caplog, tmp_path, "analyze", p)
        assert r.code == 0 and not r.warnings, (p, r.warnings)
        assert not _trace_warnings(r.doc)


def test_zlib_is_what_decompresses_the_bombs():
    """The bomb above really is larger than the limit once inflated (guards the case itself)."""
    _, bomb = GZ_CASES["csv: 64 MiB bomb above a 16 MiB limit"]
    assert len(zlib.decompress(bomb, 16 + zlib.MAX_WBITS)) > 16 << 20
