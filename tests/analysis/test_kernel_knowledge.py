"""Kernel knowledge beyond the NVIDIA/vLLM core: SageAttention, CK-tile FMHA, TensorRT, Inductor
kernels named after every fused op, the collectives outside NCCL, and NCCL's byte type.

Every name is a real kernel name (or a real name's printed leading part) found in public sources:
profiler tables, ncu/nsys summaries and notes quoted in public repositories (found with the code
search corpus; kernel_rules.py's header lists where each comes from). The expected labels are
written by hand from what each library's naming says the kernel does, not read from the code.
"""

from __future__ import annotations

import pytest

from tracestory.analysis.categories import classify_name, taxonomy
from tracestory.analysis.families import kernel_family, kernel_implementation, kernel_precision, kernel_vendor

LLM = taxonomy("llm")

# (name, llm category, family, implementation)
KNOWN = [
    # SageAttention (THU-ML): the sm_89/sm_120 CUDA kernel and the op that launches it are attention;
    # its Q/K INT8 prologue is quantization, SageAttention's.
    ("void qk_int_sv_f8_attn_kernel<128u, 64u, 32u, 64u, 128u, (DataType)1>", "attention", "SageAttention",
     "SageAttention"),
    ("qk_int8_sv_f8_accum_f32_attn_inst_buf", "attention", "SageAttention", "SageAttention"),
    ("void QuantInt8Kernel<128u, 32u, 1u, false, false, __nv_bfloat16>", "quantization", "SageAttention",
     "SageAttention quantization"),
    ("void MeanScaleKernel<64u, false, __nv_bfloat16>", "quantization", "SageAttention", "SageAttention quantization"),
    # CK-tile FMHA (AMD): aiter's paged batch prefill is named like FlashInfer's kernels, still CK.
    ("_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFmhaBatchPrefillPipelineQRKSVSAsync",
     "attention", "CK/aiter", "CK (Composable Kernel) FMHA"),
    ("ck_tile::kentry<ck_tile::gfx950_t, 2, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSSageAttn<",
     "attention", "CK/aiter", "CK (Composable Kernel) FMHA"),
    ("FmhaBatchPrefillWithPagedKVCacheKernel", "attention", "FlashInfer", "FlashInfer"),  # bare: cannot tell
    # TensorRT: its own family, category by what the name says.
    ("trt_turing_h1688cudnn_256x128_ldg8_relu_exp_small_nhwc_tn_v1", "gemm", "TensorRT", "TensorRT GEMM/convolution"),
    ("trt_maxwell_sgemm_32x128_relu_tn_v1", "gemm", "TensorRT", "TensorRT GEMM/convolution"),
    ("__myl_FcMulAdd_myl0_25", "gemm", "TensorRT", "TensorRT GEMM/convolution"),
    ("__myl_FcCastAddErf", "gemm", "TensorRT", "TensorRT GEMM/convolution"),
    ("sm50_xmma_pooling_coalescedC_NHWC_kMAX_3_False_execute_kernel_trt", "reduction", "TensorRT", "TensorRT pooling"),
    ("__mye8037_gemm_mha_v2", "attention", "TensorRT", "TensorRT Myelin MHA"),
    ("__myl_bb1_2_TraSliSliResTraResMovSli", "elementwise", "TensorRT", "TensorRT reformat/pointwise"),
    ("__myl_bb0_1_AddCasMulMeaSubMulMeaAddSqrDivMulCasMulAdd", "norm", "TensorRT", "TensorRT Myelin fused"),
    ("void genericReformat::copyVectorizedKernel<double, float, __half, (bool)1, (bool)0, (int)1>(unsigne",
     "elementwise", "TensorRT", "TensorRT reformat/pointwise"),
    ("void cuInt8::nhwcTonchw<__half, (int)32, (int)32, (int)2>(const __half *, T", "elementwise", "TensorRT",
     "TensorRT reformat/pointwise"),
    # cuDNN's own convolution tactics stay cuDNN's.
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
     "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer", "gemm", "cuDNN", "cuDNN convolution"),
    # Inductor: every fused op counts. A GQA KV-head repeat (expand + clone) with the rotation fused
    # into it is a copy; a rotation with a QK-norm or the angle bmm is RoPE; a bmm template with its
    # input's clone/expand fused as prologue is a GEMM.
    ("triton_poi_fused__unsafe_view_add_bmm_cat_clone_cos_expand", "elementwise", "Triton fused pointwise",
     "Inductor copy/layout (head repeat)"),
    ("triton_poi_fused__to_copy_cat_clone_expand", "elementwise", "Triton fused pointwise", "Inductor pointwise"),
    ("triton_poi_fused_clone_expand_unsqueeze_5", "elementwise", "Triton fused pointwise", "Inductor pointwise"),
    ("triton_poi_fused_clone_expand_transpose_unsqueeze_54", "elementwise", "Triton fused pointwise",
     "Inductor pointwise"),
    ("triton_per_fused__unsafe_view_add_bmm_cat_cos_mean_mul_neg_pow_rsqrt_sin_slice_transpose_unsqueeze_view_3",
     "rope", "Triton fused reduction", "Inductor RoPE"),
    # backward of the rotation: the clone/expand is the gradient of an expand, not a head repeat
    ("triton_per_fused__unsafe_view_add_bmm_cat_clone_cos_div_expand_mul_neg_pow_sin_slice_slice_backward_sum_"
     "transpose_unsqueeze_view_13", "rope", "Triton fused reduction", "Inductor RoPE"),
    ("triton_tem_fused__to_copy__unsafe_view_bmm_clone_expand_unsqueeze_view_8", "gemm", "Triton template (matmul)",
     "Inductor mm template"),
    ("triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_9", "norm", "Triton fused reduction", "Inductor reduction"),
    ("triton_red_fused_prepare_softmax_online_14", "softmax", "Triton fused reduction", "Inductor reduction"),
    ("triton_per_fused__softmax_backward_data_mul_view_16", "softmax", "Triton fused reduction", "Inductor reduction"),
    ("triton_red_fused_add_mul_sum_view_4", "reduction", "Triton fused reduction", "Inductor reduction"),
    ("triton_red_fused_div_exp_max_sub_sum_0", "softmax", "Triton fused reduction", "Inductor reduction"),
    # an amax alone is an FP8 scale as often as a softmax pass: a reduction
    ("triton_per_fused_amax_clone_view_0", "reduction", "Triton fused reduction", "Inductor reduction"),
    # Communication outside NCCL.
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
     "unsigned int**, unsigned long, unsigned long)", "communication", "symmetric memory",
     "symmetric-memory all-reduce"),
    ("one_shot_all_reduce_kernel", "communication", "symmetric memory", "symmetric-memory all-reduce"),
    ("two_shot_all_reduce_kernel", "communication", "symmetric memory", "symmetric-memory all-reduce"),
    ("cross_device_reduce_1stage", "communication", "custom all-reduce", "custom all-reduce"),
    ("void dpsk::ep::internode::combine_ll", "communication", "DeepEP", "DeepEP dispatch/combine"),
]


