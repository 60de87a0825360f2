"""The kernel knowledge base: one ordered table that says what a GPU kernel is, from its name.

Model
-----
Each :class:`KernelRule` is a regular expression searched (``re.search``, case-insensitive)
in the full kernel or memop name as the profiler prints it, template arguments included,
and what a match means: the category in each built-in taxonomy (``llm`` and ``moe``), the
family (the library or code generator, for the family table), the vendor, the
implementation, and real names from real traces that the rule is there for. The rules are
ordered and the first match wins; a name no rule matches is ``other`` everywhere.

Everything that reads a kernel's name reads this table: the built-in taxonomies of
:mod:`tracestory.analysis.categories` (a ``llm`` rule per entry, a ``moe`` rule per entry,
plus the two ``moe`` range rules in :data:`MOE_RANGE_RULES`), and the family,
implementation and vendor lookups of :mod:`tracestory.analysis.families`.

Why a Python data module and not a TOML file: every entry is a frozen dataclass, so a
misspelt field fails at import, regex fragments shared by several entries (the GEMM words
the ``moe`` range rules need) are written once, and the tests import the examples
directly. User rules stay TOML (``--rules FILE``, see categories.py) and go before or
instead of these.

Order matters, and the order is the argument:

1. memops, then communication (collective names carry data types such as ``f8e4m3`` and
   ``bf16`` that later rules would take);
2. Inductor-generated Triton kernels (``triton_poi_``/``triton_red_``/``triton_per_``/
   ``triton_tem_``): their names list every fused ATen op, and all of them decide (below);
3. TensorRT's kernels (``trt_*``, ``*_trt``, Myelin ``__myl_*``/``__mye*``, ``genericReformat``):
   TensorRT's family, filed by what the name says (conv/gemm tactics gemm, ``gemm_mha``
   attention, pooling reduction, reformats copy/layout = elementwise), before the attention and
   GEMM words they carry;
4. attention (CK-tile FMHA before FlashInfer, whose ``BatchPrefillWith`` words CK's paged prefill
   shares; SageAttention), then MoE routing, then GEMMs library by library, so a low-precision
   GEMM (``bmm_MxE4m3_MxE2m1*``, ``_matmul_ogs_*_mxfp4``) is a GEMM before any word about its
   precision is looked at;
5. norms (a fused norm+quant kernel is a norm), quantization, softmax, RoPE, embedding,
   reduction, elementwise.

Inductor kernels (``triton_<kind>_fused_<op>_..._<n>``) are decided by all their fused op words,
first rule that holds: a template naming flex_attention is attention, one naming mm/bmm/addmm/
conv is gemm; a forward pointwise kernel that materialises a broadcast (``expand`` + ``clone``, or
``repeat``: GQA's repeat_kv) and carries a rotation is a copy (elementwise), because the copy of
n_rep heads outweighs the rotation of one; a rotation (``cos``/``sin`` with the angle product
``mul``/``bmm`` or a ``cat`` of the halves, or ``cat`` + ``neg`` = rotate_half) is RoPE, even with a bmm (the angle product) or a QK-norm fused in; a reduction naming
mm/bmm is a decode GEMV; ``rsqrt``/``var_mean``/a norm op is a norm; ``softmax``, or a reduction
fusing ``max``/``amax`` with ``exp`` and ``sum``, is softmax (not ``amax`` alone: FP8 scales take one
too); embedding; other reductions; other pointwise kernels
(copies, expands, cat, index and math alike) are elementwise.

Precision is not a category: :data:`PRECISION_TOKENS` read it from the name (see
:func:`tracestory.analysis.families.kernel_precision`; a collective's ``int8_t`` is its byte type,
not a precision).

Limits: names are all a rule sees. A custom kernel named like a library's is counted as that
library; a cuDNN fusion-engine kernel (``cudnn::fusion::*``) is filed under attention
because in the traces we have cuDNN runs it inside SDPA, which is wrong for a norm fused
through cuDNN's graph API.
"""

from __future__ import annotations

import msgspec

# Example names: copied from the trace fixtures in tests/data (tests/data/kernel_names/labels.tsv
# lists every fixture name with its source), except these, as printed in public profiles:
# triton_tem_fused_flex_attention_backward_2, the DeepGEMM, CK, Marlin and aiter fmoe names,
# _matmul_ogs_*_swiglu, flashinfer::BatchPrefillWithPagedKVCacheKernel, fused_moe_kernel,
# aiter::reduce_scatter_cross_device_store (profiles and notes found through public GitHub
# text); cross_device_reduce_1stage/2stage (vllm-project/vllm#57042, sgl-project/sglang#6067);
# dpsk::ep::internode::dispatch_ll/combine_ll (deepseek-ai/profile-data#19);
# masked_multihead_attention_kernel (TensorRT-LLM/FasterTransformer MMHA); _w8a8_block_fp8_matmul
# (vLLM/SGLang Triton kernel). Some are a real name's leading part, where only that was printed.
# Inductor names of a Qwen3 training step (triton_per_fused__unsafe_view_add_bmm_cat_cos_mean_...,
# triton_red_fused_prepare_softmax_online_14, triton_poi_fused_clone_expand_unsqueeze_5 and the
# leading part ..._unsafe_view_add_bmm_cat_clone_cos_expand, labelled there as the KV-head repeat;
# its triton_poi_ prefix is ours, the source printed the fused part only),
# triton_tem_fused__to_copy__unsafe_view_bmm_clone_expand_unsqueeze_view_8 (a profile in a public
# write-up); triton_red_fused_div_exp_max_sub_sum_0 (a profiler table in a public issue);
# SageAttention's qk_int_sv_f8_attn_kernel, QuantInt8Kernel, MeanScaleKernel (a torch profiler
# table on sm_120 quoted in vllm-omni tests); CK-tile's
# _ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernel... (aiter) and
# ck_tile::kentry<ck_tile::gfx950_t, 2, ck_tile::FmhaFwdKernel<... (a profiling report on MI350X);
# TensorRT's trt_turing_h1688cudnn_*, trt_maxwell_sgemm_*, sm50_xmma_pooling_*_trt,
# genericReformat::copyPackedKernel, cuInt8::nchwToNhwcKernel, __myl_* and __mye*_gemm_mha_v2
# (nsys/ncu tables of TensorRT engines in public notes).

