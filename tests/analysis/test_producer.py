"""Producer detection on real traces; each expectation is written from a plain reading of the
file (category counts and names listed with ``json``/``sqlite3``, noted beside each case)."""

from __future__ import annotations

import pytest
from conftest import TEST_DATA

from tracestory.analysis.producer import detect_producer
from tracestory.ingest import load_inputs

F = TEST_DATA / "field"
CASES = [
    # vLLM on B200: cpu_ops 'vllm::all_reduce', 'vllm::moe_forward'; '## Call CompiledFxGraph ... ##'
    # and 'Torch-Compiled Region: 0/1' annotations; no backward ops; cuda_runtime launches.
    (F / "AMD-AGI_TraceLens__b200_vllm_moe_mxfp4_prefill_rank0of8.json.gz",
     ("pytorch", "vLLM", True, "inference", "CUDA")),
    # Hugging Face generate on H100: aten ops, ProfilerStep#6, no Triton kernels, no backward.
    (F / "AMD-AGI_TraceLens__h100_hf_qwen1.5-0.5b_chat.json.gz", ("pytorch", None, False, "inference", "CUDA")),
    # The same on MI300X: hipLaunchKernel / hipExtModuleLaunchKernel, Cijk_* GEMMs.
    (F / "AMD-AGI_TraceLens__mi300x_hf_qwen1.5-0.5b_chat.json.gz", ("pytorch", None, False, "inference", "ROCm")),
    # SGLang decode: 'step[DECODE bs=32]' annotation, sgl_hip kernels, one hipGraphLaunch.
    (F / "AMD-AGI_TraceLens__mi300x_sglang_qwen3-8b_decode_hipgraph.json.gz",
     ("pytorch", "SGLang", False, "inference", "ROCm")),
    # 2021 ResNet-50 training: 'Operator' category with aten::*_backward, Optimizer.step#SGD.step.
    (F / "pytorch_kineto__v100_resnet50_tb_plugin_sample.pt.trace.json.gz",
     ("pytorch", None, False, "training", "CUDA")),
    # A small CUDA C program under nsys: runtime API calls, six toy kernels, no NVTX, no aten ops.
    (F / "extra-p_extrap__a100_exgpu_s10_old_nsys.sqlite", ("none", None, False, "unknown", "CUDA")),
    # DDP on A100: autograd::engine::evaluate_function: *Backward0 ops.
    (TEST_DATA / "public" / "kineto_a100_nccl_allreduce_rank0of2.json.gz", ("pytorch", None, False, "training", "CUDA")),
    # Our H100 captures (tests/data/graphs/README.md): reduce-overhead has Inductor kernels and
    # cudaGraphLaunch; the manual graph has aten ops (no Triton); FlexAttention is compiled.
    (TEST_DATA / "graphs" / "reduce_overhead_decode.trace.json.gz", ("pytorch", None, True, "inference", "CUDA")),
    (TEST_DATA / "graphs" / "manual_graph_decode.trace.json.gz", ("pytorch", None, False, "inference", "CUDA")),
    (TEST_DATA / "graphs" / "flex_prefill_decode.trace.json.gz", ("pytorch", None, True, "inference", "CUDA")),
    # Our H200 eager Llama decode: aten ops, no Triton kernels, no graphs.
    (TEST_DATA / "h200" / "llama2layer_eager_decode.trace.json.gz", ("pytorch", None, False, "inference", "CUDA")),
]


@pytest.mark.parametrize("path, expected", CASES, ids=[c[0].name[:40] for c in CASES])
def test_producer(path, expected):
    p = detect_producer(load_inputs([path]).traces[0])
    assert (p.framework, p.engine, p.compiled, p.mode, p.platform) == expected
    assert len(repr(p)) < 120


def test_graph_replay_run_is_not_eager():
    p = detect_producer(load_inputs([F / "AMD-AGI_TraceLens__mi300x_sglang_qwen3-8b_decode_hipgraph.json.gz"]).traces[0])
    assert p.replays_graphs and any("544 of 555 kernels" in e for e in p.evidence)


def test_gpu_only_pytorch_trace_is_pytorch(tmp_path):
    """torch.profiler with CUDA activities only keeps kernels and runtime calls, no CPU ops. Derived
    from the real BERT trace (tests/data/public): its cpu_op, user_annotation, gpu_user_annotation
    (a CPU annotation's GPU shadow) and python_function events dropped in a copy. Its kernels are ATen's (``void at::native::...``), so PyTorch ran it;
    without CPU ops the kernels tell the mode: GEMM and attention kernels and not one gradient kernel
    (the BERT run is inference)."""
    import gzip
    import json

    src = TEST_DATA / "public" / "kineto_h100_bert-small_1rank.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    cpu = {"cpu_op", "user_annotation", "gpu_user_annotation", "python_function"}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in cpu]
    assert any(e.get("cat") == "kernel" and e["name"].startswith("void at::native::") for e in doc["traceEvents"])
    p = tmp_path / "gpu_only.json"
    p.write_text(json.dumps(doc))
    prod = detect_producer(load_inputs([p]).traces[0])
    kernels = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert not [k for k in kernels if "backward" in k.lower() or "bwd" in k.lower()]
    assert (prod.framework, prod.mode) == ("pytorch", "inference")
    assert any(e.startswith("PyTorch's kernels without PyTorch ops") for e in prod.evidence)


def test_a_source_without_cpu_ops_leaves_the_framework_unknown():
    """rocprof v1 records HIP calls and base kernel names only, never CPU ops: a torch program's trace
    (tests/data/corpus/kineto_public/rocm-blogs__..., the blog runs torch) cannot show PyTorch's ops, so the
    framework is unknown, not 'a program without PyTorch'."""
    path = TEST_DATA / "corpus" / "kineto_public" / "rocm-blogs__mi210_rocprof_hip_trace_torch_add.json.gz"
    t = load_inputs([path]).traces[0]
    assert t.meta.source_format == "rocprof-json" and len(t.ops) == 0 and len(t.api) > 0
    p = detect_producer(t)
    assert (p.framework, p.platform) == ("unknown", "ROCm")