@pytest.mark.parametrize(("name", "llm", "family", "implementation"), KNOWN, ids=[k[0][:50] for k in KNOWN])
def test_kernel_lands_where_its_library_says(name, llm, family, implementation):
    assert (classify_name(name, LLM), kernel_family(name), kernel_implementation(name)) == (llm, family, implementation)


def test_tensorrt_plugin_namespace_names_the_family():
    # A TensorRT plugin kernel: what it does from its name (layer norm), who wrote it from nvinfer1::.
    # Built from TensorRT OSS's plugin namespace and a kernel of its BERT plugins (skipLayerNormKernelSmall);
    # no public profile printing one was found, so this name is ours, not a quoted one.
    name = "void nvinfer1::plugin::bert::skipLayerNormKernelSmall<float, 256u>(int, float const*, float*)"
    assert (classify_name(name, LLM), kernel_family(name), kernel_vendor(name)) == ("norm", "TensorRT", "NVIDIA")


def test_tensorrt_kernels_are_nvidia_tensorrt_not_cudnn():
    for name in ("trt_turing_h1688cudnn_256x128_ldg8_relu_exp_small_nhwc_tn_v1",
                 "void genericReformat::copyPackedKernel<float, float, (bool)1, (bool)1, gene"):
        assert (kernel_family(name), kernel_vendor(name)) == ("TensorRT", "NVIDIA")


@pytest.mark.parametrize(("name", "precision"), [
    # NCCL's byte type: a collective of any tensor moved as bytes, not int8 arithmetic.
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", ""),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ""),
    ("ncclKernel_AllGather_RING_LL_Sum_uint8_t(ncclDevComm*, unsigned long, ncclWork*)", ""),
    # a real int8 GEMM (TensorRT's IMMA tactic) still says int8
    ("sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize256x128x64_stage4_warpsize4x2x1_tensor16x8x32", "int8"),
    # TensorRT's cuInt8:: namespace holds layout kernels of any type: the type argument decides
    ("void cuInt8::nchwToNhwcKernel<float>(int, int, int, int, int, int, int, int, bool, const T1 *, T1 *)", "fp32"),
    ("void qk_int_sv_f8_attn_kernel<128u, 64u, 32u, 64u, 128u, (DataType)1>", ""),
])
def test_precision_is_not_read_from_byte_types(name, precision):
    assert kernel_precision(name) == precision
