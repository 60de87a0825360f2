"""Decode projections with their glue inside: an FP8 GEMM for few rows whose prologue computes,
and quantises, the activation it multiplies.

Why: at decode a layer of the serving model launched, per projection, a glue kernel (residual add
+ RMSNorm + FP8 quantisation, or SwiGLU + quantisation, or the quantiser alone) and then the
small-M GEMM (:mod:`.fp8_small_m`): at one to a few rows each glue kernel is a few microseconds of
launch latency for a few kilobytes of work, 4 of the layer's 11 kernels. Every program of the
GEMM reads the whole activation row anyway, so it computes that row itself, one ``BLOCK_K`` tile
at a time inside its loop over ``K``:

* ``plain``:  ``z = x``;
* ``silu``:   ``z = silu(g) * u`` of ``x = [g | u]`` ``[M, 2K]`` (each product rounded to the
  dtype, as :func:`.glue_triton.silu_mul` and the torch ops round);
* ``norm``:   ``h = x + r`` (rounded to the dtype; ``r`` optional; program 0 also writes ``h``,
  the residual stream the layer goes on with), ``z = h * w_norm`` in float32, and the row's
  ``sum(h^2)`` gathered on the way; the norm's ``rsqrt(mean(h^2) + eps)``, one number per row,
  multiplies the product at the end instead of ``z`` at the start (a scale common to a whole
  row cancels in the FP8 quantisation below, so only the roundings move).

Each tile of ``z`` is quantised to e4m3 with **its own scale** (per row and group of ``BLOCK_K``
elements: ``scale = amax / 448``, :mod:`.fp8`'s formula), multiplied on the tensor cores with the
e4m3 weight tile, and the tile's float32 product is added to the accumulator times that scale;
``y = acc * s_w`` (the weight's row-wise scales), written in the dtype. A per-row scale would need
the whole row's amax before the first product: a second pass over the row in every program.
Groups of 128-256 elements are finer than the rows of the W8A8 path (``_scaled_mm`` with a
scale per row), so each element's rounding error is at most that path's, and the float32 sum per
group keeps the tensor cores' FP8 accumulation short. The prefill and mixed iterations keep the
row-wise path: their GEMMs are compute-bound, where this buys nothing.

Each program owns ``BLOCK_N`` (64) output columns over the whole ``K``, so every program
repeats the prologue's arithmetic on ``M·K`` elements: cheap at the 1-16 rows this is for
(:data:`MAX_M`), wasteful above; :mod:`tracestory.serve.model` uses it at decode buckets only.

Measured first and dropped: the same kernel with the activation left in bf16 and the weight
tile widened to bf16 in registers (no quantisation at all): on an H100 each GEMM took 1.5-2.5x
the small-M kernel's time, the decode step 8.9 ms against 4.9 ms (docs/BENCHMARKS.md).

Limits: ``M <= 16``; ``K`` a multiple of ``BLOCK_K``; row-wise FP8 weights (scale ``[1, N]``);
inputs contiguous in their last dimension; bf16 or fp16 activations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .quant_triton import FP8_MAX, _scale_from_amax

MAX_M = 16
PLAIN, SILU, NORM = 0, 1, 2
BLOCK_K, STAGES = 128, 4      # measured on an H100 with benchmarks/gpu/decode_glue.py (docs/BENCHMARKS.md)


@triton.jit
def _fp8_decode_kernel(x_ptr, r_ptr, nw_ptr, h_ptr, w_ptr, sw_ptr, y_ptr, M, N, K, stride_x, eps,
                       PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8_MAX: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_m = offs_m < M
    dt = y_ptr.dtype.element_ty
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_x
    r_rows = r_ptr + offs_m[:, None].to(tl.int64) * K
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        if PROLOGUE == 0:
            z = tl.load(x_rows + k0 + offs_k[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
        elif PROLOGUE == 1:
            g = tl.load(x_rows + k0 + offs_k[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
            u = tl.load(x_rows + K + k0 + offs_k[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            z = (s * u).to(dt).to(tl.float32)
        else:
            h = tl.load(x_rows + k0 + offs_k[None, :], mask=mask_m[:, None], other=0.0)
            if HAS_RES:
                r = tl.load(r_rows + k0 + offs_k[None, :], mask=mask_m[:, None], other=0.0)
                h = (h.to(tl.float32) + r.to(tl.float32)).to(dt)
                if pid == 0:
                    tl.store(h_ptr + offs_m[:, None] * K + k0 + offs_k[None, :], h, mask=mask_m[:, None])
            hf = h.to(tl.float32)
            ss += tl.sum(hf * hf, axis=1)
            nw = tl.load(nw_ptr + k0 + offs_k).to(tl.float32)
            z = hf * nw[None, :]
        amax = tl.max(tl.abs(z), axis=1)                         # [BLOCK_M]: this group's scale per row
        scale, inv = _scale_from_amax(amax, FP8_MAX)
        q = tl.minimum(tl.maximum(z * inv[:, None], -FP8_MAX), FP8_MAX).to(w_ptr.dtype.element_ty)
        acc += tl.dot(w, tl.trans(q), out_dtype=tl.float32) * scale[None, :]
        w_ptrs += BLOCK_K
    sw = tl.load(sw_ptr + offs_n, mask=mask_n, other=0.0)
    y = acc * sw[:, None]
    if PROLOGUE == 2:
        y = y * tl.math.rsqrt(ss / K + eps)[None, :]
    tl.store(y_ptr + offs_m[None, :] * N + offs_n[:, None], y.to(dt), mask=mask_n[:, None] & mask_m[None, :])


def fits(M: int, K: int, block_k: int = BLOCK_K) -> bool:
    return 1 <= M <= MAX_M and K % block_k == 0


def _launch(x, w, prologue, K, r=None, nw=None, h=None, eps=0.0, block_k=BLOCK_K, stages=STAGES, block_n=64,
            warps=4):
    M = x.shape[0]
    N = w.weight.shape[0]
    if w.weight.shape[1] != K or not fits(M, K, block_k):
        raise ValueError(f"fp8 decode GEMM: expected 1..{MAX_M} rows and K = {w.weight.shape[1]}, a multiple "
                         f"of {block_k}; found M={M}, K={K}")
    if x.stride(-1) != 1 or (r is not None and not r.is_contiguous()):
        raise ValueError("fp8 decode GEMM: the activation rows must be contiguous")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _fp8_decode_kernel[(triton.cdiv(N, block_n),)](
        x, r if r is not None else x, nw if nw is not None else w.scale, h if h is not None else y,
        w.weight, w.scale, y, M, N, K, x.stride(0), float(eps), PROLOGUE=prologue, HAS_RES=r is not None,
        BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, FP8_MAX=FP8_MAX, num_warps=warps, num_stages=stages)
    return y


def matmul(x: torch.Tensor, w, **cfg) -> torch.Tensor:
    """``x [M, K] @ W^T`` (``W`` an :class:`~.fp8.Fp8Weight`, row-wise) -> ``[M, N]`` in ``x``'s dtype."""
    return _launch(x, w, PLAIN, x.shape[1], **cfg)


def silu_matmul(gu: torch.Tensor, w, **cfg) -> torch.Tensor:
    """``(silu(g) * u) @ W^T`` of ``gu = [g | u]`` ``[M, 2K]``."""
    return _launch(gu, w, SILU, gu.shape[1] // 2, **cfg)


def norm_matmul(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, w, residual: torch.Tensor | None = None,
                **cfg):
    """``(h, rms_norm(h) * norm_weight @ W^T)`` with ``h = x + residual`` (``x`` itself without
    one): the residual stream after the add, and the projection of its norm."""
    x = x.contiguous()
    h = torch.empty_like(x) if residual is not None else x
    y = _launch(x, w, NORM, x.shape[1], r=residual.contiguous() if residual is not None else None, nw=norm_weight,
                h=h, eps=eps, **cfg)
    return h, y
