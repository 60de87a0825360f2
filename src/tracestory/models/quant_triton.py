"""Triton FP8 quantization kernels: per-tensor, per-row and MXFP8 (1x32 blocks, E8M0 scales).

Imported only when a GPU bench runs (this module imports ``triton`` at import time); the
pure-torch references these kernels must match bit for bit are in
:mod:`tracestory.bench.fp8` (``ref_quantize_*``), and the formulas are stated there.

Numerics, shared with the references so results can be compared exactly:

* per-tensor / per-row: ``amax = max |x|`` (fp32), ``scale = amax / 448`` and
  ``inv = 448 / amax`` (both IEEE round-to-nearest: ``div_rn``), ``q = fp8(clamp(x * inv,
  -448, 448))``; ``amax == 0`` gives ``scale = inv = 1``. ``scale`` is the dequantization
  factor ``torch._scaled_mm`` takes (``x ~= q * scale``). Multiplying by ``inv`` instead of
  dividing by ``scale`` keeps the kernel memory-bound (one multiply per element).
* MXFP8: for each 32 consecutive elements of a row, the E8M0 exponent ``e`` is the smallest
  integer with ``amax <= 448 * 2**e`` (read from the fp32 bits of ``amax``: exponent ``E``,
  mantissa ``m``: ``e = E - 8`` when ``m <= 1.75`` else ``E - 7``), clamped to [-127, 127];
  ``q = fp8(clamp(x * 2**-e, -448, 448))`` and the stored byte is ``e + 127``. Choosing the
  smallest non-clipping power of two (round the scale up) means no element saturates,
  unlike the OCP spec's ``floor(log2 amax) - 8``, which can clip the block maximum.

Layout: inputs are 2-D ``[M, K]`` row-major contiguous; MXFP8 needs ``K % 32 == 0`` and writes
``scales[M, K // 32]`` (uint8). Grid sizes and block shapes are chosen for memory-bound
streaming (one pass for MXFP8 and per-row rows that fit a tile; the per-tensor path reads the
input twice: an amax pass with ``atomic_max``, then the quantize pass).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

FP8_MAX = 448.0
_FP8 = torch.float8_e4m3fn


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    # amax >= 0, so the float atomic_max is well defined (no sign games needed).
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))


@triton.jit
def _pdl_enter(USE_PDL: tl.constexpr):
    """A kernel launched with programmatic dependent launch (:mod:`.pdl`): wait for the previous
    kernel of the stream to finish (its writes visible), then let the next one launch."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _scale_from_amax(amax, FP8_MAX: tl.constexpr):
    fmax = tl.full(amax.shape, FP8_MAX, tl.float32)
    one = tl.full(amax.shape, 1.0, tl.float32)
    pos = amax > 0
    safe = tl.where(pos, amax, one)
    scale = tl.where(pos, tl.math.div_rn(safe, fmax), one)
    inv = tl.where(pos, tl.math.div_rn(fmax, safe), one)
    return scale, inv


