"""Triton kernels for the elementwise glue of a Llama layer, fused with the FP8 activation
quantisation: one launch where the torch ops launch 5-15.

Imported only on CUDA when Triton is present (this module imports ``triton`` at import time);
:mod:`tracestory.serve.model` uses it through :func:`available`. Each kernel computes what the
torch ops of :mod:`.llama` and :mod:`.fp8` compute, in the same precision and with the same
roundings to the model dtype between steps, so the two paths agree up to the last bit of
``rsqrt``/``exp`` (the GPU tests compare them):

* :func:`norm` — ``h = x + r`` (optional residual, rounded to the dtype), ``y = rms_norm(h) * w``
  (float32 statistics, rounded to the dtype), then either ``y`` or its FP8 row-wise
  quantisation ``(q, scale)`` (:mod:`.fp8`'s formulas: ``scale = amax / 448``).
  Replaces ``x + r``, the seven ops of :func:`.llama.rms_norm` and the quantiser.
* :func:`rope_qkv` — from the fused QKV projection ``[T, (H + 2·Hkv)·d]``: RoPE (rotate-half)
  on the query and key heads, the query written ``[T, H, d]`` (seen as ``[H, T, d]``) (the layout the attention
  calls take), the key and value heads written into the paged caches ``[slots, Hkv, d]`` at
  each token's slot. Replaces two RoPE chains (``float``, two slices, ``neg``, ``cat``, three
  multiply/adds, the cast back), the transposes and the two cache ``index_put``.
* :func:`silu_mul` — ``silu(g) * u`` from the fused gate/up projection ``[T, 2·I]`` (each
  product rounded to the dtype, as torch does), optionally quantised per row; rows of up to
  :data:`ONE_TILE_MAX` products are read once (the scale's maximum and the quantisation from
  registers), longer ones in two passes of 4,096.
* :func:`row_max` — the greedy pick of the LM head: each row's largest logit and its first
  index, in two short kernels (blocks of the row, then the blocks' winners) where ``logits.float()
  .argmax(-1)`` ran a float copy and one reduction of 27 us over a 128,256-wide row (H100).

On Hopper each kernel is launched with programmatic dependent launch (:mod:`.pdl`: it waits
for the previous kernel before touching memory; ``TRACESTORY_PDL=0`` turns it off).

Limits: :func:`row_max` assumes logits without NaN (``torch.argmax`` would pick a NaN); rows are processed whole by one program (``norm``: ``D`` up to 16384 in one tile;
``silu_mul`` loops over ``I``); the quantised outputs are row-wise only (tensor-wise FP8 keeps
the torch path); inputs must be contiguous in their last dimension.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .quant_triton import _FP8, FP8_MAX, _pdl_enter, _scale_from_amax


# silu_mul reads a row of up to this many products in one tile (llama-3-8b: 14,336 at TP=1)
ONE_TILE_MAX = 16384


@triton.jit
def _add_rmsnorm_quant_kernel(x_ptr, r_ptr, h_ptr, w_ptr, out_ptr, s_ptr, D, eps, HAS_RES: tl.constexpr,
                              QUANT: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr,
                              USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + row * D + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(h_ptr + row * D + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (xf * rstd * w).to(x_ptr.dtype.element_ty)       # rms_norm's result in the model dtype
    if QUANT:
        yf = y.to(tl.float32)
        amax = tl.max(tl.abs(yf)[None, :], axis=1)        # [1]
        scale, inv = _scale_from_amax(amax, FP8_MAX)
        tl.store(s_ptr + row + tl.arange(0, 1), scale)
        q = tl.minimum(tl.maximum(yf * inv, -FP8_MAX), FP8_MAX)
        tl.store(out_ptr + row * D + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr + row * D + cols, y, mask=mask)


@triton.jit
def _rope_qkv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, slot_ptr, T, H, KH, stride_t,
                     HEAD_D: tl.constexpr, HB: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    heads = hb * HB + tl.arange(0, HB)                    # [HB] among H query + KH key heads
    dim = tl.arange(0, HEAD_D)
    partner = (dim + HEAD_D // 2) % HEAD_D
    sign = tl.where(dim < HEAD_D // 2, -1.0, 1.0)
    live = heads < H + KH
    row = qkv_ptr + t * stride_t
    src = heads[:, None] * HEAD_D
    x = tl.load(row + src + dim[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    xp = tl.load(row + src + partner[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t * HEAD_D + dim).to(tl.float32)
    s = tl.load(sin_ptr + t * HEAD_D + dim).to(tl.float32)
    y = (x * c[None, :] + (sign[None, :] * xp) * s[None, :]).to(q_ptr.dtype.element_ty)
    is_q = heads < H
    tl.store(q_ptr + (t * H + heads[:, None]) * HEAD_D + dim[None, :], y, mask=(live & is_q)[:, None])
    slot = tl.load(slot_ptr + t)
    kh = heads - H
    is_k = live & (heads >= H)
    dst = (slot * KH + kh[:, None]) * HEAD_D + dim[None, :]
    tl.store(kc_ptr + dst, y.to(kc_ptr.dtype.element_ty), mask=is_k[:, None])
    v = tl.load(row + (H + KH + kh[:, None]) * HEAD_D + dim[None, :], mask=is_k[:, None], other=0.0)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=is_k[:, None])


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, s_ptr, I, QUANT: tl.constexpr, BLOCK: tl.constexpr,
                     FP8_MAX: tl.constexpr, USE_PDL: tl.constexpr, ONE_TILE: tl.constexpr):
    _pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    g_row = gu_ptr + row * 2 * I
    dt = gu_ptr.dtype.element_ty
    if ONE_TILE:            # the row in one tile: g and u read once, the product kept for the scale
        m1 = cols < I
        g1 = tl.load(g_row + cols, mask=m1, other=0.0).to(tl.float32)
        u1 = tl.load(g_row + I + cols, mask=m1, other=0.0).to(tl.float32)
        a1 = (g1 / (1.0 + tl.exp(-g1))).to(dt).to(tl.float32)
        y1 = (a1 * u1).to(dt)
        if QUANT:
            yf1 = y1.to(tl.float32)
            scale1, inv1 = _scale_from_amax(tl.max(tl.abs(yf1)[None, :], axis=1), FP8_MAX)
            tl.store(s_ptr + row + tl.arange(0, 1), scale1)
            q1 = tl.minimum(tl.maximum(yf1 * inv1, -FP8_MAX), FP8_MAX)
            tl.store(out_ptr + row * I + cols, q1.to(out_ptr.dtype.element_ty), mask=m1)
        else:
            tl.store(out_ptr + row * I + cols, y1, mask=m1)
    else:
        _silu_mul_passes(g_row, out_ptr, s_ptr, row, cols, I, QUANT, BLOCK, FP8_MAX)


@triton.jit
def _silu_mul_passes(g_row, out_ptr, s_ptr, row, cols, I, QUANT: tl.constexpr, BLOCK: tl.constexpr,
                     FP8_MAX: tl.constexpr):
    """A row longer than one tile: the scale's pass, then the quantising pass (tiles of BLOCK)."""
    dt = g_row.dtype.element_ty
    if QUANT:
        acc = tl.zeros([BLOCK], tl.float32)
        for k in range(0, I, BLOCK):
            m = k + cols < I
            g = tl.load(g_row + k + cols, mask=m, other=0.0).to(tl.float32)
            u = tl.load(g_row + I + k + cols, mask=m, other=0.0).to(tl.float32)
            a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            y = (a * u).to(dt).to(tl.float32)
            acc = tl.maximum(acc, tl.abs(y))
        amax = tl.max(acc[None, :], axis=1)
        scale, inv = _scale_from_amax(amax, FP8_MAX)
        tl.store(s_ptr + row + tl.arange(0, 1), scale)
    for k in range(0, I, BLOCK):
        m = k + cols < I
        g = tl.load(g_row + k + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(g_row + I + k + cols, mask=m, other=0.0).to(tl.float32)
        a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        y = (a * u).to(dt)
        if QUANT:
            q = tl.minimum(tl.maximum(y.to(tl.float32) * inv, -FP8_MAX), FP8_MAX)
            tl.store(out_ptr + row * I + k + cols, q.to(out_ptr.dtype.element_ty), mask=m)
        else:
            tl.store(out_ptr + row * I + k + cols, y, mask=m)


def norm(x: torch.Tensor, w: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
         quant: bool = False):
    """``(h, y)``: ``h = x + residual`` (``x`` itself without one) and ``y = rms_norm(h) * w``,
    or ``(h, (q, scale))`` with ``quant``: ``q [T, D]`` e4m3, ``scale [T, 1]`` fp32."""
    x = x.contiguous()
    T, D = x.shape
    if D > 16384:
        raise ValueError(f"glue norm: rows of at most 16384 elements, found {D}")
    if residual is not None:
        residual = residual.contiguous()
    h = torch.empty_like(x) if residual is not None else x
    out = torch.empty((T, D), dtype=_FP8 if quant else x.dtype, device=x.device)
    scale = torch.empty((T, 1), dtype=torch.float32, device=x.device) if quant else out
    block = triton.next_power_of_2(D)
    if T:
        _add_rmsnorm_quant_kernel[(T,)](x, residual if residual is not None else x, h, w, out, scale, D,
                                        float(eps), HAS_RES=residual is not None, QUANT=quant, BLOCK=block,
                                        FP8_MAX=FP8_MAX, num_warps=8 if block >= 4096 else 4,
                                        **pdl.kernel_options(x.device))
    return h, ((out, scale) if quant else out)


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slots: torch.Tensor, H: int, KH: int) -> torch.Tensor:
    """Query ``[H, T, d]`` after RoPE (a transposed view of ``[T, H, d]`` memory, the layout
    the torch path's RoPE leaves); the rotated keys and the values of the ``T`` tokens
    written into ``k_cache``/``v_cache`` ``[slots, KH, d]`` at ``slots [T]``."""
    T = qkv.shape[0]
    d = k_cache.shape[-1]
    if qkv.stride(-1) != 1 or qkv.shape[1] != (H + 2 * KH) * d:
        raise ValueError(f"glue rope_qkv: expected a [T, {(H + 2 * KH) * d}] row-major QKV, found "
                         f"{tuple(qkv.shape)} with strides {qkv.stride()}")
    q = torch.empty((T, H, d), dtype=qkv.dtype, device=qkv.device)
    hb = 4
    if T:
        _rope_qkv_kernel[(T, triton.cdiv(H + KH, hb))](qkv, cos.contiguous(), sin.contiguous(), q, k_cache, v_cache,
                                                       slots, T, H, KH, qkv.stride(0), HEAD_D=d, HB=hb,
                                                       num_warps=4, **pdl.kernel_options(qkv.device))
    return q.transpose(0, 1)


