"""Limitations on real inputs, with every number read from the file itself in plain Python."""

from __future__ import annotations

import gzip
import json

from conftest import TEST_DATA

from tracestory.analysis import analyze
from tracestory.analysis.limitations import limitations, rank_coverage
from tracestory.ingest import load_inputs

QWEN_H100 = TEST_DATA / "field" / "AMD-AGI_TraceLens__h100_hf_qwen1.5-0.5b_chat.json.gz"
B200 = TEST_DATA / "field" / "AMD-AGI_TraceLens__b200_vllm_moe_mxfp4_prefill_rank0of8.json.gz"
CLOVERLEAF = TEST_DATA / "public" / "nsys_2024.5_a100_cloverleaf.sqlite"


def _limits(path):
    inputs = load_inputs([path])
    return {lim.analysis: lim.reason for lim in limitations(inputs.traces, [analyze(t) for t in inputs.traces],
                                                        has_kernel_metrics=bool(inputs.kernel_metrics))}


def test_previous_steps_queued_work_is_stated():
    # Plain reading: kernels whose launch call (same correlation id) starts inside ProfilerStep#6.
    ev = json.load(gzip.open(QWEN_H100))["traceEvents"]
    step = next(e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    inside = [k for k in kernels if step["ts"] <= launch_ts.get(k["args"]["correlation"], -1) < step["ts"] + step["dur"]]
    total = sum(k["dur"] for k in kernels)
    share = sum(k["dur"] for k in inside) / total
    outside = len(kernels) - len(inside)
    assert outside == 436 and abs(share - 0.699) < 0.001  # what the reading gives, written down
    reason = _limits(QWEN_H100)["phases"]
    assert f"cover {100 * share:.1f}% of kernel time: {outside} kernels" in reason


def test_partial_ranks_are_named():
    doc = json.load(gzip.open(B200))
    assert (doc["distributedInfo"]["rank"], doc["distributedInfo"]["world_size"]) == (0, 8)
    cov = rank_coverage(load_inputs([B200]).traces)
    assert cov.partial and cov.phrase() == "1 of 8 ranks"
    assert _limits(B200)["multi-GPU"].startswith("1 of 8 ranks given")


def test_c_program_without_markers_or_ops():
    lim = _limits(CLOVERLEAF)   # CloverLeaf under nsys: no NVTX, no PyTorch ops (PROVENANCE.md)
    assert "no step markers" in lim["phases"] and "no CPU operators" in lim["op shapes"]
    assert "hardware counters" in lim


def test_ops_left_out_of_the_roofline_estimate_are_stated_once_with_their_kernels_summed():
    # two ranks of the same model: each left out 252 kernels of vllm::moe_forward
    why = "its FLOPs are unknown from shapes"
    out = limitations([], [], has_kernel_metrics=True,
                      not_estimated=[("vllm::moe_forward", 252, why), ("vllm::moe_forward", 252, why)])
    assert [(lim.analysis, lim.reason) for lim in out] == [
        ("roofline estimate", f"the 504 kernels of vllm::moe_forward are not estimated: {why}.")]


def _shapes_in_json(path) -> bool:
    """Whether some CPU op of the Kineto file carries a non-empty "Input Dims" list, read from the JSON."""
    events = json.load(gzip.open(path))["traceEvents"]
    return any(e.get("cat") == "cpu_op" and (e.get("args") or {}).get("Input Dims") for e in events)


def test_missing_op_shapes_are_stated_for_kineto_and_recorded_ones_are_not():
    # the op-shape cells of a Kineto trace are raw JSON bytes; an empty one used to count as a shape
    # (b"" != ""), so a trace taken without record_shapes never got this limitation
    without = TEST_DATA / "public" / "kineto_a100_nccl_allreduce_rank0of2.json.gz"
    with_shapes = TEST_DATA / "public" / "kineto_h100_bert-small_1rank.json.gz"
    assert (_shapes_in_json(without), _shapes_in_json(with_shapes)) == (False, True)
    assert "no recorded op shapes" in _limits(without)["op shapes"]
    assert "op shapes" not in _limits(with_shapes)
