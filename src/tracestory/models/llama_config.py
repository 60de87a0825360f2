"""Llama decoder-layer shapes and the work they count, without torch.

Layer (per decoder layer, pre-norm, as in Llama 2/3; the modules are in :mod:`.llama`)::

    h   = x + Wo · SDPA(RoPE(Wq · n1(x)), RoPE(Wk · n1(x)), Wv · n1(x))      n = RMSNorm
    out = h + Wd · (silu(Wg · n2(h)) * (Wu · n2(h)))                          SwiGLU MLP

Shapes: D = dim, H query heads, Hkv key/value heads (GQA: query head h uses kv head
h // (H/Hkv)), d = D/H head dim (or ``explicit_head_dim`` when set: a tensor-parallel rank's
local config holds H/N heads of the full model's d), I = MLP width.

Counted work (``dtype_bytes`` = 2 for bf16), all per layer unless stated:

* weights ``P = D·H·d + 2·D·Hkv·d + H·d·D + 3·D·I + 2·D`` parameters (q, k, v, o, gate/up/down,
  two norm weights);
* decode bytes ``= P·b + 2·B·(kv_len+1)·Hkv·d·b`` (every weight read once, K and V read over
  kv_len+1 positions); activations (a few KB) are ignored;
* prefill FLOPs ``= 2·(P - 2·D)·B·S + 2·B·H·d·S²`` (matmul FLOPs, plus QKᵀ and PV with the
  causal half of the S×S scores counted: 2 matmuls × 2 FLOP × S²/2 × d per head);
* decode FLOPs ``= 2·(P - 2·D)·B + 4·B·H·d·(kv_len+1)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class LlamaConfig:
    name: str
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    explicit_head_dim: int | None = None   # None: dim // n_heads

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.dim // self.n_heads

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_name(cls, name: str) -> LlamaConfig:
        try:
            return PRESETS[name]
        except KeyError:
            raise UsageError(f"unknown llama preset {name!r}: expected one of {', '.join(PRESETS)}") from None


# decode attention: two batched GEMMs per KV-head group, or F.scaled_dot_product_attention
DECODE_ATTENTION = ("matmul", "sdpa")

PRESETS = {
    "llama-2-7b": LlamaConfig("llama-2-7b", 4096, 32, 32, 11008, 10000.0, 1e-5),
    "llama-3-8b": LlamaConfig("llama-3-8b", 4096, 32, 8, 14336, 500000.0, 1e-5),
    "tiny": LlamaConfig("tiny", 64, 4, 2, 160, 10000.0, 1e-5),
}


def layer_params(cfg: LlamaConfig) -> int:
    D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    return D * H * d + 2 * D * K * d + H * d * D + 3 * D * I + 2 * D


def decode_bytes(cfg: LlamaConfig, batch: int, kv_len: int, layers: int = 1, dtype_bytes: int = 2) -> int:
    kv = 2 * batch * (kv_len + 1) * cfg.n_kv_heads * cfg.head_dim * dtype_bytes
    return layers * (layer_params(cfg) * dtype_bytes + kv)


def prefill_flops(cfg: LlamaConfig, batch: int, seq: int, layers: int = 1) -> int:
    matmul = 2 * (layer_params(cfg) - 2 * cfg.dim) * batch * seq
    attn = 2 * batch * cfg.n_heads * cfg.head_dim * seq * seq
    return layers * (matmul + attn)


def decode_flops(cfg: LlamaConfig, batch: int, kv_len: int, layers: int = 1) -> int:
    """2 FLOPs per weight per token plus QKᵀ and PV over kv_len+1 keys."""
    matmul = 2 * (layer_params(cfg) - 2 * cfg.dim) * batch
    attn = 4 * batch * cfg.n_heads * cfg.head_dim * (kv_len + 1)
    return layers * (matmul + attn)
