"""Every format sniff and header read stays within 64 KiB of the file, whatever its layout.

A Kineto trace written on one line (what ``json.dump`` writes) has no "first line" short of its
end: a sniff that reads a line reads the whole trace. Here ``open`` is wrapped so that every byte
read from disk is counted, and each sniff runs on a one-line trace of several MB (plain and gzip).
The trace is built here from a repository fixture's events, repeated, with no newline.
"""

from __future__ import annotations

import builtins
import gzip
import io
import json

import pytest
from conftest import H200_LLAMA

from tracestory.ingest import sniff, split_serving_files
from tracestory.ingest.files import SNIFF_BYTES, read_head, sniff_head
from tracestory.ingest.load_summary import is_summary_file
from tracestory.ingest.ranks import _peek_rank
from tracestory.ingest.scheduler_log import is_scheduler_log, read_scheduler_log
from tracestory.ingest.telemetry import is_telemetry_file


class _Counting(io.FileIO):
    total = 0

    def readinto(self, b):
        n = super().readinto(b)
        _Counting.total += n or 0
        return n

    def readall(self):
        data = super().readall()
        _Counting.total += len(data)
        return data


@pytest.fixture
def counted(monkeypatch):
    """Bytes read from disk through ``open`` (and ``gzip.open``, which calls it) while the test runs."""
    real = builtins.open

    def counting_open(file, mode="r", *args, **kwargs):
        if mode == "rb" and not isinstance(file, int):
            return io.BufferedReader(_Counting(file, "rb"))
        return real(file, mode, *args, **kwargs)

    _Counting.total = 0
    monkeypatch.setattr(builtins, "open", counting_open)
    return _Counting


def _one_line_trace(target_bytes: int) -> bytes:
    doc = json.loads(gzip.decompress(H200_LLAMA.read_bytes()))
    events = doc["traceEvents"]
    reps = target_bytes // len(json.dumps(events)) + 1
    doc["traceEvents"] = events * reps
    # where PyTorch puts it: before the events
    doc = {"distributedInfo": {"rank": 3, "world_size": 4}, **{k: v for k, v in doc.items() if k != "distributedInfo"}}
    text = json.dumps(doc).encode()   # no indent: one line
    assert b"\n" not in text and len(text) > target_bytes
    return text


@pytest.fixture(scope="module")
def big_line(tmp_path_factory):
    d = tmp_path_factory.mktemp("oneline")
    text = _one_line_trace(8 << 20)
    (d / "rank3.json").write_bytes(text)
    (d / "rank3.json.gz").write_bytes(gzip.compress(text, 1))
    return d


@pytest.mark.parametrize("name", ["rank3.json", "rank3.json.gz"])
@pytest.mark.parametrize("what", ["scheduler log", "summary", "telemetry", "format", "rank", "serving split"])
def test_each_sniff_reads_at_most_the_bound(big_line, name, what, counted):
    p = big_line / name
    size = p.stat().st_size
    assert size > 8 * SNIFF_BYTES
    answer = {"scheduler log": lambda: is_scheduler_log(p), "summary": lambda: is_summary_file(p),
              "telemetry": lambda: is_telemetry_file(p), "format": lambda: sniff(p),
              "rank": lambda: _peek_rank(p), "serving split": lambda: split_serving_files([str(p)])}[what]()
    expected = {"scheduler log": False, "summary": False, "telemetry": False, "format": "kineto", "rank": 3,
                "serving split": ([str(p)], [], [])}[what]
    assert answer == expected
    assert counted.total <= SNIFF_BYTES, f"{what} read {counted.total:,} of {size:,} bytes"


def test_a_head_is_the_file_start_inflated(big_line):
    plain = (big_line / "rank3.json").read_bytes()
    assert sniff_head(big_line / "rank3.json.gz") == plain[:SNIFF_BYTES]
    assert read_head(big_line / "rank3.json.gz", 100) == plain[:100]
    assert read_head(big_line / "rank3.json", 10 * SNIFF_BYTES) == plain[:SNIFF_BYTES]  # capped


def test_scheduler_log_meta_line_found_and_long_first_line_refused(tmp_path):
    meta = b'{"type": "meta", "version": 1, "engine": "x"}'
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"\n  \n" + meta)  # blank lines first, no final newline: still the first line
    assert is_scheduler_log(p)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(meta + b"\n"))
    assert is_scheduler_log(tmp_path / "a.jsonl.gz")
    # a writer that appends one gzip member per write: the meta line's newline is in the second
    (tmp_path / "m.jsonl.gz").write_bytes(gzip.compress(meta) + gzip.compress(b"\n{\"type\": \"arrival\"}\n"))
    assert is_scheduler_log(tmp_path / "m.jsonl.gz")
    # A meta object padded past 64 KiB is not sniffed as a log (the format's meta line is short) ...
    padded = b'{"type": "meta", "version": 1, "pad": "' + b"x" * SNIFF_BYTES + b'"}\n'
    q = tmp_path / "b.jsonl"
    q.write_bytes(padded)
    assert not is_scheduler_log(q)
    # ... but its reader, asked directly, still reads it.
    assert read_scheduler_log(q).meta.version == 1


def test_summary_sniff_still_reads_a_load_summary(tmp_path):
    doc = {"config": {"x": 1}, "summary": {"mode": "closed", "ttft": {"count": 1}}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    assert is_summary_file(p)
    # a summary above 64 KiB (a long config) but under 1 MiB is read whole, as before
    doc["config"]["pad"] = "y" * (2 * SNIFF_BYTES)
    p.write_text(json.dumps(doc))
    assert is_summary_file(p)


def test_sniffs_answer_no_for_special_files(tmp_path):
    import os

    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert sniff_head(fifo) is None  # a FIFO is never opened (the open would block)
    assert not is_scheduler_log(fifo) and not is_telemetry_file(fifo)