@triton.jit
def _quant_tensor_kernel(x_ptr, q_ptr, amax_ptr, scale_ptr, n, BLOCK: tl.constexpr,
                         FP8_MAX: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    amax = tl.load(amax_ptr + tl.arange(0, 1))
    scale, inv = _scale_from_amax(amax, FP8_MAX)
    if pid == 0:
        tl.store(scale_ptr + tl.arange(0, 1), scale)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q = tl.minimum(tl.maximum(x * inv, -FP8_MAX), FP8_MAX)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quant_row_kernel(x_ptr, q_ptr, scale_ptr, K, BLOCK_K: tl.constexpr, FP8_MAX: tl.constexpr,
                      USE_PDL: tl.constexpr, ONE_TILE: tl.constexpr):
    _pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * K
    q_row = q_ptr + row * K
    cols = tl.arange(0, BLOCK_K)
    if ONE_TILE:            # the row in one tile: read once, kept in registers for the second step
        mask1 = cols < K
        x1 = tl.load(x_row + cols, mask=mask1, other=0.0).to(tl.float32)
        scale1, inv1 = _scale_from_amax(tl.max(tl.abs(x1)[None, :], axis=1), FP8_MAX)
        tl.store(scale_ptr + row + tl.arange(0, 1), scale1)
        q1 = tl.minimum(tl.maximum(x1 * inv1, -FP8_MAX), FP8_MAX)
        tl.store(q_row + cols, q1.to(q_ptr.dtype.element_ty), mask=mask1)
    else:
        acc = tl.zeros([BLOCK_K], tl.float32)
        for k in range(0, K, BLOCK_K):
            x = tl.load(x_row + k + cols, mask=k + cols < K, other=0.0).to(tl.float32)
            acc = tl.maximum(acc, tl.abs(x))
        amax = tl.max(acc[None, :], axis=1)                          # [1]
        scale, inv = _scale_from_amax(amax, FP8_MAX)
        tl.store(scale_ptr + row + tl.arange(0, 1), scale)
        # Second pass: the row was just read, so it comes from L1/L2, not HBM, for rows < ~100 KB.
        for k in range(0, K, BLOCK_K):
            mask = k + cols < K
            x = tl.load(x_row + k + cols, mask=mask, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(x * inv, -FP8_MAX), FP8_MAX)
            tl.store(q_row + k + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quant_mx_kernel(x_ptr, q_ptr, s_ptr, n_blocks, BLOCKS: tl.constexpr, FP8_MAX: tl.constexpr):
    # One program quantizes BLOCKS consecutive 32-element blocks of the flat row-major input.
    pid = tl.program_id(0).to(tl.int64)
    b = pid * BLOCKS + tl.arange(0, BLOCKS)                      # [BLOCKS] block ids
    offs = b[:, None] * 32 + tl.arange(0, 32)[None, :]           # [BLOCKS, 32]
    bmask = b < n_blocks
    x = tl.load(x_ptr + offs, mask=bmask[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)                             # [BLOCKS]
    bits = amax.to(tl.int32, bitcast=True)
    E = ((bits >> 23) & 0xFF) - 127
    e = E - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)      # 448 = 1.75 * 2**8
    e = tl.minimum(tl.maximum(e, -127), 127)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)         # exactly 2**-e
    q = tl.minimum(tl.maximum(x * inv[:, None], -FP8_MAX), FP8_MAX)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=bmask[:, None])
    tl.store(s_ptr + b, (e + 127).to(tl.uint8), mask=bmask)


def _check_2d(x: torch.Tensor, what: str) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"{what}: expected a 2-D [M, K] tensor, got shape {tuple(x.shape)}")
    return x.contiguous()


def quantize_per_tensor(x: torch.Tensor, block: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (any shape, contiguous) -> ``(q fp8 e4m3fn, scale fp32 [1])`` with ``x ~= q * scale``."""
    x = x.contiguous()
    n = x.numel()
    q = torch.empty(x.shape, dtype=_FP8, device=x.device)
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    scale = torch.empty(1, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, block),)
    _amax_kernel[grid](x, amax, n, BLOCK=block, num_warps=8)
    _quant_tensor_kernel[grid](x, q, amax, scale, n, BLOCK=block, FP8_MAX=FP8_MAX, num_warps=8)
    return q, scale


def quantize_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(q [M, K] fp8 e4m3fn, scale [M, 1] fp32)``, one scale per row."""
    x = _check_2d(x, "quantize_per_row")
    M, K = x.shape
    q = torch.empty((M, K), dtype=_FP8, device=x.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    block_k = min(triton.next_power_of_2(K), 8192)
    num_warps = 8 if block_k >= 4096 else 4
    _quant_row_kernel[(M,)](x, q, scale, K, BLOCK_K=block_k, FP8_MAX=FP8_MAX, num_warps=num_warps,
                            ONE_TILE=K <= block_k, **pdl.kernel_options(x.device))
    return q, scale


def quantize_mxfp8(x: torch.Tensor, blocks_per_program: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (``K % 32 == 0``) -> ``(q [M, K] fp8 e4m3fn, scales [M, K//32] uint8 E8M0)``."""
    x = _check_2d(x, "quantize_mxfp8")
    M, K = x.shape
    if K % 32:
        raise ValueError(f"quantize_mxfp8: K must be a multiple of 32, got K={K}")
    q = torch.empty((M, K), dtype=_FP8, device=x.device)
    scales = torch.empty((M, K // 32), dtype=torch.uint8, device=x.device)
    n_blocks = M * K // 32
    grid = (triton.cdiv(n_blocks, blocks_per_program),)
    _quant_mx_kernel[grid](x, q, scales, n_blocks, BLOCKS=blocks_per_program, FP8_MAX=FP8_MAX,
                           num_warps=4)
    return q, scales
