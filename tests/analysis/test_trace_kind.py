"""The kind of trace, with its evidence, on real files and two hand-built ones.

Expected kinds are written from a plain reading of each file (json / sqlite3), noted per case.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import TEST_DATA

from tracestory.analysis.trace_kind import (
    KINDS,
    TraceKind,
    captured_launches,
    trace_kind,
)
from tracestory.ingest import load_inputs
from tracestory.trace import StringPool, TraceMeta, build_trace

KINDS_DIR = TEST_DATA / "kinds"
CAPTURE = KINDS_DIR / "stream_capture_small.json.gz"  # hand-built (make_hand_built.py): no real one found


def _kind(path):
    return trace_kind(load_inputs([path]).traces[0])


def test_stream_capture_is_not_a_timeline():
    events = json.loads(gzip.decompress(CAPTURE.read_bytes()))["traceEvents"]
    calls = [e for e in events if e.get("cat") == "cuda_runtime"]
    begin = next(e for e in calls if e["name"] == "cudaStreamBeginCapture")
    end = next(e for e in calls if e["name"] == "cudaStreamEndCapture")
    inside = [e for e in calls if e["name"] == "cudaLaunchKernel" and begin["ts"] <= e["ts"] < end["ts"] + end["dur"]]
    ran = [e for e in events if e.get("cat") == "kernel"]
    assert (len(inside), len(ran)) == (300, 2)
    k = _kind(CAPTURE)
    assert k.kind == "stream_capture"
    assert k.evidence[0].startswith("300 kernel launches inside 1 stream capture (cudaStreamBeginCapture")
    assert k.evidence[1].startswith("2 kernels")


def test_range_profiler():
    k = _kind(KINDS_DIR / "hta_cupti_range_profiler_alexnet.json.gz")
    assert k.kind == "range_profiler" and k.evidence[0].startswith("77 kernels from cuda_profiler_range")


def test_summary_only_nsys_stats():
    # an nsys stats cuda_gpu_kern_sum CSV: totals per kernel name, no start times
    k = _kind(TEST_DATA / "nsys" / "cuda_gpu_kern_sum.csv")
    assert k.kind == "summary_only" and "no per-event times" in k.evidence[0]


@pytest.mark.parametrize("path", [
    TEST_DATA / "field" / "AMD-AGI_TraceLens__h100_hf_qwen1.5-0.5b_chat.json.gz",  # 'kernel' events with ts/dur
    TEST_DATA / "public" / "nsys_2024.5_a100_cloverleaf.sqlite",  # CUPTI_ACTIVITY_KIND_KERNEL rows
    TEST_DATA / "field" / "AMD-AGI_TraceLens__mi300x_sglang_qwen3-8b_decode_hipgraph.json.gz",  # a replay, no capture
], ids=["kineto", "nsys", "hipgraph-replay"])
def test_timelines(path):
    k = _kind(path)
    assert k.kind == "timeline" and len(k.evidence) == 1


def test_empty_when_no_gpu_activity():
    pool = StringPool()
    t = build_trace(TraceMeta(source_path="x", source_format="kineto"), pool)
    k = trace_kind(t)
    assert k.kind == "empty" and k.evidence[0].startswith("no kernel, memcpy or memset")


def test_no_capture_windows_in_a_replay_trace():
    t = load_inputs([TEST_DATA / "graphs" / "reduce_overhead_decode.trace.json.gz"]).traces[0]
    assert captured_launches(t) == (0, 0, None)


def test_kind_is_checked():
    assert set(KINDS) == {"timeline", "stream_capture", "range_profiler", "summary_only", "empty"}
    with pytest.raises(ValueError):
        TraceKind("graph", ())
    assert np.all([isinstance(e, str) for e in _kind(CAPTURE).evidence])
