"""Llama decoder-layer shapes and the work they count, without torch.

Layer (per decoder layer, pre-norm, as in Llama 2/3; the modules are in :mod:`.llama`)::

    h   = x + Wo · SDPA(RoPE(Wq · n1(x)), RoPE(Wk · n1(x)), Wv · n1(x))      n = RMSNorm
    out = h + Wd · (silu(Wg · n2(h)) * (Wu · n2(h)))                          SwiGLU MLP

Shapes: D = dim, H query heads, Hkv key/value heads (GQA: query head h uses kv head
h // (H/Hkv)), d = D/H head dim, I = MLP width.

Counted work (``dtype_bytes`` = 2 for bf16), all per layer unless stated:

* weights ``P = D·H·d + 2·D·Hkv·d + H·d·D + 3·D·I + 2·D`` parameters (q, k, v, o, gate/up/down,
  two norm weights);
* decode bytes ``= P·b + 2·B·(kv_len+1)·Hkv·d·b`` (every weight read once, K and V read over
  kv_len+1 positions); activations (a few KB) are ignored;
* with FP8 projections (``fp8`` = ``rowwise`` or ``tensorwise``) the projection weights
  ``P - 2·D`` count 1 byte each plus their fp32 scales, 4 bytes per output row for rowwise
  (``H·d + 2·Hkv·d + D + 2·I + D`` rows: q, k, v, o, gate, up, down) or 4 bytes per projection
  for tensorwise (7 scales); the norm weights and the KV cache keep ``b`` bytes. The activation
  scales and the quantised activations (one row per token) are ignored like the activations;
* with a sliding window ``W`` decode reads K/V over ``min(kv_len+1, W)`` positions, and
  prefill counts ``S·W - W²/2`` score pairs per head instead of ``S²/2`` (when ``W < S``);
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

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_name(cls, name: str) -> LlamaConfig:
        try:
            return PRESETS[name]
        except KeyError:
            raise UsageError(f"unknown llama preset {name!r}: expected one of {', '.join(PRESETS)}") from None


# attention backends of the layer (models/llama.py): SDPA, two batched GEMMs for decode, FlexAttention
ATTENTION_BACKENDS = ("sdpa", "matmul", "flex")
# the older --decode-attention choices (an alias of --attention-backend)
DECODE_ATTENTION = ("matmul", "sdpa")
# keys per chunk of the matmul backend's split-KV decode (models/llama.py); bench llama rounds
# its KV-cache capacity up to a multiple of it so that the last chunk fits
SPLIT_KEYS = 256
# FP8 projection modes (models/fp8.py)
FP8_MODES = ("off", "rowwise", "tensorwise")

PRESETS = {
    "llama-2-7b": LlamaConfig("llama-2-7b", 4096, 32, 32, 11008, 10000.0, 1e-5),
    "llama-3-8b": LlamaConfig("llama-3-8b", 4096, 32, 8, 14336, 500000.0, 1e-5),
    "tiny": LlamaConfig("tiny", 64, 4, 2, 160, 10000.0, 1e-5),
}


def layer_params(cfg: LlamaConfig) -> int:
    D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    return D * H * d + 2 * D * K * d + H * d * D + 3 * D * I + 2 * D


def fp8_scale_count(cfg: LlamaConfig, fp8: str) -> int:
    """fp32 scales of one layer's projection weights: one per output row (rowwise) or one per
    projection (tensorwise); 0 for ``off``."""
    D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    return {"off": 0, "tensorwise": 7, "rowwise": H * d + 2 * K * d + D + 2 * I + D}[fp8]


def layer_weight_bytes(cfg: LlamaConfig, dtype_bytes: int = 2, fp8: str = "off") -> int:
    """Bytes of one layer's weights as stored (module docstring)."""
    if fp8 == "off":
        return layer_params(cfg) * dtype_bytes
    return (layer_params(cfg) - 2 * cfg.dim) + 4 * fp8_scale_count(cfg, fp8) + 2 * cfg.dim * dtype_bytes


def decode_bytes(cfg: LlamaConfig, batch: int, kv_len: int, layers: int = 1, dtype_bytes: int = 2,
                 fp8: str = "off", window: int | None = None) -> int:
    keys = kv_len + 1 if window is None else min(kv_len + 1, window)
    kv = 2 * batch * keys * cfg.n_kv_heads * cfg.head_dim * dtype_bytes
    return layers * (layer_weight_bytes(cfg, dtype_bytes, fp8) + kv)


def prefill_flops(cfg: LlamaConfig, batch: int, seq: int, layers: int = 1, window: int | None = None) -> int:
    matmul = 2 * (layer_params(cfg) - 2 * cfg.dim) * batch * seq
    if window is None or window >= seq:
        attn = 2 * batch * cfg.n_heads * cfg.head_dim * seq * seq
    else:                                   # 4 FLOP·d per kept (query, key) pair, S·W - W²/2 pairs
        attn = 4 * batch * cfg.n_heads * cfg.head_dim * (seq * window - window * window // 2)
    return layers * (matmul + attn)


def decode_flops(cfg: LlamaConfig, batch: int, kv_len: int, layers: int = 1, window: int | None = None) -> int:
    """2 FLOPs per weight per token plus QKᵀ and PV over kv_len+1 keys (or the window)."""
    matmul = 2 * (layer_params(cfg) - 2 * cfg.dim) * batch
    keys = kv_len + 1 if window is None else min(kv_len + 1, window)
    attn = 4 * batch * cfg.n_heads * cfg.head_dim * keys
    return layers * (matmul + attn)