def silu_mul(gu: torch.Tensor, quant: bool = False):
    """``silu(g) * u`` of ``gu = [g | u]`` ``[T, 2·I]``: ``[T, I]`` in the dtype, or
    ``(q [T, I] e4m3, scale [T, 1])`` with ``quant``."""
    T, I2 = gu.shape
    I = I2 // 2
    gu = gu.contiguous()
    out = torch.empty((T, I), dtype=_FP8 if quant else gu.dtype, device=gu.device)
    scale = torch.empty((T, 1), dtype=torch.float32, device=gu.device) if quant else out
    one = I <= ONE_TILE_MAX                     # one read of the row (else two passes of 4,096)
    block = triton.next_power_of_2(I) if one else 4096
    if T:
        _silu_mul_kernel[(T,)](gu, out, scale, I, QUANT=quant, BLOCK=block, FP8_MAX=FP8_MAX,
                               num_warps=16 if block >= 8192 else 8 if block >= 4096 else 4, ONE_TILE=one,
                               **pdl.kernel_options(gu.device))
    return (out, scale) if quant else out


@triton.jit
def _argmax_blocks_kernel(x_ptr, val_ptr, idx_ptr, V, P, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * V + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    first = tl.min(tl.where(x == m, cols, V), axis=0)      # the lowest index holding the maximum
    tl.store(val_ptr + row * P + blk, m)
    tl.store(idx_ptr + row * P + blk, first)


@triton.jit
def _argmax_pick_kernel(val_ptr, idx_ptr, out_val_ptr, out_idx_ptr, P, BLOCK_P: tl.constexpr,
                         USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_P)
    v = tl.load(val_ptr + row * P + j, mask=j < P, other=float("-inf"))
    i = tl.load(idx_ptr + row * P + j, mask=j < P, other=2147483647)
    m = tl.max(v, axis=0)
    tl.store(out_val_ptr + row, m)
    tl.store(out_idx_ptr + row, tl.min(tl.where(v == m, i, 2147483647), axis=0).to(tl.int64))


def row_max(logits: torch.Tensor, block: int = 4096):
    """``(values [n] fp32, ids [n] int64)`` of ``logits [n, V]``: each row's maximum and the lowest
    index holding it (``torch.max``/``argmax``'s pick for NaN-free rows)."""
    logits = logits.contiguous()
    n, V = logits.shape
    P = triton.cdiv(V, block)
    part_v = torch.empty((n, P), dtype=torch.float32, device=logits.device)
    part_i = torch.empty((n, P), dtype=torch.int32, device=logits.device)
    val = torch.empty(n, dtype=torch.float32, device=logits.device)
    idx = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n:
        launch = pdl.kernel_options(logits.device)
        _argmax_blocks_kernel[(n, P)](logits, part_v, part_i, V, P, BLOCK=block, num_warps=8, **launch)
        _argmax_pick_kernel[(n,)](part_v, part_i, val, idx, P, BLOCK_P=triton.next_power_of_2(P), num_warps=1,
                                   **launch)
    return val, idx
