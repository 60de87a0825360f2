"""Kineto chunks decoded in worker processes (:mod:`tracestory.ingest.kineto_workers`).

The claim: a read with workers gives the very Trace a one-process read gives (same strings in
the same order, same columns, same warnings and refusals), whatever the chunk size, on damaged
and cut files too. Chunks are made tiny here (a few KiB) so that the small fixtures span many
chunks and many workers' results are merged (and the text arrives in 4 KiB pieces, as it would
from a large file). Kernel counts and summed durations are also
checked against a plain ``json`` reading of the fixture (a second source).
"""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import A100_NCCL, assert_same_trace
from tracestory.errors import TraceFormatError
from tracestory.ingest import kineto, kineto_text, kineto_workers
from tracestory.ingest.kineto_workers import MIN_TEXT_ENV, WORKERS_ENV, decode_workers, text_bytes

DATA = A100_NCCL.parent.parent
TP_RANK0 = DATA / "tp_serve_gpu" / "torch" / "rank0.trace.json.gz"  # graph replays, NCCL kernels, gloo annotations
WRONG_ARGS = DATA / "corpus" / "tracelens_hta" / "facebookresearch_HTA__mi250_toy_mlp_train.json.gz"


class _CountingPool(kineto_workers.ChunkPool):
    submitted = 0

    def submit(self, *args):
        type(self).submitted += 1
        return super().submit(*args)


def _load(path, workers: int, chunk: int, monkeypatch):
    """load_kineto with ``workers`` (1: one process) and chunks of ``chunk`` bytes; a refusal
    comes back as its message."""
    monkeypatch.setenv(WORKERS_ENV, str(workers))
    monkeypatch.setenv(MIN_TEXT_ENV, "0")
    monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(kineto, "WORKER_CHUNK_BYTES", chunk)
    monkeypatch.setattr(kineto, "ChunkPool", _CountingPool)
    monkeypatch.setattr(kineto_text, "PIECE_BYTES", 4096)   # pieces of text smaller than a chunk
    try:
        return kineto.load_kineto(path)
    except TraceFormatError as e:
        return str(e)


@pytest.mark.parametrize("path", [A100_NCCL, TP_RANK0, WRONG_ARGS], ids=lambda p: p.name)
@pytest.mark.parametrize("chunk", [3000, 20000])
def test_workers_read_what_one_process_reads(path, chunk, monkeypatch):
    _CountingPool.submitted = 0
    many = _load(path, 2, chunk, monkeypatch)
    assert _CountingPool.submitted > 1   # the workers did decode chunks
    assert_same_trace(_load(path, 1, chunk, monkeypatch), many)


def test_workers_kernels_match_plain_json(monkeypatch):
    events = json.loads(gzip.decompress(A100_NCCL.read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    t = _load(A100_NCCL, 2, 5000, monkeypatch)
    assert len(t.kernels) == len(kernels)
    assert int((t.kernels["end_ns"] - t.kernels["start_ns"]).sum()) == sum(round(e["dur"] * 1000) for e in kernels)


def test_damage_is_stated_as_one_process_states_it(tmp_path, monkeypatch):
    """A cut file and a file with a bad event midway: the workers' read gives up, and the
    one-process read states the damage (the same Trace or refusal either way)."""
    text = gzip.decompress(A100_NCCL.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) * 2 // 3])
    bad = tmp_path / "bad.json"
    mid = text.index(b'"ph": "X"', len(text) // 2)
    bad.write_bytes(text[:mid] + b'"ph": X' + text[mid + len(b'"ph": "X"'):])
    braces = tmp_path / "braces.json"   # an event name holding the boundary text: a cut may fall inside it
    braces.write_bytes(text.replace(b'"name": "ProfilerStep#', b'"name": "},{ProfilerStep#', 3))
    for path in (cut, bad, braces):
        for chunk in (4000, 70000):
            assert_same_trace(_load(path, 1, chunk, monkeypatch), _load(path, 2, chunk, monkeypatch))


def test_how_many_workers(tmp_path):
    small = tmp_path / "small.json"
    small.write_bytes(b"{}" + b" " * 1000)
    gz = tmp_path / "t.json.gz"
    payload = b"{" + b" " * 300_000 + b"}"
    gz.write_bytes(gzip.compress(payload))
    assert text_bytes(gz, gz.stat().st_size) == len(payload)   # gzip's own size field
    assert text_bytes(small, small.stat().st_size) == 1002
    assert decode_workers(small, {WORKERS_ENV: "2"}) == 0      # small: no process start-up
    assert decode_workers(small, {WORKERS_ENV: "2", MIN_TEXT_ENV: "0"}) == 2
    assert decode_workers(small, {WORKERS_ENV: "1", MIN_TEXT_ENV: "0"}) == 0   # 1: the one-process read
    assert decode_workers(gz, {MIN_TEXT_ENV: "0"}) == 0        # the default: one process (measured)
    assert decode_workers(gz, {WORKERS_ENV: "2", MIN_TEXT_ENV: "300000"}) == 2
    assert decode_workers(gz, {WORKERS_ENV: "2", MIN_TEXT_ENV: "300003"}) == 0
