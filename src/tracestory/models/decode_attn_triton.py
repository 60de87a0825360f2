"""Paged split-KV decode attention in Triton (the model: :mod:`.decode_attn`).

Imported only on CUDA when Triton is present (this module imports ``triton`` at import time).
:func:`decode` takes what the decode CUDA graphs of :mod:`tracestory.serve.model` hold:

* ``q [H, B, d]``: any strides (the transposed view :func:`.glue_triton.rope_qkv` returns is read
  in place; the last dimension contiguous);
* ``k_cache, v_cache [slots, Hkv, d]``: slot = ``block * block_size + offset``;
* ``tables [B, W]`` int64 block tables (padding columns: any block; only columns up to
  ``pos // block_size`` are read), ``pos [B]`` int64: the new token's position, keys
  ``0..pos`` valid (its own K/V already in the cache);

and returns ``[B, H*d]`` in q's dtype, ``softmax(q·Kᵀ·scale)·V`` per head, ``scale = d^-½``.

The split program (grid ``(B, Hkv, S)``): the ``G`` query heads of a KV head as one tile of
``max(16, next_pow2(G))`` rows (padding rows are zeros, never stored), ``BLOCK_N`` keys per step
gathered through the table (the tile's slots need not be contiguous: any block size works), the
products on the tensor cores with float32 accumulation (float32 inputs: ``input_precision="ieee"``,
no TF32), the probabilities rounded to V's dtype before ``p·V`` as flash attention does, the
running max in log2 units (``exp2``); its partial ``(m, l, acc)`` per head goes to a float32
workspace. The combine, per head: ``M = max_s m_s``, ``o = Σ_s 2^(m_s-M)·acc_s / Σ_s 2^(m_s-M)·l_s``
over the splits that hold keys, by a second kernel (grid ``(B, H)``). With ``fused`` the last
split program of each (sequence, KV head) to finish does it instead (one launch and its latency
less per layer): each non-empty split, after its partial stores (a block barrier, then
an ``acq_rel`` atomic add at GPU scope), counts itself in an int32 arrival counter; the one that
sees ``used - 1`` reads the partials through L2 and writes the group's heads, then sets the counter
back to 0. With ``quant`` (fused only) the last group of a sequence to finish
(a second counter per sequence, the same ordering) reads the sequence's output row back through
L2 and writes its FP8 row-wise quantisation with :mod:`.quant_triton`'s formulas (``amax`` of the
rounded outputs, ``scale = amax / 448``, ``q = e4m3(clamp(o * 448 / amax))``): the input of the
FP8 ``Wo`` projection, bit for bit what the quantiser kernel would write, one launch less.

On Hopper the kernels launch with programmatic dependent launch like the glue's (:mod:`.pdl`:
each waits for its predecessor before touching memory, so the results are those of plain
launches).

Limits: head dim up to 256 (one tile); the workspace is allocated per call (in a CUDA graph:
once, from the graph's pool); the arrival counters are one buffer per device, so two fused calls
must not run at the same time on one device (two streams); a call cut short (a crashed kernel)
leaves them non-zero; the fused quantisation takes rows of up to 16,384 elements (longer rows,
or ``fused=False``, go through the quantiser kernel).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import pdl
from .decode_attn import BLOCK_N, num_splits, query_rows
from .quant_triton import _FP8, FP8_MAX, _pdl_enter, _scale_from_amax

_LOG2E = 1.4426950408889634
MAX_QUANT_ROW = 16384            # longest output row the fused kernel quantises (one tile)
_SMS: dict[int, int] = {}
_COUNTERS: dict = {}             # device index -> int32 arrival counters (fused kernel)


@triton.jit
def _combine_head(m_ptr, l_ptr, acc_ptr, out_ptr, row0, used, o_off, D, SP: tl.constexpr, BLOCK_D: tl.constexpr):
    """Combine the partials ``row0 .. row0 + used - 1`` of one head into ``out_ptr + o_off``
    (read through L2: ``.cg``, as other programs wrote them)."""
    sp = tl.arange(0, SP)
    dd = tl.arange(0, BLOCK_D)
    smask = sp < used
    dmask = dd < D
    row = row0 + sp
    m = tl.load(m_ptr + row, mask=smask, other=float("-inf"), cache_modifier=".cg")
    lsum = tl.load(l_ptr + row, mask=smask, other=0.0, cache_modifier=".cg")
    acc = tl.load(acc_ptr + row[:, None] * D + dd[None, :], mask=smask[:, None] & dmask[None, :], other=0.0,
                  cache_modifier=".cg")
    mx = tl.max(m, 0)
    w = tl.where(smask, tl.exp2(m - mx), 0.0)
    o = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    tl.store(out_ptr + o_off + dd, o.to(out_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _paged_decode_attn_split_kernel(q_ptr, k_ptr, v_ptr, tab_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, out_ptr,
                                    cnt_ptr, q8_ptr, s8_ptr, sq_h, sq_b, sk_s, sk_h, sv_s, sv_h, st_b, so_b,
                                    qk_scale, B, H, KH, S, BS, D, G: tl.constexpr, GP: tl.constexpr,
                                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SP: tl.constexpr,
                                    IEEE: tl.constexpr, FUSED: tl.constexpr, QUANT: tl.constexpr,
                                    BLOCK_ROW: tl.constexpr, FP8_MAX: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    b = tl.program_id(0)
    kh = tl.program_id(1)
    s = tl.program_id(2)
    pos = tl.load(pos_ptr + b)
    tiles = tl.cdiv(pos + 1, BLOCK_N)
    per = tl.cdiv(tiles, S)
    t0 = s * per
    t1 = tl.minimum(t0 + per, tiles)
    g = tl.arange(0, GP)
    dd = tl.arange(0, BLOCK_D)
    gmask = g < G
    dmask = dd < D
    h = kh * G + g
    q = tl.load(q_ptr + h[:, None].to(tl.int64) * sq_h + b.to(tl.int64) * sq_b + dd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, BLOCK_D], tl.float32)
    tab = tab_ptr + b.to(tl.int64) * st_b
    for t in range(t0, t1):
        j = t * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = j <= pos
        blk = tl.load(tab + j // BS, mask=valid, other=0)
        slot = blk.to(tl.int64) * BS + j % BS
        kv_mask = valid[:, None] & dmask[None, :]
        k = tl.load(k_ptr + slot[:, None] * sk_s + kh * sk_h + dd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + slot[:, None] * sv_s + kh * sv_h + dd[None, :], mask=kv_mask, other=0.0)
        if IEEE:             # float32 inputs: no TF32 rounding
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        qk = tl.where(valid[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    row = (b * H + h).to(tl.int64) * S + s
    tl.store(m_ptr + row, m_i, mask=gmask)
    tl.store(l_ptr + row, l_i, mask=gmask)
    tl.store(acc_ptr + row[:, None] * D + dd[None, :], acc, mask=gmask[:, None] & dmask[None, :])
    if FUSED:
        # the last split of (b, kh) to finish combines the group's heads: its partial stores
        # are ordered before the counter's increment (barrier, then an acq_rel atomic)
        used = tl.cdiv(tiles, per)
        if t0 < tiles:
            tl.debug_barrier()
            cnt = cnt_ptr + b * KH + kh
            done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if done == used - 1:
                tl.debug_barrier()
                for gi in tl.static_range(G):
                    hh = kh * G + gi
                    _combine_head(m_ptr, l_ptr, acc_ptr, out_ptr, (b * H + hh).to(tl.int64) * S, used,
                                  b.to(tl.int64) * so_b + hh * D, D, SP, BLOCK_D)
                tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")      # ready for the next call
                if QUANT:
                    # the last group of the sequence quantises its whole output row (FP8, one
                    # scale: quant_triton's row-wise formulas on the rounded outputs)
                    tl.debug_barrier()
                    rcnt = cnt_ptr + B * KH + b
                    rdone = tl.atomic_add(rcnt, 1, sem="acq_rel", scope="gpu")
                    if rdone == KH - 1:
                        tl.debug_barrier()
                        cols = tl.arange(0, BLOCK_ROW)
                        rmask = cols < H * D
                        x = tl.load(out_ptr + b.to(tl.int64) * so_b + cols, mask=rmask, other=0.0,
                                    cache_modifier=".cg").to(tl.float32)
                        amax = tl.max(tl.abs(x)[None, :], axis=1)
                        qscale, inv = _scale_from_amax(amax, FP8_MAX)
                        tl.store(s8_ptr + b + tl.arange(0, 1), qscale)
                        x8 = tl.minimum(tl.maximum(x * inv, -FP8_MAX), FP8_MAX)
                        tl.store(q8_ptr + b.to(tl.int64) * H * D + cols, x8.to(q8_ptr.dtype.element_ty), mask=rmask)
                        tl.atomic_xchg(rcnt, 0, sem="relaxed", scope="gpu")


@triton.jit
def _paged_decode_attn_combine_kernel(m_ptr, l_ptr, acc_ptr, pos_ptr, out_ptr, so_b, H, S, D,
                                      BLOCK_N: tl.constexpr, SP: tl.constexpr, BLOCK_D: tl.constexpr,
                                      USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + b)
    tiles = tl.cdiv(pos + 1, BLOCK_N)
    per = tl.cdiv(tiles, S)
    used = tl.cdiv(tiles, per)                 # splits that hold keys
    _combine_head(m_ptr, l_ptr, acc_ptr, out_ptr, (b * H + h).to(tl.int64) * S, used, b.to(tl.int64) * so_b + h * D,
                  D, SP, BLOCK_D)


def sm_count(device) -> int:
    """The SM count of ``device`` (cached)."""
    idx = torch.device(device).index
    if idx is None:
        idx = torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def splits_for(q: torch.Tensor, k_cache: torch.Tensor, tables: torch.Tensor, block_size: int) -> int:
    """:func:`.decode_attn.num_splits` for a call over ``tables`` (its width bounds the context)."""
    B = q.shape[1]
    return num_splits(max(B, 1), k_cache.shape[1], sm_count(q.device), tables.shape[1] * block_size)


def _counters(device, n: int) -> torch.Tensor:
    """The device's arrival counters of the fused kernel (zeros between calls: the last program
    of each (sequence, KV head) resets its own). Allocated on first use, eagerly in practice
    (the decode graphs run their bodies before capture)."""
    idx = torch.device(device).index
    buf = _COUNTERS.get(idx)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[idx] = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
    return buf


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
           pos: torch.Tensor, block_size: int, *, splits: int | None = None, scale: float | None = None,
           block_n: int = BLOCK_N, num_warps: int = 4, fused: bool = False, quant: bool = False):
    """Attention of one new token per sequence over the paged cache (module docstring):
    ``[B, H*d]`` in q's dtype, or with ``quant`` its FP8 row-wise quantisation ``(q [B, H*d]
    e4m3, scale [B, 1] fp32)`` (what :func:`.fp8.quantize` gives for the output; written by the
    fused kernel's last group of each sequence, else by the quantiser). ``splits``: default
    :func:`splits_for`; ``fused``: the partials combined by the last split of each (sequence,
    KV head) instead of a second kernel."""
    H, B, d = q.shape
    KH = k_cache.shape[1]
    if H % KH or q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or d > 256:
        raise ValueError(f"decode_attn: expected H a multiple of Hkv, contiguous last dims, d <= 256; found "
                         f"q {tuple(q.shape)} strides {q.stride()}, cache {tuple(k_cache.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"decode_attn: expected float16, bfloat16 or float32, found {q.dtype}")
    S = splits or splits_for(q, k_cache, tables, block_size)
    G = H // KH
    out = torch.empty((B, H * d), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    f32 = torch.float32
    m = torch.empty((B, H, S), dtype=f32, device=q.device)
    lsum = torch.empty((B, H, S), dtype=f32, device=q.device)
    acc = torch.empty((B, H, S, d), dtype=f32, device=q.device)
    fuse_quant = quant and fused and H * d <= MAX_QUANT_ROW
    cnt = _counters(q.device, B * KH + B) if fused else m
    q8 = torch.empty((B, H * d), dtype=_FP8, device=q.device) if fuse_quant else out
    s8 = torch.empty((B, 1), dtype=f32, device=q.device) if fuse_quant else m
    bd = max(16, triton.next_power_of_2(d))
    sp = max(2, triton.next_power_of_2(S))
    launch = pdl.kernel_options(q.device)
    qk_scale = (scale if scale is not None else 1.0 / math.sqrt(d)) * _LOG2E
    _paged_decode_attn_split_kernel[(B, KH, S)](
        q, k_cache, v_cache, tables, pos, m, lsum, acc, out, cnt, q8, s8, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), tables.stride(0),
        out.stride(0), qk_scale, B, H, KH, S, block_size, d, G=G, GP=query_rows(G), BLOCK_N=block_n,
        BLOCK_D=bd, SP=sp, IEEE=q.dtype == torch.float32, FUSED=fused, QUANT=fuse_quant,
        BLOCK_ROW=triton.next_power_of_2(H * d) if fuse_quant else 16, FP8_MAX=FP8_MAX,
        num_warps=num_warps, **launch)
    if not fused:
        _paged_decode_attn_combine_kernel[(B, H)](m, lsum, acc, pos, out, out.stride(0), H, S, d, BLOCK_N=block_n,
                                                  SP=sp, BLOCK_D=bd, num_warps=4, **launch)
    if fuse_quant:
        return q8, s8
    if quant:
        from .quant_triton import quantize_per_row

        return quantize_per_row(out)
    return out
