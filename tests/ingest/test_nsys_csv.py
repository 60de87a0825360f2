"""load_nsys_csv on CSV files BUILT by hand from the documented headers (tests/data/nsys,
see its README): expected values are the numbers written in those files, summed here."""

from __future__ import annotations

import pytest
from conftest import TEST_DATA

from tracestory.errors import TraceFormatError
from tracestory.ingest.nsys_csv import load_nsys_csv
from tracestory.trace import MEMOP_KINDS

D = TEST_DATA / "nsys"


def test_gpu_trace_2024_with_preamble():
    t, = load_nsys_csv(D / "cuda_gpu_trace_2024.csv")
    assert t.meta.has_timeline and t.meta.source_format == "nsys-csv"
    k, m = t.kernels, t.memops
    assert len(k) == 3 and int(k.dur_ns.sum()) == 300 + 200 + 250
    assert list(k["start_ns"]) == [2000, 2400, 3000]
    assert list(k["grid_x"]) == [132, 64, 1] and list(k["block_x"]) == [384, 256, 128]
    assert list(k["registers_per_thread"]) == [168, 32, 16] and list(k["stream"]) == [7, 7, 13]
    assert k["shared_mem_bytes"][0] == 213000  # 0.213 MB dynamic
    assert list(k["device"]) == [0, 0, 0] and list(k["correlation"]) == [12, 13, 15]
    assert list(t.names(m["name"])) == ["Memcpy HtoD (Pageable -> Device)", "Memset (Device)"]
    assert list(m["kind"]) == [MEMOP_KINDS.index("memcpy_htod"), MEMOP_KINDS.index("memset")]
    assert list(m["bytes"]) == [4_000_000, 1_000_000] and int(m.dur_ns.sum()) == 600


def test_gputrace_legacy_header():
    t, = load_nsys_csv(D / "gputrace_legacy.csv")
    assert list(t.names(t.memops["name"])) == ["Memcpy DtoH (Device -> Pageable)"]
    assert list(t.memops["bytes"]) == [2_000_000]
    assert list(t.names(t.kernels["name"])) == ["ncclKernel_AllReduce_RING_LL_Sum_float"]
    assert int(t.kernels.dur_ns.sum()) == 60


def test_kern_sum_keeps_counts_and_sums_exact():
    t, = load_nsys_csv(D / "cuda_gpu_kern_sum.csv")
    assert not t.meta.has_timeline
    k = t.kernels
    names = t.names(k["name"])
    assert len(k) == 3 + 2 + 1
    moe = "void fused_moe_kernel<float, 128>(float const*, int, int)"  # quoted, with commas
    assert int((names == moe).sum()) == 3 and int(k.dur_ns[names == moe].sum()) == 1000
    assert sorted(k.dur_ns[names == moe].tolist()) == [333, 333, 334]  # 1000 split evenly
    assert int(k.dur_ns.sum()) == 1000 + 500 + 7
    assert (k["start_ns"] == -1).all()
    s = {e["name"]: e for e in t.meta.extra["kernel_summary"]}
    assert s["rms_norm_kernel"]["max_ns"] == 7.0 and s[moe]["instances"] == 3


def test_gpukernsum_legacy_with_grid_block():
    t, = load_nsys_csv(D / "gpukernsum_2022.4.csv")
    assert len(t.kernels) == 5 and int(t.kernels.dur_ns.sum()) == 1200
    s = t.meta.extra["kernel_summary"]
    assert s[0]["GridXYZ"] == "132    1    1" and s[1]["BlockXYZ"] == "256    1    1"


def test_nvtx_sum():
    t, = load_nsys_csv(D / "nvtx_sum.csv")
    r = t.ranges
    assert len(r) == 3 and int(r.dur_ns.sum()) == 5000
    assert sorted(set(t.names(r["name"]))) == [":router", "decode"]


def test_unknown_csv(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="x.csv: expected an nsys stats CSV"):
        load_nsys_csv(p)
