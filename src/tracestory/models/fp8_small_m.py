"""A Triton FP8 row-wise GEMM for few rows (decode): ``y = (q_x · q_w^T) * s_x * s_w``.

Why: at decode the activation has 1-32 rows, so a projection is a read of its weight; cuBLAS's
FP8 kernels tile ``M`` by 64-128 rows and ``N`` by 128, so a ``[3072, 4096]`` weight (Wqkv of
one of two tensor-parallel ranks) runs on 24 thread blocks of 132 SMs and reads the weight at
a fraction of the memory rate. Here the weight is the wide operand: each program owns
``BLOCK_N`` (64) output columns, computes ``acc[BLOCK_N, BLOCK_M] += w[BLOCK_N, BLOCK_K] ·
x[BLOCK_M, BLOCK_K]^T`` on the tensor cores over all of ``K`` (``BLOCK_M`` = 16: the rows,
padded), then scales and writes bf16. ``N / 64`` programs (48-448 for llama-3-8b shards).

Which of this kernel and ``torch._scaled_mm`` runs for a given ``(N, K, M)`` is measured, not
assumed (:func:`tracestory.models.fp8.tune_small_m`).

Limits: ``M <= 16`` (:data:`MAX_M`), ``K`` a multiple of ``BLOCK_K``, row-wise scales only,
fp32 accumulation inside the tensor-core instruction as Triton emits it for e4m3.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .quant_triton import _pdl_enter

MAX_M = 16
# (BLOCK_K, num_stages) tried by the tuner. The kernel is latency-bound at decode (one program per
# 64 columns, 24-448 programs, each streaming its weight rows tile by tile), so the depth of the
# pipeline of weight tiles in flight sets its rate: 4-6 stages of 256 were 5-22% faster than 3 on
# an H100 at every shape but the 28-56 MB gate/up ones (docs/BENCHMARKS.md, session 11).
CONFIGS = ((128, 4), (256, 3), (256, 4), (256, 5), (256, 6))
# Narrower blocks (BLOCK_N 32 or 16, more programs for the 4096-wide Wo and Wd) were timed on an
# H100 (docs/BENCHMARKS.md; benchmarks/gpu/decode_glue.py --block-n 64,32,16) and were not faster: the
# kernel is not short of programs; matmul keeps block_n and warps for such measurements.


@triton.jit
def _fp8_gemm_small_m_kernel(x_ptr, sx_ptr, w_ptr, sw_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_m = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * K + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    sw = tl.load(sw_ptr + offs_n, mask=mask_n, other=0.0)
    sx = tl.load(sx_ptr + offs_m, mask=mask_m, other=0.0)
    y = acc * sw[:, None] * sx[None, :]
    tl.store(y_ptr + offs_m[None, :] * N + offs_n[:, None], y.to(y_ptr.dtype.element_ty),
             mask=mask_n[:, None] & mask_m[None, :])


def fits(M: int, K: int, block_k: int) -> bool:
    return 1 <= M <= MAX_M and K % block_k == 0


def matmul(qx: torch.Tensor, sx: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor, block_k: int = 128,
           stages: int = 4, block_n: int = 64, warps: int = 4) -> torch.Tensor:
    """``qx [M, K]`` e4m3 with ``sx [M, 1]``, ``qw [N, K]`` e4m3 with ``sw [1, N]`` -> bf16 ``[M, N]``
    (launched with programmatic dependent launch where :func:`.pdl.enabled`)."""
    M, K = qx.shape
    N = qw.shape[0]
    if not fits(M, K, block_k):
        raise ValueError(f"fp8 small-M GEMM: expected 1..{MAX_M} rows and K a multiple of {block_k}, "
                         f"found M={M}, K={K}")
    y = torch.empty((M, N), dtype=torch.bfloat16, device=qx.device)
    _fp8_gemm_small_m_kernel[(triton.cdiv(N, block_n),)](qx, sx, qw, sw, y, M, N, K, BLOCK_M=16, BLOCK_N=block_n,
                                                         BLOCK_K=block_k, num_warps=warps, num_stages=stages,
                                                         **pdl.kernel_options(qx.device))
    return y
