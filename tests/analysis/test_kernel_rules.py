"""The kernel knowledge base as a table: examples, ordering, precision, family lookups.

Expected values are written by hand from the libraries' naming conventions
(tests/data/kernel_names/README.md says which).
"""

from __future__ import annotations

import re

import pytest

from tracestory.analysis.categories import BUILTIN_CATEGORIES, classify_name, taxonomy
from tracestory.analysis.families import (
    is_generated,
    kernel_family,
    kernel_implementation,
    kernel_info,
    kernel_precision,
    kernel_vendor,
    matching_rule,
)
from tracestory.analysis.kernel_rules import (
    MOE_RANGE_RULES,
    MOE_RANGE_RULES_BEFORE,
    PRECISION_ORDER,
    PRECISION_TOKENS,
    RULES,
)

EXAMPLES = [(i, ex) for i, r in enumerate(RULES) for ex in r.examples]


@pytest.mark.parametrize(("index", "example"), EXAMPLES, ids=[f"{i}-{ex[:40]}" for i, ex in EXAMPLES])
def test_every_example_matches_its_own_rule_first(index, example):
    assert matching_rule(example) is RULES[index]


def test_every_rule_is_complete():
    for r in RULES:
        re.compile(r.pattern)
        assert r.examples, r.pattern
        assert len(r.note) > 20
        assert r.implementation
        assert r.llm in BUILTIN_CATEGORIES["llm"] and r.moe in BUILTIN_CATEGORIES["moe"]


def test_precision_table_is_consistent():
    assert {p for p, _ in PRECISION_TOKENS} == set(PRECISION_ORDER)
    for _, rx in PRECISION_TOKENS:
        re.compile(rx)


def test_moe_range_rules_sit_after_attention_and_routing():
    names = [r.implementation for r in RULES]
    assert MOE_RANGE_RULES_BEFORE in names
    moe = taxonomy("moe").rules
    ranged = [i for i, r in enumerate(moe) if r.range is not None]
    assert [moe[i].category for i in ranged] == [c for c, *_ in MOE_RANGE_RULES]
    first = ranged[0]
    before = {r.category for r in moe[:first]}
    assert "attention_gemm" in before and "routing_permute" in before and "allreduce" in before
    assert len(moe) == len(RULES) + len(MOE_RANGE_RULES)
    assert len(taxonomy("llm").rules) == len(RULES)


# Low-precision GEMMs are GEMMs; the issue's misfiled names, by hand.
GEMM_NOT_QUANT = [
    "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_"
    "schedP2x1x2x3_biasM_bN_tma_tmaOpt_clmp_swiGlu_dynBatch_sm100f",
    "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu",
    "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT",
    "void deep_gemm::fp8_gemm_kernel",
    "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1",
]


@pytest.mark.parametrize("name", GEMM_NOT_QUANT)
def test_low_precision_gemms_are_gemms(name):
    assert classify_name(name, taxonomy("llm")) == "gemm"


@pytest.mark.parametrize(("name", "llm", "family", "implementation"), [
    ("triton_tem_fused_flex_attention_0", "attention", "Triton template (attention)", "FlexAttention (Inductor template)"),
    ("triton_tem_fused_mm_0", "gemm", "Triton template (matmul)", "Inductor mm template"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
     "unsigned int**, unsigned long, unsigned long)", "communication", "symmetric memory", "symmetric-memory all-reduce"),
    ("cross_device_reduce_2stage", "communication", "custom all-reduce", "custom all-reduce"),
    ("void dpsk::ep::internode::dispatch_ll", "communication", "DeepEP", "DeepEP dispatch/combine"),
    ("void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*, float*)", "attention", "cuDNN", "cuDNN SDPA"),
    ("attn_fwd", "attention", "FlashAttention", "Triton flash attention (attn_fwd)"),
])
def test_issue_names_land_where_they_belong(name, llm, family, implementation):
    assert classify_name(name, taxonomy("llm")) == llm
    assert (kernel_family(name), kernel_implementation(name)) == (family, implementation)


def test_flex_attention_is_generated_code():
    assert is_generated(kernel_family("triton_tem_fused_flex_attention_0"))
    assert not is_generated(kernel_family("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT"))


@pytest.mark.parametrize(("name", "precision"), [
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3", "mxfp4"),  # MXFP8 x MXFP4: narrowest operand
    ("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2", "mxfp4"),
    ("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT", "fp8"),
    ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", "bf16"),
    ("nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN", "bf16"),
    ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", "fp8"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT16x32x512", "bf16"),
    ("Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128", "fp32"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32", "fp16"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "fp32"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "bf16"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", ""),  # a byte type
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ""),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1>",
     "bf16"),  # KV-cache type 0 is "auto": not fp8
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, (vllm::Fp8KVCacheDataType)1>", "fp8"),
    ("void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::BlockScaleQuantizationType)2, "
     "__nv_bfloat16, 32, true>", "mxfp8"),
    ("void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::BlockScaleQuantizationType)0, "
     "__nv_bfloat16, 16, true>", "nvfp4"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0", ""),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_"
     "256x64_16x4_nn_align4::Params)", "tf32"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "std::array<char*, 3ul> >", "bf16"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half>", "fp16"),
    ("volta_sgemm_128x64_nn", "fp32"),
    ("test0(double *, unsigned long long, unsigned long long)", "fp64"),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)", ""),
    ("Memcpy HtoD (Pageable -> Device)", ""),
])
def test_precision_read_from_the_name(name, precision):
    assert kernel_precision(name) == precision


@pytest.mark.parametrize(("name", "family", "vendor"), [
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 2>(c10::BFloat16*)", "vLLM", "vLLM"),
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
     "aiter", "AMD"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> >", 
     "ATen reduction", "PyTorch"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long>", "ATen other", "PyTorch"),
    ("void clover::par_reduce_kernel<field_summary(global_variables &, parallel_ &)>(T1)", "other", ""),
    ("Cijk_Alik_Bljk_BBS_BH_Bias", "Tensile/hipBLASLt", "AMD"),
])
def test_family_and_vendor_by_rule_or_namespace(name, family, vendor):
    assert (kernel_family(name), kernel_vendor(name)) == (family, vendor)


def test_unmatched_names_are_other_everywhere():
    info = kernel_info("test0(double *, unsigned long long, unsigned long long)")
    assert (info.llm_category, info.moe_category, info.family, info.implementation) == ("other",) * 4
    assert classify_name("", taxonomy("moe")) == "other"
