"""Test fixtures: paths to the real profiler outputs in tests/data (PROVENANCE.md there)."""

from __future__ import annotations

import gc
import socket
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = REPO / "tests" / "data"

H200_LLAMA = TEST_DATA / "h200" / "llama2layer_eager_decode.trace.json.gz"
H100_BERT = TEST_DATA / "public" / "kineto_h100_bert-small_1rank.json.gz"
A100_NCCL = TEST_DATA / "public" / "kineto_a100_nccl_allreduce_rank0of2.json.gz"
KINETO_FIXTURES = [H200_LLAMA, H100_BERT, A100_NCCL]

NSYS_2022 = TEST_DATA / "public" / "nsys_2022.1_gtx1060_concurrent_nvtx.sqlite"
NSYS_2024 = TEST_DATA / "public" / "nsys_2024.5_a100_cloverleaf.sqlite"

NCU_RAW = TEST_DATA / "h200" / "llama1layer_ncu_raw.csv"
NCU_DETAILS = TEST_DATA / "h200" / "llama1layer_ncu_details.csv"
NCU_REP = TEST_DATA / "h200" / "llama_gemm_2kernels.ncu-rep.gz"


TRACE_TABLES = ("kernels", "memops", "api", "ops", "ranges", "memory", "collectives")


@pytest.fixture(autouse=True)
def _unfreeze_heap():
    """A server built in a test freezes the process's heap (serve.gcwatch.freeze_heap, as
    ``tracestory serve`` does once started); the suite is one process, so thaw it after each
    test: frozen garbage would never be collected."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


def assert_same_trace(a, b) -> None:
    """Two reads of one input: the same one-line refusal (given as its text), or equal meta,
    strings and tables, column by column (dtype too; NaN equals NaN)."""
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert a.strings == b.strings
    assert a.meta == b.meta
    for t in TRACE_TABLES:
        ta, tb = getattr(a, t), getattr(b, t)
        assert len(ta) == len(tb), t
        for c in ta.columns:
            x, y = ta[c], tb[c]
            assert x.dtype == y.dtype, (t, c)
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (t, c)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for a server a test starts)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def clean_cwd(tmp_path, monkeypatch):
    """An empty current folder with no TRACESTORY_* variables (capture settings come from
    flags only) and no tracestory.toml."""
    import os

    for k in list(os.environ):
        if k.startswith("TRACESTORY_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    return tmp_path