# GEMM words of every library in this table: the moe range rules use them to find GEMMs
# launched inside a router or expert range, whoever wrote them.
GEMM_WORDS = r"gemm|gemv|nvjet|xmma|cublas|cutlass|^Cijk_|^bmm_|matmul|deep_?gemm"


def _has(words: str) -> str:
    """Lookahead: one of ``words`` (an alternation) is a whole fused-op word of an Inductor name."""
    return rf"(?=\w*_(?:{words})(?:_|$))"


# A rotation: cos/sin tables built from an angle product or duplicated halves (cos or sin with mul, bmm
# or cat), or rotate_half (cat with neg). cos and sin of a tensor alone are math, not a rotation.
_ROTARY = ("(?:" + _has("cos|sin") + _has("mul|bmm|cat|mm|outer|einsum") + "|" + _has("cat") + _has("neg")
           + ")")
# A materialised broadcast: expand then clone (a contiguous copy of the view), or a repeat.
_HEAD_REPEAT = "(?:" + _has("expand") + _has("clone") + "|" + _has("repeat|repeat_interleave") + ")"


class KernelRule(msgspec.Struct, frozen=True):
    pattern: str  # regex, case-insensitive, re.search in the full name
    llm: str  # category in the llm taxonomy
    moe: str  # category in the moe taxonomy
    family: str  # library or code generator (the family table's row); "" = from NAMESPACES
    vendor: str  # who ships the kernel; "" = from NAMESPACES
    implementation: str  # which implementation inside the family
    examples: tuple[str, ...]  # real names (or a real name's printed leading part)
    note: str  # why the rule exists and sits where it sits


R = KernelRule

