"""ingest/files.py: special files refused before opening, the size limit, gzip layers, and the
warnings a reader attaches to what it loads."""

from __future__ import annotations

import dataclasses
import gzip
import os

import pytest

from tracestory.errors import TraceFormatError, one_line
from tracestory.ingest.files import (
    check_size,
    inflate,
    max_input_bytes,
    read_bytes,
    read_head,
    refuse_special,
    warnings_of,
    with_warnings,
)
from tracestory.trace import TraceMeta


def test_special_files_refused_without_opening(tmp_path):
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)  # opening it would block until a writer came
    with pytest.raises(TraceFormatError, match="FIFO"):
        refuse_special(fifo)
    with pytest.raises(TraceFormatError, match="character device"):
        refuse_special("/dev/null")
    with pytest.raises(TraceFormatError, match="folder"):
        refuse_special(tmp_path)
    for reader in (read_bytes, read_head):
        with pytest.raises(TraceFormatError, match="FIFO"):
            reader(fifo)
    plain = tmp_path / "a.json"
    plain.write_text("{}")
    assert refuse_special(plain).st_size == 2


def test_size_limit_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACESTORY_MAX_INPUT_BYTES", "1k")
    assert max_input_bytes() == 1024
    p = tmp_path / "big.json"
    p.write_bytes(b" " * 2000)
    with pytest.raises(TraceFormatError, match="at most 1.00 KiB"):
        read_bytes(p)
    monkeypatch.setenv("TRACESTORY_MAX_INPUT_BYTES", "2M")
    assert max_input_bytes() == 2 << 20
    assert len(read_bytes(p)) == 2000


def test_gzip_bomb_stops_at_the_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACESTORY_MAX_INPUT_BYTES", "1M")
    bomb = gzip.compress(b"[" * (8 << 20))
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(bomb)
    with pytest.raises(TraceFormatError, match="once decompressed"):
        read_bytes(p)
    with pytest.raises(TraceFormatError, match="once decompressed"):
        inflate(p, bomb, "a test file")


def test_sparse_file_refused(tmp_path):
    p = tmp_path / "sparse.json"
    with open(p, "wb") as f:
        f.truncate(4 << 30)
    st = os.stat(p)
    assert st.st_blocks * 512 < 1 << 20, "this filesystem does not keep files sparse"
    with pytest.raises(TraceFormatError, match="sparse file of 4.00 GiB"):
        check_size(p, st)


def test_inflate_reads_every_member_and_refuses_damage(tmp_path):
    p = tmp_path / "x.csv.gz"
    two = gzip.compress(b"a,b\n") + gzip.compress(b"1,2\n")
    assert inflate(p, two, "a CSV") == b"a,b\n1,2\n"
    assert inflate(p, b"a,b\n", "a CSV") == b"a,b\n"  # not gzip: as it is
    whole = gzip.compress(b"x" * 10_000)
    with pytest.raises(TraceFormatError, match="truncated"):
        inflate(p, whole[: len(whole) // 2], "a CSV")
    with pytest.raises(TraceFormatError, match="corrupt gzip"):
        inflate(p, b"\x1f\x8b" + bytes(range(40)), "a CSV")


def test_read_head_decompresses_and_refuses_bad_streams(tmp_path):
    p = tmp_path / "h.csv.gz"
    p.write_bytes(gzip.compress(b"Time (%),Total Time (ns)\n" * 1000))
    assert read_head(p, 24) == b"Time (%),Total Time (ns)"
    data = p.read_bytes()
    p.write_bytes(data[:20] + bytes(b ^ 0x5A for b in data[20:60]) + data[60:])
    with pytest.raises(TraceFormatError, match="corrupt gzip"):
        read_head(p)


def test_warnings_go_into_extra_or_the_model_field():
    meta = TraceMeta(source_path="a", source_format="nsys-csv", extra={"reports": ["kern_sum"]})
    assert with_warnings(meta, ()) is meta and warnings_of(meta) == ()
    got = with_warnings(with_warnings(meta, ["2 rows dropped"]), ["cut short"])
    assert warnings_of(got) == ("2 rows dropped", "cut short")
    assert got.extra["reports"] == ["kern_sum"] and "warnings" not in meta.extra

    @dataclasses.dataclass(frozen=True)
    class WithField:  # the model once TraceMeta has its own warnings field
        source_path: str
        extra: dict = dataclasses.field(default_factory=dict)
        warnings: tuple = ()

    m = with_warnings(WithField("b"), ["x"])
    assert m.warnings == ("x",) and m.extra == {} and warnings_of(m) == ("x",)


def test_error_messages_stay_on_one_line():
    e = TraceFormatError("f.sqlite", "an export", 'malformed schema "\n   INTEGER NOT NULL,\n  -- comment\n)')
    assert "\n" not in str(e) and str(e).startswith("f.sqlite: expected an export, found malformed schema")
    assert len(one_line("x " * 1000)) == 300
