"""Kineto ingest against the real fixtures. Expected numbers come from a plain json/gzip read."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from conftest import A100_NCCL, H100_BERT, H200_LLAMA, KINETO_FIXTURES
from tracestory.errors import TraceFormatError
from tracestory.ingest import kineto
from tracestory.ingest.kineto import load_kineto, parse_json_field
from tracestory.trace import CPU_SIDE, GPU_SIDE, MEMOP_KINDS


def plain_events(path):
    return json.load(gzip.open(path))["traceEvents"]


def ns(x):
    return round(x * 1000)


@pytest.fixture(scope="module", params=KINETO_FIXTURES, ids=lambda p: p.name)
def loaded(request):
    return request.param, load_kineto(request.param), plain_events(request.param)


def test_counts_per_table(loaded):
    path, trace, events = loaded
    cats = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    assert len(trace.kernels) == cats["kernel"]
    assert len(trace.memops) == cats["gpu_memcpy"] + cats["gpu_memset"]
    assert len(trace.api) == cats["cuda_runtime"] + cats["cuda_driver"]
    assert len(trace.ops) == cats["cpu_op"]
    assert len(trace.ranges) == cats["user_annotation"] + cats["gpu_user_annotation"]
    assert len(trace.memory) == sum(1 for e in events if e.get("name") == "[memory]")


def test_duration_sums_exact(loaded):
    path, trace, events = loaded
    for cat, table in (("kernel", trace.kernels), ("cuda_runtime", trace.api)):
        want = sum(ns(e["dur"]) for e in events if e.get("cat") == cat and e.get("ph") == "X")
        got = table.dur_ns
        if cat == "cuda_runtime":
            got = got[trace.api["kind"] == 0]
        assert int(got.sum()) == want
    want_mem = sum(ns(e["dur"]) for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    assert int(trace.memops.dur_ns.sum()) == want_mem
    want_bytes = sum(e["args"]["bytes"] for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    assert int(trace.memops["bytes"].sum()) == want_bytes


def test_times_are_integer_ns_and_sorted(loaded):
    _, trace, events = loaded
    k = trace.kernels
    assert k["start_ns"].dtype == np.int64
    assert np.all(np.diff(k["start_ns"]) >= 0)
    first = min((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    assert int(k["start_ns"][0]) == ns(first["ts"])
    assert trace.name(int(k["name"][0])) == first["name"]


def test_kernel_launch_link_by_correlation(loaded):
    _, trace, events = loaded
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    linked = sum(1 for e in kernels if e["args"]["correlation"] in launches)
    from tracestory.analysis.links import launch_index
    idx = launch_index(trace, trace.kernels)
    assert int((idx >= 0).sum()) == linked
    # each linked kernel's launch has the same correlation id
    ok = idx >= 0
    assert np.array_equal(trace.api["correlation"][idx[ok]], trace.kernels["correlation"][ok])


def test_h200_llama_annotations_and_devices():
    trace = load_kineto(H200_LLAMA)
    r = trace.ranges
    cpu_names = [trace.name(c) for c in r["name"][r["side"] == CPU_SIDE]]
    assert cpu_names == ["prefill"] + [f"decode_{i}" for i in range(16)]
    assert int((r["side"] == GPU_SIDE).sum()) == 17
    dev = trace.meta.devices[0]
    assert (dev.name, dev.sm_count, dev.cc_major, dev.cc_minor) == ("NVIDIA H200", 132, 9, 0)
    assert trace.meta.rank is None and trace.meta.world_size is None


def test_a100_distributed_info_and_nesting():
    trace = load_kineto(A100_NCCL)
    assert (trace.meta.rank, trace.meta.world_size) == (0, 2)
    assert trace.meta.distributed["backend"] == "nccl"
    # user annotations nest: zero_grad etc. inside ProfilerStep#N on the same thread
    r = trace.ranges
    names = trace.names(r["name"])
    steps = (names == "ProfilerStep#4") & (r["side"] == CPU_SIDE)
    assert int(r["depth"][steps][0]) == 0
    inner = (r["side"] == CPU_SIDE) & (r["start_ns"] > r["start_ns"][steps][0]) & (r["end_ns"] <= r["end_ns"][steps][0]) \
        & (r["tid"] == r["tid"][steps][0])
    assert inner.any() and np.all(r["depth"][inner] >= 1)


def test_memory_samples_and_ops_shapes():
    trace = load_kineto(H200_LLAMA)
    events = plain_events(H200_LLAMA)
    mem = [e for e in events if e.get("name") == "[memory]"]
    assert int(trace.memory["allocated_bytes"].max()) == max(e["args"]["Total Allocated"] for e in mem)
    assert int(trace.memory["delta_bytes"].sum()) == sum(e["args"]["Bytes"] for e in mem)
    first_op = min((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e["dur"]))
    ops = trace.ops
    i = int(np.flatnonzero(ops["start_ns"] == ns(first_op["ts"]))[0])
    assert parse_json_field(ops["input_dims"][i]) == first_op["args"]["Input Dims"]
    flops_ops = [e for e in events if e.get("cat") == "cpu_op" and "flops" in e.get("args", {})]
    assert np.count_nonzero(~np.isnan(ops["flops"])) == len(flops_ops)
    assert float(np.nansum(ops["flops"])) == pytest.approx(sum(e["args"]["flops"] for e in flops_ops))


def test_memop_kinds():
    trace = load_kineto(A100_NCCL)
    events = plain_events(A100_NCCL)
    want = Counter(e["name"].split()[1] if e["cat"] == "gpu_memcpy" else "memset"
                   for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    got = Counter(MEMOP_KINDS[k] for k in trace.memops["kind"])
    assert got["memset"] == want["memset"]
    assert got["memcpy_dtod"] == want.get("DtoD", 0)
    assert got["memcpy_htod"] == want.get("HtoD", 0)


def test_small_chunks_give_same_result(monkeypatch):
    """Chunk boundaries must not change anything: decode with tiny chunks and compare."""
    whole = load_kineto(H100_BERT)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4096)
    chunked = load_kineto(H100_BERT)
    for t in ("kernels", "memops", "api", "ops", "ranges", "memory"):
        a, b = getattr(whole, t), getattr(chunked, t)
        assert len(a) == len(b)
        for c in a.columns:
            if c == "name":  # codes depend on first-seen order; the names must not
                assert list(whole.names(a[c])) == list(chunked.names(b[c])), t
            elif a[c].dtype != object:
                assert np.array_equal(a[c], b[c], equal_nan=a[c].dtype.kind == "f"), (t, c)


def test_cut_inside_a_string_is_recovered(tmp_path, monkeypatch):
    """A name containing the event separator must not break chunking."""
    ev = lambda i, name: {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10.0 + i,
                          "dur": 0.5, "args": {"stream": 7, "device": 0, "correlation": i}}
    events = [ev(i, "weird}, {name" if i % 3 == 0 else f"k{i}") for i in range(200)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 64)
    trace = load_kineto(p)
    assert len(trace.kernels) == 200
    assert sum(1 for c in trace.kernels["name"] if trace.name(c) == "weird}, {name") == 67


@pytest.mark.parametrize("content, expected", [
    (b"\x1f\x8b\x08\x00" + b"\x00" * 20, "gzip"),
    (b"this is not json", "not JSON"),
    (b'{"schemaVersion": 1, "foo": []}', "no traceEvents"),
    (b'{"traceEvents": []}', "empty traceEvents"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]}',
     "none on the GPU"),
    (b"", "empty file"),
])
def test_bad_input_one_clear_error(tmp_path, content, expected):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceFormatError) as e:
        load_kineto(p)
    msg = str(e.value)
    assert str(p) in msg and expected in msg and "\n" not in msg


def test_truncated_gzip(tmp_path):
    data = H100_BERT.read_bytes()
    p = tmp_path / "trunc.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="truncated"):
        load_kineto(p)