RULES: tuple[KernelRule, ...] = (
    # ------------------------------------------------------------------ memory operations
    R(r"^memcpy\b", "memcpy", "other", "memcpy", "driver", "copy engine",
      ("Memcpy HtoD (Pageable -> Device)", "Memcpy DtoD (Device -> Device)", "Memcpy DtoH (Device -> Pinned)"),
      "Copy-engine transfers as Kineto and nsys name them. The moe taxonomy counts kernels only (the MoE "
      "precision study's table), so copies are 'other' there but stay in the total."),
    R(r"^memset\b", "memset", "other", "memset", "driver", "memset",
      ("Memset (Device)", "Memset (Unknown)"),
      "Memsets, named 'Memset (Device)' by Kineto."),
    # ------------------------------------------------------------------ communication
    R(r"^nccl|nccl(Dev)?Kernel", "communication", "allreduce", "NCCL", "NVIDIA/AMD", "NCCL/RCCL",
      ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
       "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
       "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
       "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
      "First among kernels: collective names carry reduce ops and data types (AllReduce_Sum_f8e4m3, "
      "Broadcast_..._int8_t) that quantization would take. RCCL keeps NCCL's kernel names, so the two "
      "are one implementation here."),
    R(r"multimem_all_reduce|multimem_all_gather|one_shot_all_reduce|two_shot_all_reduce|symm_mem",
      "communication", "allreduce", "symmetric memory", "PyTorch", "symmetric-memory all-reduce",
      ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
       "unsigned int**, unsigned long, unsigned long)",),
      "torch.distributed._symmetric_memory collectives (NVLS multimem stores, one/two-shot all-reduce), "
      "used by vLLM for tensor-parallel all-reduce on Blackwell: not NCCL, still communication."),
    R(r"cross_device_reduce|custom_?all_?reduce|allreduce_?fusion|lamport|oneShotAllReduce|twoShotAllReduce",
      "communication", "allreduce", "custom all-reduce", "vLLM/SGLang/TensorRT-LLM", "custom all-reduce",
      ("cross_device_reduce_2stage", "cross_device_reduce_1stage"),
      "Peer-to-peer all-reduce kernels of vLLM, SGLang, aiter and TensorRT-LLM (cross_device_reduce_1stage/"
      "2stage, oneShot/twoShot, Lamport): they bypass NCCL/RCCL."),
    R(r"deep_ep::|dpsk::ep::|internode_ll::|intranode::(dispatch|combine|notify)|internode::(dispatch|combine|notify)",
      "communication", "allreduce", "DeepEP", "DeepSeek", "DeepEP dispatch/combine",
      ("void dpsk::ep::internode::dispatch_ll", "void dpsk::ep::internode::combine_ll"),
      "Expert-parallel all-to-all: DeepEP dispatch/combine (normal and low-latency) move tokens between "
      "ranks. The moe taxonomy's 'allreduce' is its communication category."),
    R(r"all_?reduce|reduce_?scatter|all_?gather|all_?to_?all|sendrecv|nvshmem", "communication", "allreduce",
      "", "", "collective (named)",
      ("aiter::reduce_scatter_cross_device_store<bf16,8>",),
      "Any other kernel that says it is a collective (aiter's reduce-scatter, NVSHMEM kernels). After "
      "the named libraries so they keep their names."),
    # ------------------------------------------------------------------ Inductor (torch.compile)
    # Inductor names a kernel after every op fused into it; these rules read all of them (see
    # "Inductor kernels" in the module docstring for the rule in words).
    R(r"^triton_tem_fused_\w*flex_(attention|decoding)|^triton_tem_\w*flex", "attention", "attention_gemm",
      "Triton template (attention)", "PyTorch", "FlexAttention (Inductor template)",
      ("triton_tem_fused_flex_attention_0", "triton_tem_fused_flex_attention_backward_2"),
      "torch.compile's FlexAttention: an attention template, not a matmul template."),
    R(r"^triton_tem_" + _has("mm|addmm|bmm|baddbmm|conv|convolution"), "gemm", "gate_gemm",
      "Triton template (matmul)", "PyTorch", "Inductor mm template",
      ("triton_tem_fused_mm_0", "triton_tem_fused__to_copy__unsafe_view_bmm_clone_expand_unsqueeze_view_8"),
      "max-autotune matmul/conv templates, whatever pointwise ops are fused as their prologue or epilogue "
      "(a bmm template named after a clone/expand of its input is still the bmm)."),
    R(r"^triton_poi_" + _HEAD_REPEAT + r"(?!\w*backward)" + _ROTARY, "elementwise", "other",
      "Triton fused pointwise", "PyTorch", "Inductor copy/layout (head repeat)",
      ("triton_poi_fused__unsafe_view_add_bmm_cat_clone_cos_expand",),
      "A forward kernel that materialises a broadcast (expand + clone, repeat, repeat_interleave: GQA's "
      "repeat_kv) is a copy: it writes n_rep copies of the keys/values, while a rotation fused into it touches "
      "only its input once. The first names (cat, cos, neg) used to file it as RoPE."),
    R(r"^triton_(poi|tem)_\w*" + _ROTARY, "rope", "other",
      "Triton fused pointwise", "PyTorch", "Inductor RoPE",
      ("triton_poi_fused_cat_cos_mul_sin_0", "triton_poi_fused_add_cat_mul_neg_slice_3",
       "triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_cat_mul_neg_slice_transpose_view_3"),
      "Inductor kernels that compute cos/sin tables or rotate_half (cat(-x2, x1): cat with neg) are RoPE, "
      "even when the attention op they feed is named in them."),
    R(r"^triton_(red|per)_\w*" + _ROTARY, "rope", "other",
      "Triton fused reduction", "PyTorch", "Inductor RoPE",
      ("triton_per_fused__unsafe_view_add_bmm_cat_cos_mean_mul_neg_pow_rsqrt_sin_slice_transpose_unsqueeze_view_3",),
      "A reduction with a rotation fused in: the bmm beside cos/sin is the angle product (inv_freq x positions, "
      "not a GEMM) and the mean/rsqrt a QK-norm applied before the rotation (Qwen3); in a backward kernel the "
      "sum is the rotation's gradient. RoPE before the GEMV and norm rules for that reason."),
    R(r"^triton_(red|per)_fused\w*_(add|b)?mm(_|$)", "gemm", "gate_gemm",
      "Triton fused reduction", "PyTorch", "Inductor decode GEMV (reduction)",
      ("triton_red_fused_mm_t_view_12", "triton_red_fused__to_copy__unsafe_view_add_mean_mm_mul_pow_rsqrt_t_view_7",
       "triton_red_fused__unsafe_view_mm_mul_silu_t_view_8", "triton_red_fused__to_copy__unsafe_view_add_mean_mm_pow_6"),
      "Inductor lowers small-M matmuls (decode GEMVs) to reductions named after the fused ops: the weight "
      "read dominates them, so they are gemm even when a norm is fused in."),
    R(r"^triton_\w*(rsqrt|var_mean|native_layer_norm|native_group_norm|native_batch_norm|rms_norm|layer_norm)",
      "norm", "norm", "Triton fused reduction", "PyTorch", "Inductor reduction",
      ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_4",
       "triton_red_fused__fused_rms_norm__unsafe_view_add_3"),
      "Inductor kernels are named after the ops they fuse: rsqrt with mean/pow is RMSNorm, var_mean + rsqrt "
      "is LayerNorm, and torch 2.11 names the fused RMSNorm op itself (_fused_rms_norm)."),
    R(r"^triton_\w*softmax|^triton_(red|per)_" + _has("exp") + _has("sum") + _has("max|amax"), "softmax", "other",
      "Triton fused reduction", "PyTorch", "Inductor reduction",
      ("triton_per_fused__softmax_2", "triton_red_fused_prepare_softmax_online_14",
       "triton_red_fused_div_exp_max_sub_sum_0"),
      "Inductor softmax (a reduction over the row), also its online form (prepare_softmax_online) and a "
      "hand-written one (max, exp and sum fused in one reduction). Not amax alone: an amax is as often an "
      "FP8 scale as a softmax's first pass."),
    R(r"^triton_\w*embedding", "embedding", "routing_permute", "Triton fused pointwise", "PyTorch",
      "Inductor pointwise", ("triton_poi_fused_embedding_0",),
      "Inductor embedding lookups (an indexed gather)."),
    R(r"^triton_(red|per)_", "reduction", "other", "Triton fused reduction", "PyTorch", "Inductor reduction",
      ("triton_red_fused__to_copy_mean_pow_0",),
      "The Inductor reductions not claimed above."),
    R(r"^triton_poi_", "elementwise", "other", "Triton fused pointwise", "PyTorch", "Inductor pointwise",
      ("triton_poi_fused_add_mul_0", "triton_poi_fused__unsafe_view_mul_silu_5",
       "triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0",
       "triton_poi_fused_clone_expand_unsqueeze_5"),
      "Inductor pointwise kernels not claimed above: math (add, mul, silu) and copies/layout changes (clone, "
      "expand, cat, index, _to_copy) alike; the llm taxonomy has one category for both."),
    # ------------------------------------------------------------------ TensorRT
    # TensorRT engines run their own kernels (trt_* builtins, *_trt xmma tactics, Myelin's __myl_/__mye
    # generated kernels, genericReformat layout copies): TensorRT's family, not cuDNN's or cuBLAS's,
    # each filed by what its name says it does. Before attention and GEMMs: their names say gemm, mha,
    # relu, pool.
    R(r"^__mye\w*mha|^_gemm_mha_v\d|^__myl_\w*mha", "attention", "attention_gemm", "TensorRT", "NVIDIA",
      "TensorRT Myelin MHA",
      ("__mye8037_gemm_mha_v2", "_gemm_mha_v2_0x7d506f90cde376753e5ca2590e8e79f6"),
      "Myelin's fused multi-head attention in a TensorRT engine (gemm_mha_v2): attention, though its name "
      "says gemm."),
    R(r"^trt_\w*(gemm|cudnn|conv|fprop|dgrad|wgrad)|^sm\d+_xmma_\w*(gemm|fprop|dgrad|wgrad|conv)\w*_trt$|"
      r"^__myl_(bb\d+_\d+_)?(fc|matmul|gemm|conv)|(^|[^a-z])trt[^a-z]\w*(gemm|fprop|conv)", "gemm", "gate_gemm", "TensorRT", "NVIDIA",
      "TensorRT GEMM/convolution",
      ("trt_turing_h1688cudnn_256x128_ldg8_relu_exp_small_nhwc_tn_v1", "trt_maxwell_sgemm_32x128_relu_tn_v1",
       "__myl_FcCast_"),
      "TensorRT's convolution and GEMM tactics (trt_<arch>_*cudnn*/sgemm builtins, smXX_xmma_* tactics ending "
      "in _trt, Myelin kernels that start with a fully connected layer, Fc/MatMul): GEMMs, as cuDNN's "
      "convolutions are, but TensorRT's."),
    R(r"xmma_pooling\w*_trt$|^trt_\w*pool", "reduction", "other", "TensorRT", "NVIDIA", "TensorRT pooling",
      ("sm50_xmma_pooling_coalescedC_NHWC_kMAX_3_False_execute_kernel_trt",),
      "TensorRT's pooling tactics: a reduction over a window, like ATen's pooling."),
    R(r"^__myl_\w*mea\w*(sqr|rsq)", "norm", "norm", "TensorRT", "NVIDIA", "TensorRT Myelin fused",
      ("__myl_bb0_1_AddCasMulMeaSubMulMeaAddSqrDivMulCasMulAdd",),
      "Myelin names a fused kernel after its ops, three letters each (Add, Cas(t), Mul, Mea(n), Sub, Sqr(t), "
      "Div): a mean, then a square root of a second mean, is a LayerNorm/RMSNorm."),
    R(r"genericReformat|^(void )?cuInt8::|generatedNativePointwise|^__myl_|(^|[^a-z])trt([^a-z]|$)", "elementwise",
      "other",
      "TensorRT", "NVIDIA", "TensorRT reformat/pointwise",
      ("void genericReformat::copyPackedKernel<float, float, (bool)0, (bool)1, genericReformat::IdentityCoordMapper"
       "<(int)4>, (int)4>(unsigned int, unsigned int, const void *, genericReformat::ArrayN<T6>, genericReformat::"
       "ArrayNWit",
       "void cuInt8::nchwToNhwcKernel<float>(int, int, int, int, int, int, int, int, bool, const T1 *, T1 *)",
       "__myl_bb1_2_TraSliSliResTraResMovSli", "__myl_MulMulMulMulMulMulAddAddAddAddAddAddConcAdd"),
      "TensorRT's layout and precision reformats between layers (genericReformat, cuInt8:: layout kernels: "
      "copies), Myelin's fused pointwise kernels (Tra(nspose), Sli(ce), Res(hape), Mov(e), Mul, Add), and any "
      "other kernel named TRT as a word (trt_*, *_trt, *::trt::*; not trtllm): pointwise or copy/layout work."),
    # ------------------------------------------------------------------ attention
    R(r"ck_tile::\w*fmha|_zn7ck_tile\w*fmha|fmha_fwd|fmha_bwd|aiter::mha|aiter\w*fmha|mha_fwd|mha_bwd", "attention",
      "attention_gemm", "CK/aiter", "AMD", "CK (Composable Kernel) FMHA",
      ("_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFmhaBatchPrefill"
       "PipelineQRKSVSAsyncINS_36BlockFmhaBatchPrefillPipelineProblemIDF16bDF16bDF16bffDF16bhfDF16bfDF16bNS_13"
       "TileFmhaShapeINS_8seq",
       "ck_tile::kentry<ck_tile::gfx950_t, 2, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSSageAttn<"),
      "AMD Composable Kernel's tile FMHA (ck_tile::FmhaFwdKernel, FmhaBatchPrefillWithPagedKVCacheKernel) as "
      "flash-attention on ROCm and aiter run it, and aiter's fmha_fwd/bwd kernels. Before FlashInfer: CK's batch "
      "prefill kernel is named like FlashInfer's (BatchPrefillWith...); before SageAttention: CK's "
      "SageAttention pipeline (BlockFmhaPipelineQRKSVSSageAttn) is CK's kernel."),
    R(r"pytorch_flash::|flash_fwd|flash_bwd|FlashAttnFwd|FlashAttnBwd|flash::", "attention", "attention_gemm",
      "FlashAttention", "Dao-AILab", "FlashAttention 2/3",
      ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
       "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, "
       "true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
       "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, 0, 0, bfloat16_t, Flash_kernel_traits<128, "
       "128, 64, 4, bfloat16_t>>, 0, 1, 0, 0, 1, 1, 0, 0>(Flash_fwd_params)",
       "void flash::FlashAttnFwdSm90<int>(flash::Params)"),
      "FlashAttention 2 (pytorch_flash:: inside PyTorch SDPA, flash_fwd_* in flash-attn and vLLM) and 3 "
      "(flash::FlashAttnFwdSm90). Before GEMMs: their template arguments say cutlass."),
    R(r"flashinfer::\w*(Prefill|Decode|Attention|MLA|Cascade|Merge)|BatchPrefillWith|BatchDecodeWith|"
      r"SinglePrefillWith|SingleDecodeWith",
      "attention", "attention_gemm", "FlashInfer", "FlashInfer", "FlashInfer",
      ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<(flashinfer::",),
      "FlashInfer attention. Not every kernel that names flashinfer: SGLang's create_flashinfer_kv_indices_triton "
      "only builds the KV page table (index bookkeeping, below), and TRT-LLM's FP4/MXFP8 quantizers take a "
      "flashinfer::QuantizationSFLayout argument."),
    R(r"^fmhaSm\d+|fmha_v2_|fmhaKernel|xqa", "attention", "attention_gemm", "trtllm-gen", "NVIDIA",
      "trtllm-gen FMHA / XQA",
      ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext",
       "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvSlidingOrChunkedCausalP16VarSeqQ128Kv128PersistentContext"),
      "TensorRT-LLM's generated attention (trtllm-gen fmhaSm100*, fmha_v2, XQA), also shipped in "
      "FlashInfer; QkvE4m3 is FP8 attention, still attention."),
    R(r"fmha_cutlass|PyTorchMemEffAttention|AttentionKernel<|efficient_attention|mem_eff", "attention",
      "attention_gemm", "FlashAttention", "PyTorch/xFormers", "memory-efficient attention (CUTLASS)",
      ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
       "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)",
       "fmha_cutlassF_f32_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::Sm80, "
       "1, 64, 128, 128, 1, 1>::Params)"),
      "xFormers' memory-efficient attention as vendored in PyTorch SDPA (fmha_cutlassF forward, "
      "fmha_cutlassB backward). Before CUTLASS GEMMs."),
    R(r"cudnn_generated_fort_native_sdpa|_sdpa_|cudnn::fusion::", "attention", "attention_gemm", "cuDNN",
      "NVIDIA", "cuDNN SDPA",
      ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
       "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128_1x4x1_cga1x1x1_kernel0_0",
       "void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*, float*, float*, float*, float*, "
       "float const*, float*, float*, float*, float*, float*, unsigned int, unsigned int, unsigned int, unsigned int"),
      "cuDNN's fused attention (SDPA cudnn backend) and the fusion-engine kernels it launches with it "
      "(lean_reduction_kernel computes the softmax statistics inside the attention op)."),
    R(r"qk_int8_sv_f8_accum_f\d+_attn|qk_int_sv_f(8|16)_attn|sageattn|sage_?attention|^sage_fwd", "attention",
      "attention_gemm", "SageAttention", "THU-ML", "SageAttention",
      ("void qk_int_sv_f8_attn_kernel<128u, 64u, 32u, 64u, 128u, (DataType)1>",
       "qk_int8_sv_f8_accum_f32_attn_inst_buf", "sage_fwd"),
      "SageAttention (INT8 QK^T, FP8 PV): its CUDA kernels (qk_int_sv_f8_attn_kernel, qk_int_sv_f16_attn_kernel), "
      "its Triton kernel (sage_fwd, as xDiT runs it on AMD GPUs) and the ops that launch them (qk_int8_sv_f8_accum_f32_attn*). Attention, not quantization: the int8/fp8 "
      "words are its operand types."),
    R(r"^(void )?(QuantInt8Kernel|MeanScaleKernel|TransposePadPermuteKernel)<|^sage_quant", "quantization",
      "quant_dequant", "SageAttention", "THU-ML", "SageAttention quantization",
      ("void QuantInt8Kernel<128u, 32u, 1u, false, false, __nv_bfloat16>",
       "void MeanScaleKernel<64u, false, __nv_bfloat16>", "sage_quant_kernel"),
      "SageAttention's prologue: Q/K quantized to INT8 per block (QuantInt8Kernel, after smoothing K by its mean, "
      "MeanScaleKernel) and V transposed and scaled to FP8. Its cost belongs to the attention's choice of "
      "SageAttention, filed under quantization."),
    R(r"^attn_fwd|^_attn_fwd|attn_bwd", "attention", "attention_gemm", "FlashAttention", "AMD",
      "Triton flash attention (attn_fwd)",
      ("attn_fwd",),
      "The Triton flash-attention kernel (attn_fwd) that PyTorch SDPA and vLLM run on MI300X (also the name of "
      "Triton's tutorial kernel and SageAttention's Triton path, which a name cannot tell apart)."),
    R(r"paged_attention|paged_?(?:decode_|prefill_)?attn|pa_fwd|decode_attention|prefill_attention|unified_attention",
      "attention", "attention_gemm", "", "", "paged attention",
      ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, "
       "1, 128, 256, false, 4, 1, ck_tile::ComposedAttention<0u, false> >(__hip_bfloat16 const*, __hip_bfloat16 "
       "const*, __hip_bfloat16 const*, float, int const*, int const*, int const*, float const*, int, int, int, int",
       "void paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, __hip_bfloat16, 128, 128, 256, 3, false>"
       "(__hip_bfloat16*, float const*, float const*, __hip_bfloat16 const*, int const*, int const*, int, int, "
       "float const*)"),
      "vLLM/SGLang paged attention (CUDA v1/v2, ROCm ll4mi with its split-KV reduce) and the Triton "
      "decode/prefill attention of the serving stacks."),
    R(r"reshape_and_cache|store_kvcache|kv_?cache_?(write|store|copy)|concat_and_cache",
      "attention", "attention_gemm", "", "", "KV-cache write",
      ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, (vllm::Fp8KVCacheDataType)1>"
       "(__nv_bfloat16 const*, __nv_bfloat16 const*, unsigned char*, unsigned char*, long const*, long, long, long",
       "void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::StoreKVCacheParams)"),
      "Writes of new keys and values into the paged KV cache: part of the attention layer's cost in a "
      "serving engine. Copies of page indices (block-table rows) are not: they move integers, not "
      "keys and values (pointwise, below)."),
    R(r"mha|attention|attn|sdpa", "attention", "attention_gemm", "", "", "attention (named)",
      ("void mmha::masked_multihead_attention_kernel",),
      "Any other kernel that says it is attention."),
    # ------------------------------------------------------------------ MoE routing
    R(r"moe::dev::routing|moe::dev::finalize|moe_align|count_and_sort_expert|topkGating|moe_sum|moe_fused_gate|"
      r"expandinputrows|expert_?(map|count|offset|id)|moe_?(permute|unpermute|routing|gating)|grouped_topk",
      "moe_routing", "routing_permute", "", "", "MoE routing/permute",
      ("void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingRenormalize::KernelParams"
       "<__nv_bfloat16, __nv_bfloat16, 128, false, true, true> >(moe::dev::routing::routingRenormalize::KernelParams"
       "<__nv_bfloat16, _",
       "void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, "
       "cutlass::bfloat16_t, 4, true> >(moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutlass::bfloat16_t, "
       "4, true>)",
       "void moe_align_block_size_kernel<int>(const T1 *, int *, ", "count_and_sort_expert_tokens_kernel",
       "void vllm::moe::topkGatingSoftmax"),
      "Token routing around the experts: top-k gating, histogram/offsets of tokens per expert, permute and "
      "the finalize (unpermute + weighted sum). Before GEMMs: templated on cutlass and fp8 types."),
    # ------------------------------------------------------------------ GEMM and convolution
    R(r"^bmm_\w*_(Fp32|Bfloat16|Fp16)_t\d+|^bmm_(MxE|E4m3|E2m1|Bfloat16|Fp16|MxInt)", "gemm", "expert_gemm",
      "trtllm-gen", "NVIDIA", "trtllm-gen batched GEMM",
      ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_"
       "schedP2x1x2x3_biasM_bN_tma_tmaOpt_clmp_swiGlu_dynBatch_sm100f",
       "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_"
       "schedP2x1x2x3_biasM_bN_tmaOpt_clmp_dynBatch_sm100f"),
      "TensorRT-LLM's generated batched GEMMs (bmm_<A>_<B><C>_<acc>_t<tile>..._dynBatch): the MoE expert "
      "GEMMs of FlashInfer/vLLM on Blackwell. MxE2m1 weights are MXFP4, but a low-precision GEMM is a GEMM."),
    R(r"_matmul_ogs|matmul_ogs", "gemm", "expert_gemm", "Triton (triton_kernels)", "OpenAI Triton",
      "matmul_ogs", ("_matmul_ogs_NNT_bf16xbf16xmxfp4_32x256x256x1_swiglu",),
      "triton_kernels' matmul_ogs (outer-gather-scatter): the MoE expert GEMM of gpt-oss in vLLM, often MXFP4."),
    R(r"deep_?gemm|fp8_gemm_kernel|m_grouped|sm90_fp8_gemm|sm100_fp8_gemm|fp8_gemm_1d", "gemm", "expert_gemm",
      "DeepGEMM", "DeepSeek", "DeepGEMM",
      ("void deep_gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 160u, 128u, 0u, 64u, 9u, 4u, 128u, 128u, 1u, true, "
       "(deep_gemm::GemmType)1>(__nv", "deep_gemm::fp8_gemm_kernel_swapAB"),
      "DeepSeek's FP8 GEMMs (dense and grouped for MoE)."),
    R(r"fused_moe_kernel|(^|[^a-z])fmoe|moe_?gemm|moefcgemm|grouped_?(gemm|mm)|group_?gemm|moe_wna16|"
      r"fused_moe|nvfp4_gemm|fp4_gemm|ck_moe|kernel_moe_gemm", "gemm", "expert_gemm", "", "", "grouped/fused MoE GEMM",
      ("fused_moe_kernel", "_ZN5aiter52fmoe_bf16_blockscaleFp8_g1u1_novs_silu_1tg_ps_32x256E"),
      "Names that say they are MoE or grouped GEMMs (vLLM/SGLang fused_moe_kernel, aiter fmoe, TRT-LLM "
      "MoeFCGemm, grouped FP8/NVFP4 GEMMs): gemm in llm, expert_gemm in moe."),
    R(r"^nvjet", "gemm", "gate_gemm", "cuBLAS/nvjet", "NVIDIA", "cuBLAS (nvjet)",
      ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT",
       "nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN"),
      "cuBLAS's Hopper/Blackwell GEMMs (nvjet_[smXX_]<types>_<tile>...). In moe, dense projections and "
      "the router gate are cuBLAS GEMMs (the MoE precision study's rule)."),
    R(r"^sm\d+_xmma_gemm|_cublas$|cublas|^(volta|ampere|turing|maxwell|pascal|hopper|blackwell)_\w*gemm|"
      r"gemv|gemmSN|gemmk1|splitKreduce", "gemm", "gate_gemm", "cuBLAS/nvjet", "NVIDIA", "cuBLAS",
      ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
       "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
       "ampere_sgemm_32x128_nt", "volta_sgemm_128x64_nn",
       "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
       "(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, flo",
       "void splitKreduce_kernel<float, float, float>(cublasSplitKParams<float>, float const*, float const*, "
       "float*, float const*, float const*)"),
      "cuBLAS's older kernels (smXX_xmma_gemm_*_cublas, <arch>_sgemm_*, gemv) and cuBLASLt's split-K "
      "reduction, which finishes a split-K GEMM."),
    R(r"^Cijk_", "gemm", "gate_gemm", "Tensile/hipBLASLt", "AMD", "Tensile/hipBLASLt",
      ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_"
       "CADS0_DTLA0_DTLB0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMBSK_GLS0_ISA942_IU1_K1_LDSTI0_"
       "LBSPPA512_LBSPPB256_LBSPPM0_LP",
       "Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_"
       "CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA2_GRVWB2_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA256_LBSPPB512_"
       "LBSPPM0_LPA16_LPB8_LPM0_LRVW4_LWPM"),
      "AMD's GEMMs (rocBLAS and hipBLASLt both run Tensile kernels): Cijk_<A index order>_<B index order>_"
      "<types>_..._MT<tile>_MI<matrix instruction>_..._ISA942 (MI300X)."),
    R(r"ck::kernel_gemm|_ZN2ck\d+kernel_gemm|ck_tile::\w*Gemm|device_gemm|aiter::\w*gemm|gemm_a8w8|gemm_a16w16",
      "gemm", "gate_gemm", "CK/aiter", "AMD", "Composable Kernel / aiter GEMM",
      ("void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<ck::tensor_layout::"
       "gemm::RowMajor, c",
       "_ZN2ck59kernel_gemm_xdl_cshuffle_v3_multi_d_blockscale_b_preshuffleINS_58GridwiseGemm"),
      "AMD Composable Kernel and aiter GEMMs."),
    R(r"marlin", "gemm", "gate_gemm", "Marlin", "IST Austria/vLLM", "Marlin",
      ("void marlin::Marlin<(long)1125899906910725, (long)1125899906843648, (long)1125899906910725",),
      "Marlin weight-only quantized GEMMs (GPTQ/AWQ int4, fp8)."),
    R(r"^sm\d+_xmma_(fprop|dgrad|wgrad)|scudnn|convolve_sgemm|cudnn::cnn::|cudnn::detail::(dgrad|wgrad)|"
      r"winograd|cutlass_cudnn|cutlass_tensorop_\w*(fprop|dgrad|wgrad)|cask_cudnn|im2col|dgrad_engine|wgrad_alg",
      "gemm", "gate_gemm", "cuDNN", "NVIDIA", "cuDNN convolution",
      ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
       "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer",
       "volta_scudnn_128x64_relu_interior_nn_v1", "cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1",
       "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, true, true>(int, int, int, "
       "float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, "
       "float const*, float const",
       "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::"
       "WinogradDataParams<float, float>)",
       "cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)"),
      "Convolutions run as GEMMs (implicit/explicit GEMM, Winograd, cuDNN's CUTLASS kernels) and the "
      "helpers cuDNN launches for them (offset tables, im2col, split-K wgrad reductions). Before CUTLASS."),
    R(r"cutlass", "gemm", "expert_gemm", "CUTLASS", "NVIDIA", "CUTLASS",
      ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>"
       "(cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4::Params)",
       "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
       "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)"),
      "CUTLASS GEMMs. In moe they are expert GEMMs (the MoE precision study's rule: serving stacks run "
      "expert GEMMs in CUTLASS and dense projections in cuBLAS); split them with a range rule when not."),
    R(r"gemm|matmul|wgmma|_mm_kernel|scaled_mm", "gemm", "gate_gemm", "", "", "GEMM (named)",
      ("_w8a8_block_fp8_matmul",),
      "Any other kernel that says it is a matrix multiply."),
    # ------------------------------------------------------------------ norms
    R(r"layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm|rowwisemoments|computefusedparams|"
      r"gammabetabackward|(^|[^a-z])bn_(fw|bw)", "norm", "norm", "", "", "normalization",
      ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 2>(c10::BFloat16*, c10::BFloat16 const*, long, long, long, "
       "long, long, c10::BFloat16 const*, float, int, int)",
       "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
       "void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args<float>)",
       "ts_rmsnorm_kernel"),
      "Normalization layers: ATen layer/group/batch norm, vLLM/FlashInfer/aiter RMSNorm (a fused add+"
      "RMSNorm+quant is a norm: the quant is its epilogue), cuDNN batch norm. An eager RMSNorm runs as "
      "separate pow/mean/rsqrt/mul kernels, which names cannot tell apart from other elementwise work."),
    # ------------------------------------------------------------------ quantization
    R(r"quant|float8|fp8|fp4|mxfp|e4m3|e5m2|e2m1|cast_transpose|abs_amax|amax_kernel|compute_amax|cvt_",
      "quantization", "quant_dequant", "", "", "quantize/dequantize",
      ("void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*, "
       "c10::BFloat16 const*, float const*, int, long, long)",
       "void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::BlockScaleQuantizationType)2, "
       "__nv_bfloat16, 32, true>(int, int, int, int, __nv_bfloat16 const*, float const*, unsigned int*, "
       "unsigned int*, flashinfer::QuantizationSFLayout)",
       "void at::native::vectorized_elementwise_kernel<4, at::native::float8_copy_kernel_cuda(a"),
      "Kernels that convert to or from low precision and are not GEMMs, attention or norms (those "
      "rules come first, so their fp8/fp4 words never reach this one)."),
    # ------------------------------------------------------------------ softmax, rope, embedding
    R(r"softmax", "softmax", "other", "", "", "softmax",
      ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true>(float*, float const*, "
       "int, int, int)",
       "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, "
       "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::Half*, c10::Half const*, int)"),
      "ATen softmax_warp_*, cunn_SoftMax*. After routing (topkGatingSoftmax) and attention (which "
      "computes a softmax inside)."),
    R(r"rotary|(?<!p)rope(?!rt)", "rope", "other", "", "", "rotary embedding",
      ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, "
       "c10::BFloat16 const*, int, long, long, long, int, int, int)", "_rope_kernel"),
      "Rotary position embeddings (rotary_embedding_kernel, *ApplyRotary*, *Rope*). Before embedding: "
      "vLLM's rotary_embedding_kernel says 'embedding' too."),
    R(r"embedding|indexselect|index_select", "embedding", "routing_permute", "", "", "embedding lookup",
      ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, "
       "-2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo",),
      "Token embedding lookups: ATen indexSelectLargeIndex/SmallIndex and embedding kernels. In moe an "
      "indexed gather is routing/permutation work."),
    # ------------------------------------------------------------------ reductions
    R(r"sbtopk|topk|top_k|radixsort|sort|gatherTopK", "reduction", "routing_permute", "", "", "top-k / sort",
      ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float "
       "const, unsigned",
       "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<unsigned long, unsigned int, int>"
       "::Policy800, false, unsigned long, unsigned int, int, int>(int*, int*, int*, int const*, u"),
      "Top-k and sorts: a selection, so reduction in llm (in a dense model they are sampling's top-k and sort, "
      "and the name cannot tell routing from sampling); routing in the moe taxonomy, which is for MoE models."),
    R(r"reduce_kernel|reduction|devicescan|devicereduce|scan_impl|wrapped_scan|cumsum|cumprod|argmax|argmin|"
      r"welford|pool|par_reduce|vector_dot|ClassNLLCriterion_updateOutput|nll_loss_forward|reduce_",
      "reduction", "other", "", "", "reduction",
      ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
       "unsigned int, long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, lon",
       "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*, int, int, "
       "int, int, int, int, int, int, int, int, int, int, int, int, float*, long*)",
       "void rocprim::ROCPRIM_400200_NS::detail::trampoline_kernel<rocprim::ROCPRIM_400200_NS::detail::"
       "wrapped_scan_config<rocprim::ROCPRIM_400200_NS::default_config, long>",
       "vector_dot(double const*, double const*, unsigned long, double*)",
       "void cunn_ClassNLLCriterion_updateOutput_kernel<float, float>(float*, float*, float*, long*, float*, int, "
       "int, int, int, long)"),
      "ATen reduce_kernel (sum, mean, max, argmax, all), CUB/rocPRIM scans, pooling, the NLL loss's "
      "forward (a sum over the batch), and reductions of HPC codes (CloverLeaf's par_reduce_kernel, a dot "
      "product). After communication (AllReduce) and norm/softmax (which reduce inside)."),
    # ------------------------------------------------------------------ elementwise
    R(r"gather|scatter|index_put|index_elementwise|index_kernel", "elementwise", "routing_permute", "", "", "gather/scatter/index",
      ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
       "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
       "index_kernel_impl<at::native::OpaqueType<2> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<lon"),
      "Indexed copies (gather, scatter, index, index_put): elementwise data movement in llm, token "
      "permutation in moe."),
    R(r"elementwise|vectorized_|unrolled_|functor|copy|fill|catarray|nchwtonhwc|nhwctonchw|transpose|"
      r"multi_tensor_apply|act_and_mul|silu|gelu|relu|swiglu|dropout|clamp|where|scalePackedTensor|"
      r"ClassNLLCriterion_updateGradInput|arange|future_token_ids|upsample|create_flashinfer_kv_indices",
      "elementwise", "other", "", "", "pointwise",
      ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
       "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
       "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::"
       "OpaqueType<2u>, unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::",
       "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i",
       "void (anonymous namespace)::clamp_position_kernel<long>(long*, long const*, unsigned long)",
       "_copy_page_indices_kernel", "create_flashinfer_kv_indices_triton",
       "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>"
       "(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)"),
      "Pointwise math, activations, copies, fills and layout changes (ATen elementwise kernels, "
      "CatArrayBatchedCopy, cuDNN layout transforms, foreach optimizer kernels, serving stacks' small "
      "index bookkeeping kernels such as vLLM's page-index copy and SGLang's FlashInfer page-table build, the NLL loss's backward, which writes one "
      "value per row, nearest/linear upsampling, one output from one or a few inputs)."),
    R(r"par_ranged[12]d_kernel|^vector_(add|mul|sub|scale)|^init_array", "elementwise", "other", "", "", "parallel-for loop",
      ("void clover::par_ranged2d_kernel<build_field(global_variables &)::[lambda(int, int) (instance 1)]>"
       "(clover::Range2d, T1)",
       "vector_add(double const*, double const*, unsigned long, double*)", "init_array(double*, unsigned long)"),
      "Loop bodies of HPC codes that compute one output per index (CloverLeaf's par_ranged1d/2d_kernel "
      "stencil loops, vector add/mul, array init): pointwise/stencil work, memory-bound like elementwise."),
)

