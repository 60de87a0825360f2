"""Kernel classification: built-in taxonomies on real kernel names, range rules, TOML rules.

Expected categories are written by hand from what each kernel does; fixture expectations come
from a plain ``json``/``gzip`` read of the trace, independent of the rules under test.
"""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest
from conftest import H200_LLAMA

from tracestory.analysis.categories import (
    Rule,
    Taxonomy,
    classify,
    classify_name,
    load_rules,
    taxonomy,
)
from tracestory.errors import TraceFormatError, UsageError
from tracestory.ingest.kineto import load_kineto
from tracestory.trace import CPU_SIDE, GPU_SIDE, StringPool, TraceMeta, build_trace, make_table

LLM_CATEGORIES = (
    "gemm", "attention", "norm", "elementwise", "reduction", "softmax", "embedding", "rope",
    "quantization", "moe_routing", "communication", "memcpy", "memset", "other",
)
MOE_CATEGORIES = (
    "expert_gemm", "attention_gemm", "gate_gemm", "routing_permute", "quant_dequant", "norm",
    "allreduce", "other",
)

# Real names: from the Kineto/nsys fixtures in tests/data, or as printed by profilers
# in public traces (some are a real name's leading part, where only that was published).
NVJET = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT"
XMMA = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
CUTLASS_WMMA = (
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
    "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)"
)
CUTLASS_CONV_MANGLED = (
    "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22"
    "ImplicitGemmMultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEENS4_52Conv2dWgradOutputGradient"
    "TileAccessIteratorOptimizedINS_11MatrixShapeILi128ELi32EEENS_10tfloat32_tENS_9transform29"
    "PitchLinearWarpRakedThreadMapINS_16PitchLinearShapeILi128ELi32EEELi128ENSF_ILi8ELi4EEELi4EEE"
    "fLb0ENSO_9NoPermuteELb0EEENS1J_4warp24FragmentIteratorTensorOpIS15_S19_fNS_5ArrayIfLi4ELb1EEES16_EE"
)
PYTORCH_FLASH = (
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, "
    "false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, "
    "cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
)
FLASH_SPLITKV = (
    "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
    "cutlass::half_t>, false, false, false, false, false, true, true>(Flash_fwd_params)"
)
CUDNN_SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0"
FP8_COPY = "void at::native::vectorized_elementwise_kernel<4, at::native::float8_copy_kernel_cuda(a"
NCCL_OLD = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_NEW = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
MEMCPY_HTOD = "Memcpy HtoD (Pageable -> Device)"
MEMCPY_DTOD = "Memcpy DtoD (Device -> Device)"
MEMSET = "Memset (Device)"
RMS_TRITON = "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1"
INDEX_SELECT = (
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, "
    "2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo"
)
MOE_ALIGN = "void moe_align_block_size_kernel<int>(const T1 *, int *, "
TOPK_GATHER = (
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, unsigned"
)
ELEMENTWISE_MUL = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor"
    "<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >"
)
SPLITK_REDUCE = (
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, "
    "float, __nv_bfloat16, __nv_bfloat16, true, false, false, false>(cublasLt::cublasSplitKParams<float>, "
)

