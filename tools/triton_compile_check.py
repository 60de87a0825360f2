"""Compile the decode path's Triton kernels for sm_90 on a machine without a GPU: Triton's compiler
runs its front end (where type errors such as a loop-carried variable changing dtype show) and
its back end down to a cubin, no device needed. The Triton interpreter (TRITON_INTERPRET=1) does
not catch those errors: it runs the Python. Outside CI (CI has no Triton).

Usage: PYTHONPATH=src python tools/triton_compile_check.py   (a Python with Triton; exit 1 on an error)"""

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tracestory.models import fp8_small_m as S
from tracestory.models import glue_triton as G
from tracestory.models import quant_triton as Q

target = GPUTarget("cuda", 90, 32)
cases = [
    (
        G._silu_mul_kernel,
        {"gu_ptr": "*bf16", "out_ptr": "*fp8e4nv", "s_ptr": "*fp32", "I": "i32"},
        {"QUANT": True, "BLOCK": 16384, "FP8_MAX": 448.0, "USE_PDL": True, "ONE_TILE": True},
    ),
    (
        G._silu_mul_kernel,
        {"gu_ptr": "*bf16", "out_ptr": "*fp8e4nv", "s_ptr": "*fp32", "I": "i32"},
        {"QUANT": True, "BLOCK": 4096, "FP8_MAX": 448.0, "USE_PDL": False, "ONE_TILE": False},
    ),
    (
        G._silu_mul_kernel,
        {"gu_ptr": "*fp32", "out_ptr": "*fp32", "s_ptr": "*fp32", "I": "i32"},
        {"QUANT": False, "BLOCK": 8192, "FP8_MAX": 448.0, "USE_PDL": True, "ONE_TILE": True},
    ),
    (
        G._silu_mul_kernel,
        {"gu_ptr": "*fp32", "out_ptr": "*fp32", "s_ptr": "*fp32", "I": "i32"},
        {"QUANT": False, "BLOCK": 4096, "FP8_MAX": 448.0, "USE_PDL": True, "ONE_TILE": False},
    ),
    (
        Q._quant_row_kernel,
        {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "K": "i32"},
        {"BLOCK_K": 4096, "FP8_MAX": 448.0, "USE_PDL": True, "ONE_TILE": True},
    ),
    (
        Q._quant_row_kernel,
        {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "K": "i32"},
        {"BLOCK_K": 8192, "FP8_MAX": 448.0, "USE_PDL": True, "ONE_TILE": False},
    ),
    (
        G._argmax_blocks_kernel,
        {"x_ptr": "*bf16", "val_ptr": "*fp32", "idx_ptr": "*i32", "V": "i32", "P": "i32"},
        {"BLOCK": 4096, "USE_PDL": True},
    ),
    (
        G._argmax_pick_kernel,
        {"val_ptr": "*fp32", "idx_ptr": "*i32", "out_val_ptr": "*fp32", "out_idx_ptr": "*i64", "P": "i32"},
        {"BLOCK_P": 32, "USE_PDL": True},
    ),
    (
        G._add_rmsnorm_quant_kernel,
        {
            "x_ptr": "*bf16",
            "r_ptr": "*bf16",
            "h_ptr": "*bf16",
            "w_ptr": "*bf16",
            "out_ptr": "*fp8e4nv",
            "s_ptr": "*fp32",
            "D": "i32",
            "eps": "fp32",
        },
        {"HAS_RES": True, "QUANT": True, "BLOCK": 4096, "FP8_MAX": 448.0, "USE_PDL": True},
    ),
    (
        S._fp8_gemm_small_m_kernel,
        {
            "x_ptr": "*fp8e4nv",
            "sx_ptr": "*fp32",
            "w_ptr": "*fp8e4nv",
            "sw_ptr": "*fp32",
            "y_ptr": "*bf16",
            "M": "i32",
            "N": "i32",
            "K": "i32",
        },
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "USE_PDL": True},
    ),
]
bad = 0
for fn, sig, const in cases:
    sig = {**sig, **{k: "constexpr" for k in const}}
    try:
        src = ASTSource(fn, sig, constexprs=const)
        triton.compile(src, target=target)
        print("ok     ", fn.__name__, const)
    except Exception as e:  # noqa: BLE001
        msg = " ".join(str(e).split())[:300]
        front = "CompilationError" in type(e).__name__ or "Loop-carried" in msg or "at " in msg[:10]
        print("FRONT  " if front else "later  ", fn.__name__, type(e).__name__, msg)
        bad += front
sys.exit(1 if bad else 0)
