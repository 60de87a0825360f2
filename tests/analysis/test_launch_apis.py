"""Launch API names: CUDA runtime/driver, HIP and graph launches, on names and on real traces.

Expected counts come from a plain ``json`` read of the field traces, with the launch names of
each vendor written here by hand (CUDA Runtime/Driver API and HIP API references).
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import TEST_DATA

from tracestory.analysis import analyze
from tracestory.analysis.compare import compare
from tracestory.analysis.launch_apis import (
    base_name,
    is_graph_launch,
    is_kernel_launch,
    is_launch_name,
    launch_masks,
)
from tracestory.ingest import load_inputs

FIELD = TEST_DATA / "field"
MI300X_QWEN = FIELD / "AMD-AGI_TraceLens__mi300x_hf_qwen1.5-0.5b_chat.json.gz"
H100_QWEN = FIELD / "AMD-AGI_TraceLens__h100_hf_qwen1.5-0.5b_chat.json.gz"
SGLANG_GRAPH = FIELD / "AMD-AGI_TraceLens__mi300x_sglang_qwen3-8b_decode_hipgraph.json.gz"

# Written by hand: the launch calls these traces hold (CUDA and HIP API names).
HAND_KERNEL_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                        "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel"}
HAND_GRAPH_LAUNCHES = {"cudaGraphLaunch", "hipGraphLaunch"}


@pytest.mark.parametrize("name", sorted(HAND_KERNEL_LAUNCHES) + [
    "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel", "hipExtLaunchKernel",
    "hipLaunchCooperativeKernel", "cudaLaunchKernel_v7000", "cudaLaunchKernel_ptsz", "cuLaunchKernel_ptsz"])
def test_kernel_launch_names(name):
    assert is_kernel_launch(name) and is_launch_name(name) and not is_graph_launch(name)


@pytest.mark.parametrize("name", ["cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch", "cudaGraphLaunch_v10000",
                                  "cuGraphLaunch_ptsz"])
def test_graph_launch_names(name):
    assert is_graph_launch(name) and is_launch_name(name) and not is_kernel_launch(name)


@pytest.mark.parametrize("name", ["cudaMemcpyAsync", "hipMemcpyWithStream", "hipMemsetAsync", "cudaStreamSynchronize",
                                  "cudaLaunchHostFunc", "hipGetDevicePropertiesR0600", "cudaGraphInstantiate",
                                  "hipStreamIsCapturing", ""])
def test_other_api_calls_are_not_launches(name):
    assert not is_launch_name(name)


def test_base_name_strips_profiler_suffixes():
    assert base_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert base_name("cuLaunchKernel_ptsz") == "cuLaunchKernel"
    assert base_name("cudaMemcpyAsync_ptsz_v7000") == "cudaMemcpyAsync"
    assert base_name("hipLaunchKernel") == "hipLaunchKernel"


def _json_launches(path):
    events = json.load(gzip.open(path))["traceEvents"]
    api = [e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"]
    kernel = sum(n in HAND_KERNEL_LAUNCHES for n in api)
    graph = sum(n in HAND_GRAPH_LAUNCHES for n in api)
    return kernel, graph


@pytest.mark.parametrize("path", [MI300X_QWEN, SGLANG_GRAPH, H100_QWEN], ids=["mi300x", "sglang", "h100"])
def test_launch_masks_on_field_traces(path):
    kernel, graph = _json_launches(path)
    assert kernel > 0
    trace = load_inputs([path]).traces[0]
    km, gm = launch_masks(trace)
    assert (int(km.sum()), int(gm.sum())) == (kernel, graph)


def test_compare_counts_hip_launches():
    """Same model on H100 and MI300X: both sides count their launches (was 'launches 1029 -> 0')."""
    a, b = analyze(load_inputs([H100_QWEN]).traces[0]), analyze(load_inputs([MI300X_QWEN]).traces[0])
    c = compare(a, b, label_a="H100", label_b="MI300X")
    ka, ga = _json_launches(H100_QWEN)
    kb, gb = _json_launches(MI300X_QWEN)
    assert (c.a.launch_count, c.b.launch_count) == (ka + ga, kb + gb)
    # hipLaunchKernel 860 + hipExtModuleLaunchKernel 169 + hipModuleLaunchKernel 24, read off the file
    assert c.b.launch_count == 1053
    assert c.b.graph_launch_count == 0
    _, g = _json_launches(SGLANG_GRAPH)
    assert g == 1
