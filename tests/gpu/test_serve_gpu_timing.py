"""The event log's device and GC time per iteration on a CUDA GPU (run on the device machine).

Second sources: the host's own times of the same line (``forward_ns``: launch to tokens on the
host, which contains the device interval between the two events); the served tokens (graphs
replayed with the events around them still produce every token asked for); the collector's
state read here (``gc.get_freeze_count()``)."""

import gc
import json

import pytest
from ragged_requests import complete  # tests/gpu/ragged_requests.py

from tracestory.serve import ServeOptions, start_server_thread, wait_healthy

pytestmark = pytest.mark.gpu


def test_iterations_carry_gpu_and_gc_time_with_graphs(tmp_path):
    log = tmp_path / "sched.jsonl"
    try:
        h = start_server_thread(ServeOptions(port=0, device="cuda", preset="llama-3-8b", layers=2, max_num_seqs=8,
                                             num_blocks=256, max_batch_tokens=128, event_log=str(log)))
        try:
            wait_healthy(h.url, timeout_s=60)
            assert gc.get_freeze_count() > 0 and gc.isenabled()
            outs = complete(h.url, (40, 300), max_tokens=24)
        finally:
            h.stop()
    finally:
        gc.unfreeze()
    assert [o["usage"]["completion_tokens"] for o in outs] == [24, 24]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["startup"]["gc_frozen_objects"] > 0 and lines[0]["startup"]["cuda_graphs"] is True
    its = [o for o in lines if o["type"] == "iteration"]
    assert len(its) >= 20
    for o in its:
        # an iteration that samples no token (only chunks of a longer prompt) is not waited for
        # (Launch.result returns at once), so its events may not be done: gpu_ns left out
        samples = any(m["phase"] == "decode" or not m.get("chunked") for m in o["members"])
        if samples:
            assert "gpu_ns" in o, o
        if "gpu_ns" in o:
            assert 0 < o["gpu_ns"] <= o["forward_ns"], o
        assert o["gc_ns"] >= 0 and o["gc_passes"] >= 0
