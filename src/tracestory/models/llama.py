"""The Llama decoder layers as torch modules (shapes and counted work: :mod:`.llama_config`).

This module imports torch at its top; callers that must stay importable without torch import it
where they need it (``from ..models import llama``).

RMSNorm and RoPE are computed in (at least) float32 and cast back (as Hugging Face does). RoPE
uses the rotate-half convention, theta from the preset.

Decode: one new token per sequence; its K/V are written at position ``kv_len`` of a
preallocated cache (filled with random values, never zeros), and attention reads positions
``0..kv_len`` (kv_len + 1 keys). The H query heads are folded into Hkv groups of H/Hkv rows
(``[B, Hkv, H/Hkv, d]``), which is exact for a single query token and reads K/V without copying
them per query head.

Limits: random weights (timing only); no embedding/LM head; batch rows all have the same
kv_len.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .llama_config import LlamaConfig


def linear(x, w):
    """``x @ w.T`` for a weight in nn.Linear layout ``[out, in]``: the one place every layer's
    projections go through, so another weight format (FP8, a tensor-parallel shard) changes
    only this function."""
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


class Layer(nn.Module):
    """One decoder layer with its own contiguous KV cache ``[B, Hkv, max_len, d]``."""

    def __init__(self, cfg: LlamaConfig, batch, max_len, device, dtype, gen, decode_attention="matmul"):
        super().__init__()
        D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
        self.cfg = cfg
        self.decode_attention = decode_attention

        def w(out_f, in_f):
            # nn.Linear layout [out, in], scaled so activations stay O(1)
            t = torch.randn(out_f, in_f, generator=gen, device="cpu", dtype=torch.float32) / in_f ** 0.5
            return nn.Parameter(t.to(device=device, dtype=dtype), requires_grad=False)

        self.wq, self.wk, self.wv, self.wo = w(H * d, D), w(K * d, D), w(K * d, D), w(D, H * d)
        self.wg, self.wu, self.wd = w(I, D), w(I, D), w(D, I)
        self.n1 = nn.Parameter((1 + 0.1 * torch.randn(D, generator=gen)).to(device, dtype), requires_grad=False)
        self.n2 = nn.Parameter((1 + 0.1 * torch.randn(D, generator=gen)).to(device, dtype), requires_grad=False)
        # KV cache: [B, Hkv, max_len, d], random so decode never reads zeros
        self.register_buffer("k_cache", torch.randn(batch, K, max_len, d, generator=gen).to(device, dtype))
        self.register_buffer("v_cache", torch.randn(batch, K, max_len, d, generator=gen).to(device, dtype))

    def forward(self, x, cos, sin, pos: int, decode: bool):
        # x: [B, S, D]; cos, sin: [S, d] for positions pos..pos+S-1
        cfg = self.cfg
        B, S, D = x.shape
        H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        a = rms_norm(x, self.n1, cfg.norm_eps)
        q = linear(a, self.wq).view(B, S, H, d).transpose(1, 2)    # [B, H, S, d]
        k = linear(a, self.wk).view(B, S, K, d).transpose(1, 2)    # [B, Hkv, S, d]
        v = linear(a, self.wv).view(B, S, K, d).transpose(1, 2)    # [B, Hkv, S, d]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.k_cache[:, :, pos:pos + S] = k
        self.v_cache[:, :, pos:pos + S] = v
        if decode:
            L = pos + S                                               # keys 0..pos
            qg = q.reshape(B, K, cfg.group * S, d)                     # [B, Hkv, H/Hkv, d] (S == 1)
            kk, vv = self.k_cache[:, :, :L], self.v_cache[:, :, :L]
            if self.decode_attention == "sdpa":
                o = F.scaled_dot_product_attention(qg, kk, vv)
            else:
                o = decode_attention_matmul(qg, kk, vv)
            o = o.reshape(B, H, S, d)
        else:
            o = sdpa_gqa_causal(q, k, v)                              # [B, H, S, d]
        h = x + linear(o.transpose(1, 2).reshape(B, S, H * d), self.wo)
        m = rms_norm(h, self.n2, cfg.norm_eps)
        return h + linear(F.silu(linear(m, self.wg)) * linear(m, self.wu), self.wd)


class Stack(nn.Module):
    """``layers`` decoder layers sharing one RoPE table."""

    def __init__(self, cfg: LlamaConfig, layers, batch, max_len, device, dtype, seed, decode_attention="matmul"):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        self.layers = nn.ModuleList(Layer(cfg, batch, max_len, device, dtype, gen, decode_attention)
                                    for _ in range(layers))
        d = cfg.head_dim
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)                            # [max_len, d]
        tdt = torch.promote_types(dtype, torch.float32)  # float32 tables, float64 for a float64 model
        self.register_buffer("cos", ang.cos().to(device, tdt))
        self.register_buffer("sin", ang.sin().to(device, tdt))

    def forward(self, x, pos: int = 0, decode: bool = False):
        S = x.shape[1]
        cos, sin = self.cos[pos:pos + S], self.sin[pos:pos + S]
        for layer in self.layers:
            x = layer(x, cos, sin, pos, decode)
        return x


def build_model(cfg: LlamaConfig, *, layers: int = 1, batch: int = 1, max_len: int = 128,
                device: str = "cpu", dtype=None, seed: int = 0, decode_attention: str = "matmul") -> Stack:
    """A :class:`Stack` of ``layers`` random-weight layers with KV caches of ``max_len``, in eval mode.

    ``decode_attention``: ``matmul`` (two batched GEMMs per KV head group) or ``sdpa``
    (``F.scaled_dot_product_attention``, whichever backend torch picks)."""
    return Stack(cfg, layers, batch, max_len, device, dtype or torch.float32, seed, decode_attention).eval()
