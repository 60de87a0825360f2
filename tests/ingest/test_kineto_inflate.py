"""The Kineto reader's gzip inflater: ISA-L (the ``isal`` package) when installed, else zlib
(``TRACESTORY_INFLATE=zlib`` forces zlib). Both must give the same Trace and the same refusal.
The expected text of a corrupt stream's refusal is zlib's own message (a second source)."""

from __future__ import annotations

import gzip
import zlib

import isal  # noqa: F401  (a dependency: without it these tests fail, they do not skip)
import numpy as np
import pytest

from conftest import A100_NCCL
from tracestory.errors import TraceFormatError
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.kineto_text import INFLATE_ENV


def _both(path, monkeypatch):
    out = []
    for inflate in ("zlib", ""):
        monkeypatch.setenv(INFLATE_ENV, inflate)
        try:
            out.append(load_kineto(path))
        except TraceFormatError as e:
            out.append(str(e))
    return out


def test_corrupt_stream_refused_in_zlib_words(tmp_path, monkeypatch):
    data = bytearray(A100_NCCL.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(bytes(data))
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    with pytest.raises(zlib.error) as zerr:
        d.decompress(bytes(data))
    one, other = _both(bad, monkeypatch)
    assert one == other
    assert f"corrupt gzip data ({zerr.value})" in one


def test_multi_member_and_cut_streams_read_alike(tmp_path, monkeypatch):
    text = gzip.decompress(A100_NCCL.read_bytes())
    half = text.index(b"},", len(text) // 2) + 2
    multi = tmp_path / "multi.json.gz"
    multi.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(A100_NCCL.read_bytes()[: A100_NCCL.stat().st_size * 3 // 4])
    for path in (multi, cut):
        a, b = _both(path, monkeypatch)
        assert a.meta == b.meta and a.strings == b.strings
        for t in ("kernels", "api", "ops"):
            for c in getattr(a, t)._cols:
                x, y = getattr(a, t)[c], getattr(b, t)[c]
                assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (t, c)
    assert len(_both(multi, monkeypatch)[1].kernels) == text.count(b'"cat": "kernel"')