# moe: the range rules go before the rule with this implementation (the first library GEMM rule
# after communication, Inductor, attention and routing).
MOE_RANGE_RULES_BEFORE = "trtllm-gen batched GEMM"
# moe: a GEMM launched inside a router range is the gate GEMM, inside an expert range an
# expert GEMM, whoever wrote it. They go before the first GEMM rule of RULES (after
# communication, Inductor and attention, so an attention kernel in an expert range stays
# attention). (category, kernel regex, range regex, note)
MOE_RANGE_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("gate_gemm", GEMM_WORDS, r"(^|[^a-z])(router|gate|gating)([^a-z]|$)",
     "The MoE precision study's future work: a GEMM launched inside the router's NVTX / record_function range "
     "is the gate GEMM, whatever library ran it (tracestory bench moe marks that range 'router')."),
    ("expert_gemm", GEMM_WORDS, r"expert",
     "A GEMM launched inside an expert range ('expert_gemm' in tracestory bench moe, 'experts' elsewhere) is an "
     "expert GEMM even when its name is a plain cuBLAS one."),
)

# Library of a kernel whose rule leaves family and vendor empty (rules by what a kernel does,
# not by who wrote it: norms, softmax, elementwise, ...): the first namespace found in the
# name. ATen's family also says what the kernel does (the small-op families of compare).
# (family, vendor, regex searched case-sensitively)
NAMESPACES: tuple[tuple[str, str, str], ...] = (
    ("vLLM", "vLLM", r"vllm::"),
    ("SGLang", "SGLang", r"sgl_hip|sglang|sgl_kernel"),
    ("aiter", "AMD", r"aiter"),
    ("TensorRT-LLM", "NVIDIA", r"tensorrt_llm|trtllm"),
    ("TensorRT", "NVIDIA", r"nvinfer1::"),  # TensorRT plugins: the rule says what they do
    ("FlashInfer", "FlashInfer", r"flashinfer"),
    ("cuDNN", "NVIDIA", r"cudnn"),
    ("CUB/rocPRIM", "NVIDIA/AMD", r"\bcub::|rocprim::|at_cuda_detail::"),
    # ATen: the at:: namespace, or the bare names ncu and older Kineto print for ATen kernels
    # (an anonymous namespace is "(anonymous namespace)" or, from newer demanglers, "<unnamed>").
    ("ATen", "PyTorch", r"at::|\bcunn_|^void (\(anonymous namespace\)|<unnamed>)::softmax_warp_|"
                        r"^void (vectorized_|unrolled_)?elementwise_kernel|^void reduce_kernel<"),
)
ATEN_FAMILY_BY_CATEGORY = {"elementwise": "ATen elementwise", "reduction": "ATen reduction"}  # else "ATen other"

