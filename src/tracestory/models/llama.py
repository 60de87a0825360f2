"""The Llama decoder layers as torch modules (shapes and counted work: :mod:`.llama_config`).

This module imports torch at its top; callers that must stay importable without torch import it
where they need it (``from ..models import llama``).

RMSNorm and RoPE are computed in (at least) float32 and cast back (as Hugging Face does). RoPE
uses the rotate-half convention, theta from the preset.

Attention backends (``attention_backend``):

* ``matmul`` (default): prefill through SDPA (causal, GQA); decode as two batched GEMMs with the
  H query heads folded into Hkv groups of H/Hkv rows (``[B, Hkv, H/Hkv, d]``), which is exact for
  a single query token and reads K/V without copying them per query head; from two chunks of
  ``split_keys`` (256) keys on, and when the cache holds the last chunk whole, the key range is
  split in chunks (:func:`decode_attention_split`: split-KV with plain GEMMs);
* ``sdpa``: prefill as above; decode through ``F.scaled_dot_product_attention`` on the folded
  query (whichever kernel torch picks);
* ``flex``: FlexAttention (:mod:`.flex`): prefill with a causal block mask (optionally a sliding
  window of ``sliding_window`` keys), decode through its decoding path.

Decode: one new token per sequence; its K/V are written at position ``kv_len`` of a
preallocated cache (filled with random values, never zeros), and attention reads positions
``0..kv_len`` (kv_len + 1 keys; with a sliding window ``W``, the last ``W`` of them).

FP8: :func:`linear` dispatches on :class:`.fp8.Fp8Weight`; :func:`.fp8.quantize_stack` (or
``build_model(..., fp8_mode="rowwise")``) replaces the projection weights in place.

Projections that read the same input run as one GEMM: Wq, Wk and Wv are views into one
``[(H + 2·Hkv)·d, D]`` weight and Wg, Wu into one ``[2·I, D]`` weight (the layer's
``_fused_qkv``/``_fused_gu``); a projection replaced by an FP8 weight or a tensor-parallel
shard makes its group run one GEMM per projection again.

Limits: random weights (timing only); no embedding/LM head; batch rows all have the same
kv_len; the sliding window needs the ``flex`` backend.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from . import flex, fp8
from .llama_config import ATTENTION_BACKENDS, SPLIT_KEYS, LlamaConfig


def linear(x, w):
    """``x @ w.T`` for a weight in nn.Linear layout ``[out, in]``: the one place every layer's
    projections go through, so another weight format (FP8, a tensor-parallel shard) changes
    only this function. An :class:`.fp8.Fp8Weight` runs through ``torch._scaled_mm``."""
    if isinstance(w, fp8.Fp8Weight):
        return fp8.fp8_linear(x, w)
    return F.linear(x, w)


def rms_norm(x, w, eps):
    # x: [B, S, D]; statistics in at least float32, as in the reference models
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.to(y.dtype)).to(x.dtype)


def rope(x, cos, sin):
    # x: [B, h, S, d]; cos/sin: [S, d]
    d2 = x.shape[-1] // 2
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    rot = torch.cat((-xf[..., d2:], xf[..., :d2]), dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


def sdpa_gqa_causal(q, k, v):
    # q: [B, H, S, d]; k, v: [B, Hkv, S, d]
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:  # torch < 2.5 has no enable_gqa
        g = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                              is_causal=True)


def decode_attention_matmul(qg, k, v):
    # qg: [B, Hkv, G, d] (the G query heads of each KV head, one token); k, v: [B, Hkv, L, d].
    # Two batched GEMMs with M = G read K and V once each: the memory-bound shape of decode.
    # (SDPA on Hopper picks cuDNN's prefill kernel here, 64-row query tiles for G rows:
    # ~0.3 TB/s on the H200, see docs/BENCHMARKS.md.)
    s = torch.matmul(qg, k.transpose(-1, -2)) * qg.shape[-1] ** -0.5
    p = torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1).to(qg.dtype)
    return torch.matmul(p, v)


def decode_attention_split(qg, k_cache, v_cache, lo: int, stop: int, chunk: int = SPLIT_KEYS):
    """Decode attention over keys ``lo..stop-1`` with the key range split in ``n = ceil((stop-lo)/chunk)``
    chunks, so each batched GEMM has ``B·Hkv·n`` independent products instead of ``B·Hkv`` (with
    B = 1 and Hkv = 8, eight products cannot fill a GPU: the split is what makes K/V reads run at
    memory speed). ``qg [B, Hkv, G, d]``; the caches ``[B, Hkv, capacity, d]`` are read over
    ``lo .. lo + n·chunk`` (a view, no copy), positions ``>= stop`` masked to -inf before one
    softmax over all chunks; the chunks' partial ``P·V`` are summed in float32. Needs
    ``lo + n·chunk <= capacity`` (the caller checks, see :func:`split_fits`)."""
    B, K, _, d = qg.shape
    n = -(-(stop - lo) // chunk)
    kk = k_cache[:, :, lo:lo + n * chunk].reshape(B, K, n, chunk, d)
    vv = v_cache[:, :, lo:lo + n * chunk].reshape(B, K, n, chunk, d)
    f32 = torch.promote_types(qg.dtype, torch.float32)
    s = torch.matmul(qg.unsqueeze(2), kk.transpose(-1, -2)).to(f32) * d ** -0.5      # [B, Hkv, n, G, chunk]
    idx = lo + torch.arange(n * chunk, device=qg.device).view(n, 1, chunk)
    s = s.masked_fill(idx >= stop, float("-inf"))
    m = s.amax(dim=(2, 4), keepdim=True)
    p = torch.exp(s - m)
    p = (p / p.sum(dim=(2, 4), keepdim=True)).to(qg.dtype)
    return torch.matmul(p, vv).to(f32).sum(2).to(qg.dtype)                          # [B, Hkv, G, d]


def split_fits(lo: int, stop: int, capacity: int, chunk: int = SPLIT_KEYS) -> bool:
    """Whether :func:`decode_attention_split` applies: two chunks or more, all inside the cache."""
    n = -(-(stop - lo) // chunk)
    return n >= 2 and lo + n * chunk <= capacity


class Layer(nn.Module):
    """One decoder layer with its own contiguous KV cache ``[B, Hkv, max_len, d]``."""

    def __init__(self, cfg: LlamaConfig, batch, max_len, device, dtype, gen, attention_backend="matmul",
                 sliding_window=None):
        super().__init__()
        D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
        self.cfg = cfg
        self.attention_backend = attention_backend
        self.sliding_window = sliding_window
        self.split_keys = SPLIT_KEYS

        def w(out_f, in_f):
            # nn.Linear layout [out, in], scaled so activations stay O(1)
            t = torch.randn(out_f, in_f, generator=gen, device="cpu", dtype=torch.float32) / in_f ** 0.5
            return t.to(device=device, dtype=dtype)

        def fused(*parts):
            # one [sum(out), in] tensor; each projection's parameter is a view into it, so the
            # projections that read the same input run as one GEMM (fewer, larger weight reads
            # at decode) and nothing is stored twice
            whole = torch.cat(parts)
            cut = [0, *itertools.accumulate(t.shape[0] for t in parts)]
            views = tuple(nn.Parameter(whole[a:b], requires_grad=False) for a, b in itertools.pairwise(cut))
            return whole, views

        wq, wk, wv, self.wo = w(H * d, D), w(K * d, D), w(K * d, D), nn.Parameter(w(D, H * d), requires_grad=False)
        wg, wu, self.wd = w(I, D), w(I, D), nn.Parameter(w(D, I), requires_grad=False)
        qkv, (self.wq, self.wk, self.wv) = fused(wq, wk, wv)
        gu, (self.wg, self.wu) = fused(wg, wu)
        # (fused weight, the parameters it holds): used while those parameters are still the
        # views (FP8 weights or tensor-parallel shards put in their place run one by one)
        self._fused_qkv = (qkv, self.wq, self.wk, self.wv)
        self._fused_gu = (gu, self.wg, self.wu)
        self.n1 = nn.Parameter((1 + 0.1 * torch.randn(D, generator=gen)).to(device, dtype), requires_grad=False)
        self.n2 = nn.Parameter((1 + 0.1 * torch.randn(D, generator=gen)).to(device, dtype), requires_grad=False)
        # KV cache: [B, Hkv, max_len, d], random so decode never reads zeros
        self.register_buffer("k_cache", torch.randn(batch, K, max_len, d, generator=gen).to(device, dtype))
        self.register_buffer("v_cache", torch.randn(batch, K, max_len, d, generator=gen).to(device, dtype))

    def forward(self, x, cos, sin, pos: int, decode: bool, block_mask=None):
        # x: [B, S, D]; cos, sin: [S, d] for positions pos..pos+S-1; block_mask: flex prefill only
        cfg = self.cfg
        B, S, D = x.shape
        H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        a = rms_norm(x, self.n1, cfg.norm_eps)
        fq = self._fused_qkv
        if self.wq is fq[1] and self.wk is fq[2] and self.wv is fq[3]:
            q, k, v = linear(a, fq[0]).split([H * d, K * d, K * d], dim=-1)
        else:
            q, k, v = linear(a, self.wq), linear(a, self.wk), linear(a, self.wv)
        q = q.reshape(B, S, H, d).transpose(1, 2)                  # [B, H, S, d]
        k = k.reshape(B, S, K, d).transpose(1, 2)                  # [B, Hkv, S, d]
        v = v.reshape(B, S, K, d).transpose(1, 2)                  # [B, Hkv, S, d]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.k_cache[:, :, pos:pos + S] = k
        self.v_cache[:, :, pos:pos + S] = v
        backend = self.attention_backend
        if decode:
            lo, L = flex.decode_key_range(pos, self.sliding_window)   # keys lo..pos (S == 1)
            kk, vv = self.k_cache[:, :, lo:L], self.v_cache[:, :, lo:L]
            if backend == "flex":
                o = flex.attention(q, kk, vv)                          # [B, H, 1, d]
            else:
                qg = q.reshape(B, K, cfg.group * S, d)                 # [B, Hkv, H/Hkv, d]
                if backend == "sdpa":
                    o = F.scaled_dot_product_attention(qg, kk, vv)
                elif split_fits(lo, L, self.k_cache.shape[2], self.split_keys):
                    o = decode_attention_split(qg, self.k_cache, self.v_cache, lo, L, self.split_keys)
                else:
                    o = decode_attention_matmul(qg, kk, vv)
                o = o.reshape(B, H, S, d)
        elif backend == "flex":
            if block_mask is None:
                block_mask = flex.causal_block_mask(S, S, self.sliding_window, str(x.device))
            o = flex.attention(q, k, v, block_mask)                   # [B, H, S, d]
        else:
            o = sdpa_gqa_causal(q, k, v)                              # [B, H, S, d]
        h = x + linear(o.transpose(1, 2).reshape(B, S, H * d), self.wo)
        m = rms_norm(h, self.n2, cfg.norm_eps)
        fg = self._fused_gu
        if self.wg is fg[1] and self.wu is fg[2]:
            g, u = linear(m, fg[0]).split([cfg.ffn_dim, cfg.ffn_dim], dim=-1)
        else:
            g, u = linear(m, self.wg), linear(m, self.wu)
        return h + linear(F.silu(g) * u, self.wd)


class Stack(nn.Module):
    """``layers`` decoder layers sharing one RoPE table."""

    def __init__(self, cfg: LlamaConfig, layers, batch, max_len, device, dtype, seed, attention_backend="matmul",
                 sliding_window=None):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        self.attention_backend = attention_backend
        self.sliding_window = sliding_window
        self.layers = nn.ModuleList(Layer(cfg, batch, max_len, device, dtype, gen, attention_backend, sliding_window)
                                    for _ in range(layers))
        d = cfg.head_dim
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)                            # [max_len, d]
        tdt = torch.promote_types(dtype, torch.float32)  # float32 tables, float64 for a float64 model
        self.register_buffer("cos", ang.cos().to(device, tdt))
        self.register_buffer("sin", ang.sin().to(device, tdt))

    def prefill_block_mask(self, seq: int):
        """The flex prefill :class:`BlockMask` for ``seq`` tokens (None for the other backends):
        build it before a ``torch.compile`` of the forward and pass it as ``block_mask``."""
        if self.attention_backend != "flex":
            return None
        return flex.causal_block_mask(seq, seq, self.sliding_window, str(self.cos.device))

    def forward(self, x, pos: int = 0, decode: bool = False, block_mask=None):
        S = x.shape[1]
        cos, sin = self.cos[pos:pos + S], self.sin[pos:pos + S]
        for layer in self.layers:
            x = layer(x, cos, sin, pos, decode, block_mask)
        return x


def build_model(cfg: LlamaConfig, *, layers: int = 1, batch: int = 1, max_len: int = 128,
                device: str = "cpu", dtype=None, seed: int = 0, attention_backend: str | None = None,
                decode_attention: str | None = None, sliding_window: int | None = None,
                fp8_mode: str = "off") -> Stack:
    """A :class:`Stack` of ``layers`` random-weight layers with KV caches of ``max_len``, in eval mode.

    ``attention_backend``: ``matmul`` (default), ``sdpa`` or ``flex`` (module docstring);
    ``decode_attention`` is its older name. ``sliding_window``: keys each query sees (flex only).
    ``fp8_mode``: ``off``, ``rowwise`` or ``tensorwise`` (:mod:`.fp8`: projection weights
    quantised once here)."""
    backend = attention_backend or decode_attention or "matmul"
    if backend not in ATTENTION_BACKENDS:
        raise UsageError(f"attention backend {backend!r}: expected one of {', '.join(ATTENTION_BACKENDS)}")
    if sliding_window is not None and (backend != "flex" or sliding_window < 1):
        raise UsageError(f"--sliding-window {sliding_window}: expected a positive number of keys with "
                         f"--attention-backend flex, found backend {backend}")
    stack = Stack(cfg, layers, batch, max_len, device, dtype or torch.float32, seed, backend, sliding_window)
    fp8.quantize_stack(stack, fp8_mode)
    return stack.eval()
