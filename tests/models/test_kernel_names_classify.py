"""The engine's own Triton kernels, as a trace shows them, fall in the category a reader would
give them (tracestory's report on a serving capture must not call the decode attention "other").

The kernels are found by reading the model modules' source (``@triton.jit`` functions whose name
ends in ``_kernel``; CI has no Triton to import them), so a new kernel without an entry here
fails until its category is written down. Expected categories: my reading of what each kernel
computes."""

import ast
from pathlib import Path

from tracestory.analysis.categories import classify_name, taxonomy

MODELS = Path(__file__).resolve().parents[2] / "src" / "tracestory" / "models"
EXPECTED = {
    "_paged_decode_attn_split_kernel": "attention",     # decode attention over the paged cache
    "_paged_decode_attn_combine_kernel": "attention",   # its splits' softmax combination
    "_fp8_gemm_small_m_kernel": "gemm",
    "_add_rmsnorm_quant_kernel": "norm",                 # residual add + RMSNorm (+ FP8 quantisation)
    "_rope_qkv_kernel": "rope",                          # RoPE + the K/V cache write
    "_silu_mul_kernel": "elementwise",                   # SwiGLU
    "_argmax_blocks_kernel": "reduction",                # the LM head's greedy pick
    "_argmax_pick_kernel": "reduction",
    "_amax_kernel": "quantization",                      # the per-tensor scale's maximum
    "_quant_tensor_kernel": "quantization",
    "_quant_row_kernel": "quantization",
    "_quant_mx_kernel": "quantization",
}


def _jit_kernels() -> set[str]:
    names = set()
    for path in MODELS.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            jit = any(isinstance(d, ast.Attribute) and d.attr == "jit" for d in getattr(node, "decorator_list", ()))
            if isinstance(node, ast.FunctionDef) and jit and node.name.endswith("_kernel"):
                names.add(node.name)
    return names


def test_every_engine_kernel_has_its_category_written_down():
    assert _jit_kernels() == set(EXPECTED)


def test_engine_kernels_classify_as_written():
    tax = taxonomy("llm")
    assert {name: classify_name(name, tax) for name in EXPECTED} == EXPECTED
