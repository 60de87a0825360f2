"""Compile the decode path's Triton kernels for sm_90 on a machine without a GPU: Triton's compiler
runs its front end (where type errors such as a loop-carried variable changing dtype show) and
its back end down to a cubin, no device needed. The Triton interpreter (TRITON_INTERPRET=1) does
not catch those errors: it runs the Python. Outside CI (CI has no Triton).

Usage: PYTHONPATH=src python tools/triton_compile_check.py   (a Python with Triton; exit 1 on an error)"""

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tracestory.models import decode_attn_triton as D
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
# the split-KV decode attention (models/decode_attn_triton.py): bf16 two-kernel (the default), fp32, and the
# fused combine writing Wo's FP8 input (opt-in)
SPLIT = {n: "*fp32" for n in ("m_ptr", "l_ptr", "acc_ptr", "s8_ptr")}
SPLIT.update(
    {
        "q_ptr": "*bf16",
        "k_ptr": "*bf16",
        "v_ptr": "*bf16",
        "tab_ptr": "*i64",
        "pos_ptr": "*i64",
        "out_ptr": "*bf16",
        "cnt_ptr": "*i32",
        "q8_ptr": "*fp8e4nv",
        "qk_scale": "fp32",
    }
)
SPLIT.update(
    {n: "i32" for n in ("sq_h", "sq_b", "sk_s", "sk_h", "sv_s", "sv_h", "st_b", "so_b", "B", "H", "KH", "S", "BS", "D")}
)
for ieee, fused, quant, dt in (
    (False, False, False, "*bf16"),
    (True, False, False, "*fp32"),
    (False, True, True, "*bf16"),
):
    sig = {**SPLIT, **({"q_ptr": dt, "k_ptr": dt, "v_ptr": dt, "out_ptr": dt})}
    cases.append(
        (
            D._paged_decode_attn_split_kernel,
            sig,
            {
                "G": 4,
                "GP": 16,
                "BLOCK_N": 64,
                "BLOCK_D": 128,
                "SP": 32,
                "IEEE": ieee,
                "FUSED": fused,
                "QUANT": quant,
                "BLOCK_ROW": 4096 if quant else 16,
                "FP8_MAX": 448.0,
                "USE_PDL": True,
            },
        )
    )
cases.append(
    (
        D._paged_decode_attn_combine_kernel,
        {
            "m_ptr": "*fp32",
            "l_ptr": "*fp32",
            "acc_ptr": "*fp32",
            "pos_ptr": "*i64",
            "out_ptr": "*bf16",
            "so_b": "i32",
            "H": "i32",
            "S": "i32",
            "D": "i32",
        },
        {"BLOCK_N": 64, "SP": 32, "BLOCK_D": 128, "USE_PDL": True},
    )
)

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