# Precision tokens: (precision, regex searched case-sensitively). A kernel's precision is the
# narrowest type its name states (PRECISION_ORDER, narrowest first); no token: "" (unknown).
PRECISION_ORDER = ("nvfp4", "mxfp4", "mxfp8", "fp8", "int8", "fp16", "bf16", "tf32", "fp32", "fp64")
PRECISION_TOKENS: tuple[tuple[str, str], ...] = (
    ("nvfp4", r"nvfp4|NVFP4|NvE2m1|BlockScaleQuantizationType\)[01]\b"),
    ("mxfp4", r"mxfp4|MXFP4|MxE2m1"),
    ("mxfp8", r"mxfp8|MXFP8|MxE4m3|MxE5m2|BlockScaleQuantizationType\)2\b"),
    ("fp8", r"(?<!Mx)E4m3|(?<!Mx)E5m2|e4m3|e5m2|[Ff]loat8|fp8|FP8|Fp8(?!KVCacheDataType)|__nv_fp8|"
            r"Fp8KVCacheDataType\)[12]|^nvjet_(sm\d+_)?q|^Cijk_A\w+?_B\w+?_F8"),
    ("int8", r"int8_t|\bint8\b|(?<!cu)Int8|s8s8|a8w8|i8i8|^Cijk_A\w+?_B\w+?_(4xi8|I8)"),
    ("fp16", r"c10::Half|half_t|\bhalf\b|__half|_half\b|^nvjet_(sm\d+_)?h|^Cijk_A\w+?_B\w+?_H(HS|B)_|fp16|FP16|"
             r"(?<!B)Float16|_f16f16"),
    ("bf16", r"BFloat16|[Bb]float16|__nv_bfloat16|__hip_bfloat16|bf16|BF16|DF16b|^nvjet_(sm\d+_)?t|"
             r"^Cijk_A\w+?_B\w+?_(BBS|B_BS)_"),
    ("tf32", r"tf32|tfloat32|_s1688"),
    ("fp32", r"(?<![A-Za-z])float(?![A-Za-z0-9])|float2|f32|sgemm|_ffma|_scudnn_|^Cijk_A\w+?_B\w+?_S(B|_B)_|fp32|"
             r"Fp32|FP32"),
    ("fp64", r"(?<![A-Za-z])double(?![A-Za-z0-9])|dgemm|fp64|FP64|^Cijk_A\w+?_B\w+?_DB_"),
)