LLM_CASES = [
    # gemm: cuBLAS, CUTLASS, cuDNN convolutions (implicit GEMMs)
    (NVJET, "gemm"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "gemm"),
    ("nvjet_sm103_qqsss_112x64_128x14_1x2_2cta_h_bz_TNN", "gemm"),  # fp8 cuBLAS GEMM, not quantization
    (XMMA, "gemm"),
    ("ampere_sgemm_32x128_nt", "gemm"),
    ("ampere_sgemm_32x32_sliced1x4_tn", "gemm"),
    (CUTLASS_WMMA, "gemm"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4::Params)", "gemm"),
    (CUTLASS_CONV_MANGLED, "gemm"),  # carries epilogue NoPermute: must not be moe_routing
    ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "gemm"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer", "gemm"),
    (SPLITK_REDUCE, "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    # Inductor decode GEMVs lowered to reductions (names from tests/data/compare, H200 max-autotune)
    ("triton_red_fused_mm_t_view_12", "gemm"),
    ("triton_red_fused__to_copy__unsafe_view_add_mean_mm_mul_pow_rsqrt_t_view_7", "gemm"),
    ("triton_red_fused__unsafe_view_mm_mul_silu_t_view_8", "gemm"),
    # attention
    (PYTORCH_FLASH, "attention"),
    (FLASH_SPLITKV, "attention"),
    ("void flash::FlashAttnFwdSm90<int>(flash::Params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention"),
    (CUDNN_SDPA, "attention"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128_1x4x1_cga1x1x1_kernel0_0", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel", "attention"),  # the KV-cache write of flash attention
    # norm
    (RMS_TRITON, "norm"),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 2, true>(c10::BFloat16*, c10::BFloat16 const*, long, long, long, long, long, c10::BFloat16 const*, lon", "norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "norm"),
    ("RowwiseMomentsCUDAKernel<Half,float>", "norm"),
    ("_layer_norm_fwd_1pass_kernel", "norm"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*,", "norm"),
    ("void cudnn::bn_bw_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_bw_1C11_args<float>)", "norm"),
    # elementwise: ATen, Inductor pointwise, copies, layout changes
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("triton_poi_fused_add_cat_mul_silu_slice_split_sum_unsqueeze_12", "elementwise"),
    (ELEMENTWISE_MUL, "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#6}::operator()() const::{lambda(c", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#3}::operator()() const::{lambda(c10::BFloat16)#1},", "elementwise"),
    ("void at::unrolled_elementwise_kernel<at::direct_copy_kern", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::sin_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 2)]::operator ()() c", "elementwise"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 1, 128, 1>(at::native::(anonymous namespace)::OpaqueType<4", "elementwise"),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::nchw2nhwc_params_t<float>, float const*, flo", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>,", "elementwise"),
    # reduction
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<c10::BFloat16, float, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 8> >(at::native::ReduceOp<c1", "reduction"),
    ("void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*, float*, float*, float*, float*, float const*, float*, float*, float*, float*, float*, unsigned int, unsigned int, unsigned int, un", "attention"),  # cuDNN launches it inside SDPA
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*, long, long, long, int, int, int, int, int, int, int, int, int, int, float*, long*)", "reduction"),
    ("void at_cuda_detail::DeviceScanKernel<at_cuda_detail::Dev", "reduction"),
    ("par_reduce_kernel", "reduction"),
    # softmax
    ("triton_per_fused__softmax_2", "softmax"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*, float const*, int, int, int, bool const*, int, bool)", "softmax"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::Half*, c10::Half const*, int)", "softmax"),
    # embedding
    (INDEX_SELECT, "embedding"),
    ("triton_poi_fused_embedding_0", "embedding"),
    # rope
    ("triton_poi_fused_cat_cos_mul_sin_0", "rope"),
    ("triton_poi_fused_add_cat_mul_neg_slice_3", "rope"),
    ("_rope_kernel", "rope"),
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>", "rope"),
    # quantization
    ("void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16>(int)", "quantization"),
    ("void vllm::scaled_fp8_quant_kernel_strided_group_shape<c10::BFloat16, true>", "quantization"),
    (FP8_COPY, "quantization"),  # the cast feeding torch._scaled_mm
    ("_pack_fp8_kernel", "quantization"),
    # moe routing
    (MOE_ALIGN, "moe_routing"),
    ("count_and_sort_expert_tokens_kernel", "moe_routing"),
    ("void vllm::moe::topkGatingSoftmax", "moe_routing"),
    # generic top-k and sorts: sampling or routing, a name cannot tell; a selection (reduction) in llm
    (TOPK_GATHER, "reduction"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<unsigned long, unsigned int, int>::Policy800, false, unsigned long, unsigned int, int, int>(int*, int*, int*, int const*, u", "reduction"),
    # communication
    (NCCL_OLD, "communication"),
    (NCCL_NEW, "communication"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("ncclDevKernel_SendRecv", "communication"),
    # memops
    (MEMCPY_HTOD, "memcpy"),
    (MEMCPY_DTOD, "memcpy"),
    ("Memcpy DtoH (Device -> Pinned)", "memcpy"),
    (MEMSET, "memset"),
    # other
    ("test0(double *, unsigned long long, unsigned long long)", "other"),
    # a CloverLeaf parallel-for loop body (one cell per index) and cuDNN's convolution offset table
    ("void clover::par_ranged2d_kernel<build_field(global_variables &)::[lambda(int, int) (instance 1)]>(clover::Range2d, T1)", "elementwise"),
    ("void cask_cudnn_infer::computeOffsetsKernel<false, false>(cask_cudnn_infer::ComputeOffsetsParams)", "gemm"),
    ("", "other"),
]

MOE_CASES = [
    ("fused_moe_kernel", "expert_gemm"),
    ("aiter::fmoe_bf16_blockscaleFp8", "expert_gemm"),  # says fp8, is the grouped GEMM
    (CUTLASS_WMMA, "expert_gemm"),
    (NVJET, "gate_gemm"),
    ("nvjet_sm103_qqsss_112x64_128x14_1x2_2cta_h_bz_TNN", "gate_gemm"),
    (XMMA, "gate_gemm"),
    (SPLITK_REDUCE, "gate_gemm"),
    (PYTORCH_FLASH, "attention_gemm"),
    (FLASH_SPLITKV, "attention_gemm"),
    (CUDNN_SDPA, "attention_gemm"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention_gemm"),
    (MOE_ALIGN, "routing_permute"),
    ("count_and_sort_expert_tokens_kernel", "routing_permute"),
    ("void vllm::moe::topkGatingSoftmax", "routing_permute"),
    (TOPK_GATHER, "routing_permute"),
    (INDEX_SELECT, "routing_permute"),
    ("void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16>(int)", "quant_dequant"),
    (FP8_COPY, "quant_dequant"),
    ("_pack_fp8_kernel", "quant_dequant"),
    (RMS_TRITON, "norm"),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 2, true>(c10::BFloat16*, c10::BFloat16 const*, long, long, long, long, long, c10::BFloat16 const*, lon", "norm"),
    (NCCL_OLD, "allreduce"),
    (NCCL_NEW, "allreduce"),
    ("triton_tem_fused_mm_0", "gate_gemm"),
    (ELEMENTWISE_MUL, "other"),  # gpu_kernel_impl_nocast is not a cast
    ("triton_poi_fused_add_mul_0", "other"),
    (MEMCPY_HTOD, "other"),
    (MEMSET, "other"),
]


def test_builtin_category_lists_are_exact():
    assert taxonomy().categories == LLM_CATEGORIES
    assert taxonomy("llm").name == "llm"
    assert taxonomy("moe").categories == MOE_CATEGORIES
    assert taxonomy("moe").name == "moe"


def test_unknown_taxonomy_is_a_usage_error():
    with pytest.raises(UsageError, match="moe"):
        taxonomy("dense")


@pytest.mark.parametrize("name", ["llm", "moe"])
def test_builtin_rules_are_documented_and_declared(name):
    tax = taxonomy(name)
    assert tax.categories[-1] == "other"
    assert len(tax.rules) >= 8
    for rule in tax.rules:
        assert rule.category in tax.categories
        assert len(rule.note) > 20  # every rule says why it is there
        re.compile(rule.kernel)
    # Only moe uses the enclosing range (the MoE study's gate/expert GEMM split); llm is name-only.
    ranged = [(r.category, r.range) for r in tax.rules if r.range is not None]
    assert [c for c, _ in ranged] == ([] if name == "llm" else ["gate_gemm", "expert_gemm"])


def test_moe_range_rules_split_gemms_by_region():
    """A plain cuBLAS GEMM is a gate GEMM inside 'router', an expert GEMM inside 'expert_gemm'."""
    from tracestory.trace import CPU_SIDE, StringPool, TraceMeta, build_trace, make_table

    pool = StringPool()
    name = pool.code("nvjet_sm90_tst_64x64_64x13_2x4_h_bz_TNT")
    ranges = make_table("ranges", start_ns=[0, 100, 200], end_ns=[50, 150, 250],
                        name=pool.encode(["router", "expert_gemm", "unpermute"]), side=[CPU_SIDE] * 3,
                        tid=[1, 1, 1], depth=[0, 0, 0])
    api = make_table("api", start_ns=[10, 110, 210], end_ns=[12, 112, 212], correlation=[1, 2, 3], tid=[1, 1, 1],
                     name=pool.encode(["cudaLaunchKernel"] * 3))
    kernels = make_table("kernels", start_ns=[20, 120, 220], end_ns=[30, 130, 230], correlation=[1, 2, 3],
                         name=[name] * 3, device=[0] * 3, stream=[7] * 3)
    trace = build_trace(TraceMeta("built", "kineto"), pool, kernels=kernels, api=api, ranges=ranges)
    tax = taxonomy("moe")
    cls = classify(trace, tax)
    assert [tax.categories[c] for c in cls.kernel_category] == ["gate_gemm", "expert_gemm", "gate_gemm"]


@pytest.mark.parametrize(("name", "expected"), LLM_CASES)
def test_llm_real_kernel_names(name, expected):
    assert classify_name(name, taxonomy("llm")) == expected


@pytest.mark.parametrize(("name", "expected"), MOE_CASES)
def test_moe_real_kernel_names(name, expected):
    assert classify_name(name, taxonomy("moe")) == expected


def test_classify_name_is_case_insensitive_and_skips_range_rules():
    tax = Taxonomy(
        name="t",
        categories=("a", "b", "other"),
        rules=(Rule("a", "GEMM", range="router"), Rule("b", "gemm")),
    )
    assert classify_name("SGEMM_kernel", tax) == "b"
    assert classify_name("elementwise", tax) == "other"


# ------------------------------------------------------------------ classify on a Trace


def _tiny_trace():
    """Kernels and memops with launch calls on two threads, and CPU/GPU ranges.

    launch (api start, tid):  k0 nvjet 100/7   k1 nvjet 300/7   k2 topk 120/7   k3 nvjet 150/8
                              m0 memcpy 110/7
    CPU range "router" [50, 200) on tid 7; CPU range "decode_0" [0, 1000) on tid 7;
    GPU range "router" [250, 400) (GPU side: never used for launches).
    """
    pool = StringPool()
    knames = [NVJET, NVJET, "void vllm::moe::topkGatingSoftmax", NVJET]
    kernels = make_table(
        "kernels",
        start_ns=[1000, 1100, 1200, 1300],
        end_ns=[1050, 1160, 1230, 1340],
        name=pool.encode(knames),
        correlation=[1, 2, 3, 4],
    )
    memops = make_table(
        "memops", start_ns=[1400], end_ns=[1420], name=pool.encode([MEMCPY_HTOD]), correlation=[5]
    )
    api = make_table(
        "api",
        start_ns=[100, 300, 120, 150, 110],
        end_ns=[105, 305, 125, 155, 115],
        name=pool.encode(["cudaLaunchKernel"] * 4 + ["cudaMemcpyAsync"]),
        correlation=[1, 2, 3, 4, 5],
        tid=[7, 7, 7, 8, 7],
    )
    ranges = make_table(
        "ranges",
        start_ns=[50, 0, 250],
        end_ns=[200, 1000, 400],
        name=pool.encode(["router", "decode_0", "router"]),
        side=[CPU_SIDE, CPU_SIDE, GPU_SIDE],
        tid=[7, 7, 7],
    )
    meta = TraceMeta(source_path="tiny.json", source_format="kineto")
    return build_trace(meta, pool, kernels=kernels, memops=memops, api=api, ranges=ranges)


def _names(classification, codes):
    return [classification.taxonomy.categories[c] for c in codes]


def test_classify_broadcasts_names_to_rows():
    trace = _tiny_trace()
    c = classify(trace, taxonomy("llm"))
    assert c.kernel_category.dtype == np.int32 and c.memop_category.dtype == np.int32
    assert _names(c, c.kernel_category) == ["gemm", "gemm", "moe_routing", "gemm"]
    assert _names(c, c.memop_category) == ["memcpy"]
    m = classify(trace, taxonomy("moe"))
    assert _names(m, m.kernel_category) == ["gate_gemm", "gate_gemm", "routing_permute", "gate_gemm"]
    assert _names(m, m.memop_category) == ["other"]


def test_range_rule_takes_only_launches_inside_matching_cpu_ranges(tmp_path):
    rules = tmp_path / "router.toml"
    rules.write_text(
        'taxonomy = "llm"\n'
        "[[rule]]\n"
        'category = "router_gemm"\n'
        'kernel = "nvjet|gemm|cublas"\n'
        'range = "router|gate"\n'
        'note = "cuBLAS GEMMs launched inside the router"\n'
    )
    tax = load_rules(rules)
    assert tax.categories == LLM_CATEGORIES[:-1] + ("router_gemm", "other")
    c = classify(_tiny_trace(), tax)
    # k0 launched at 100 on tid 7 inside router [50, 200); k1 at 300 is outside (the GPU-side
    # "router" range over 300 does not count); k3 at 150 is on another thread.
    assert _names(c, c.kernel_category) == ["router_gemm", "gemm", "moe_routing", "gemm"]
    assert _names(c, c.memop_category) == ["memcpy"]


def test_first_match_wins_across_plain_and_range_rules():
    tax = Taxonomy(
        name="t",
        categories=("plain_gemm", "in_router", "late", "other"),
        rules=(
            Rule("plain_gemm", "nvjet"),
            Rule("in_router", ".", range="^router$"),
            Rule("late", "topk|memcpy"),
        ),
    )
    c = classify(_tiny_trace(), tax)
    # k0 is inside the router but the earlier plain rule took it; k2 and m0 are inside the
    # router, so the range rule beats the later plain rule.
    assert _names(c, c.kernel_category) == ["plain_gemm", "plain_gemm", "in_router", "plain_gemm"]
    assert _names(c, c.memop_category) == ["in_router"]
    late_first = Taxonomy(name="t2", categories=tax.categories, rules=(tax.rules[2], tax.rules[1]))
    c2 = classify(_tiny_trace(), late_first)
    assert _names(c2, c2.kernel_category) == ["in_router", "other", "late", "other"]
    assert _names(c2, c2.memop_category) == ["late"]


def test_empty_trace_classifies_to_empty_arrays():
    meta = TraceMeta(source_path="empty.json", source_format="kineto")
    c = classify(build_trace(meta, StringPool()), taxonomy())
    assert c.kernel_category.shape == (0,) and c.memop_category.shape == (0,)


def test_range_rule_on_real_h200_trace(tmp_path):
    """nvjet GEMMs launched inside record_function("prefill"), checked against a plain json read."""
    doc = json.load(gzip.open(H200_LLAMA))
    events = doc["traceEvents"]
    prefill = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "prefill"]
    assert len(prefill) == 1
    p = prefill[0]
    lo, hi = round(p["ts"] * 1000), round((p["ts"] + p["dur"]) * 1000)
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    nvjet = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nvjet")]
    expected = set()
    for k in nvjet:
        launch = launches[k["args"]["correlation"]]
        if lo <= round(launch["ts"] * 1000) < hi and launch["tid"] == p["tid"]:
            expected.add(k["args"]["correlation"])
    assert 0 < len(expected) < len(nvjet)  # prefill GEMMs and decode GEMMs both exist

    rules = tmp_path / "prefill.toml"
    rules.write_text(
        '[[rule]]\ncategory = "prefill_gemm"\nkernel = "^nvjet"\nrange = "^prefill$"\n'
    )
    tax = load_rules(rules, base=taxonomy("llm"))
    trace = load_kineto(H200_LLAMA)
    c = classify(trace, tax)
    cat = np.asarray(tax.categories, dtype=object)[c.kernel_category]
    got = set(trace.kernels["correlation"][cat == "prefill_gemm"].tolist())
    assert got == expected
    n_gemm = int((cat == "gemm").sum())
    n_splitk = sum(1 for e in events if e.get("cat") == "kernel" and "splitKreduce" in e["name"])
    assert n_gemm == len(nvjet) - len(expected) + n_splitk


# ------------------------------------------------------------------ TOML rules


def _write(tmp_path, text, name="rules.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_prepend_puts_user_rules_first_and_new_categories_before_other(tmp_path):
    path = _write(
        tmp_path,
        'taxonomy = "moe"\nmode = "prepend"\ncategories = ["sampling"]\n'
        '[[rule]]\ncategory = "sampling"\nkernel = "sort|topk"\nnote = "sampler"\n'
        '[[rule]]\ncategory = "lm_head"\nkernel = "nvjet"\n',
    )
    tax = load_rules(path)
    assert tax.name == "moe+rules"
    assert tax.categories == MOE_CATEGORIES[:-1] + ("sampling", "lm_head", "other")
    assert tax.rules[0] == Rule("sampling", "sort|topk", None, "sampler")
    assert tax.rules[2:] == taxonomy("moe").rules
    assert classify_name(TOPK_GATHER, tax) == "sampling"  # would be routing_permute in moe
    assert classify_name(NVJET, tax) == "lm_head"
    assert classify_name(NCCL_NEW, tax) == "allreduce"


def test_prepend_defaults_to_the_passed_base_else_llm(tmp_path):
    path = _write(tmp_path, '[[rule]]\ncategory = "gemm"\nkernel = "^test"\n')
    assert load_rules(path).categories == LLM_CATEGORIES
    assert classify_name("test0(double *)", load_rules(path)) == "gemm"
    on_moe = load_rules(path, base=taxonomy("moe"))
    assert on_moe.categories == MOE_CATEGORIES[:-1] + ("gemm", "other")


def test_replace_uses_only_the_user_rules(tmp_path):
    path = _write(
        tmp_path,
        'mode = "replace"\ncategories = ["gate_gemm", "expert_gemm", "other"]\nname = "mine"\n'
        '[[rule]]\ncategory = "gate_gemm"\nkernel = "nvjet|gemm|cublas"\nrange = "router|gate"\n'
        'note = "cuBLAS GEMMs launched inside the router"\n'
        '[[rule]]\ncategory = "expert_gemm"\nkernel = "cutlass"\n',
    )
    tax = load_rules(path)
    assert tax.name == "mine"
    assert tax.categories == ("gate_gemm", "expert_gemm", "other")
    assert tax.rules == (
        Rule("gate_gemm", "nvjet|gemm|cublas", "router|gate", "cuBLAS GEMMs launched inside the router"),
        Rule("expert_gemm", "cutlass", None, ""),
    )
    assert classify_name(CUTLASS_WMMA, tax) == "expert_gemm"
    assert classify_name(NVJET, tax) == "other"  # the range rule needs a launch context
    c = classify(_tiny_trace(), tax)
    assert _names(c, c.kernel_category) == ["gate_gemm", "other", "other", "other"]


def test_replace_adds_other_when_missing(tmp_path):
    path = _write(tmp_path, 'mode = "replace"\ncategories = ["x"]\n[[rule]]\ncategory = "x"\nkernel = "a"\n')
    assert load_rules(path).categories == ("x", "other")


@pytest.mark.parametrize(
    ("text", "expected_fragment"),
    [
        ('mode = "prepend\n', "expected a TOML rules file"),
        ('colour = "red"\n', "unknown key(s) ['colour']"),
        ('[[rule]]\ncategory = "gemm"\nkernel = "x"\nweight = 2\n', "unknown key(s) ['weight']"),
        ('mode = "replace"\ncategories = ["a", "other"]\n[[rule]]\ncategory = "b"\nkernel = "x"\n', "found 'b'"),
        ('mode = "replace"\n[[rule]]\ncategory = "b"\nkernel = "x"\n', "'categories' list with mode = 'replace'"),
        ('[[rule]]\ncategory = "gemm"\nkernel = "gemm(["\n', "valid regular expression in [[rule]] #1 'kernel'"),
        ('[[rule]]\ncategory = "gemm"\nkernel = "gemm"\nrange = "*prefill"\n', "valid regular expression in [[rule]] #1 'range'"),
        ('mode = "append"\n', "expected mode = 'prepend' or 'replace'"),
        ('taxonomy = "dense"\n', "expected taxonomy among ['llm', 'moe']"),
        ('[[rule]]\ncategory = "gemm"\n', "with a 'kernel'"),
        ('[[rule]]\ncategory = "gemm"\nkernel = 3\n', "'kernel' as a string"),
        ('categories = "gemm"\n', "categories as a list"),
    ],
)
def test_bad_rules_files_raise_one_line_trace_format_errors(tmp_path, text, expected_fragment):
    path = _write(tmp_path, text)
    with pytest.raises(TraceFormatError) as info:
        load_rules(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: expected ")
    assert expected_fragment in message


def test_missing_rules_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="nope.toml"):
        load_rules(tmp_path / "nope.toml")


# ------------------------------------------------------------------ fast case-insensitive matching


def test_name_matcher_agrees_with_ignorecase_search_on_every_labelled_name():
    """The lowered fast path gives re.IGNORECASE's answer for every rule and fixture name."""
    import csv

    from conftest import TEST_DATA

    from tracestory.analysis.categories import NameMatcher
    from tracestory.analysis.kernel_rules import RULES

    with open(TEST_DATA / "kernel_names" / "labels.tsv", newline="", encoding="utf-8") as f:
        names = [r["name"] for r in csv.DictReader(f, delimiter="\t")]
    names += ["ÄBC nvjet", "İstanbul_gemm"]  # non-ASCII names take the IGNORECASE path
    patterns = [r.pattern for r in RULES] + [r"\D+", r"(?i)GEMM", r"(?P<x>nvjet)", r"[A-Z]{5}"]
    for p in patterns:
        m, rx = NameMatcher(p), re.compile(p, re.IGNORECASE)
        for n in names:
            assert m.search(n) == bool(rx.search(n)), (p, n[:60])
