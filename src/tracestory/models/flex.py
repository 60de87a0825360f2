"""FlexAttention (``torch.nn.attention.flex_attention``) for the Llama layer: causal prefill with an
optional sliding window, and single-token decode.

Masks (``mask_mod(b, h, q_idx, kv_idx) -> bool``: True keeps the score, False sets it to -inf
before the softmax; no ``score_mod`` is used, so the scores are the plain ``q·k / sqrt(d)``):

* causal: ``q_idx >= kv_idx``;
* sliding window ``W``: causal and ``q_idx - kv_idx < W`` (each query sees itself and the
  ``W - 1`` keys before it, ``W`` keys at most).

Prefill passes a :class:`BlockMask` built from that ``mask_mod`` by :func:`causal_block_mask`,
cached per ``(S, KV, window, device)``: blocks (128 x 128) wholly masked are skipped, so the
causal half of the score matrix is never computed. Queries and keys both start at position 0
(the layer's prefill attends within the chunk, as its SDPA path does).

Decode (one query token at position ``pos``): the caller passes the cache slice of the keys the
token may see (``0..pos``, or the last ``W`` of them with a window), and no mask: every key in the
slice counts. With ``torch.compile`` on CUDA, inductor lowers a call whose query length is below
128 to its split-KV decoding kernel (FlexDecoding: the key range is split across thread blocks
and the partial softmaxes are combined), which is the point of this backend for decode. Grouped
query attention goes through ``enable_gqa=True`` (query head ``h`` uses key/value head
``h // (H/Hkv)``), which the decoding kernel folds into one KV read per group.

Where it runs: inside a ``torch.compile`` trace the raw ``flex_attention`` is called (the whole
graph is compiled, the attention with it); outside one, on CUDA, a ``torch.compile`` of
``flex_attention`` (``dynamic=False``: one compile per shape, the cost lands in the first call,
which ``bench llama`` reports as its own number); on the CPU, ``flex_attention`` runs eagerly
(unfused: it materialises the scores, fine for tests and tiny shapes).

Measured (H100, torch 2.11, docs/BENCHMARKS.md): at kv 4096 with 8 KV heads of 128 this
decoding kernel read K/V at ~115 GB/s, slower than the matmul backend's split-KV GEMMs; the
backend is exact (tests) but not the fast decode path on that stack.

Limits: head dim a power of two >= 16 (FlexAttention's kernels); masks depend on positions only
(no per-sequence lengths in a batch: every row has the same ``kv_len``); outside a compiled
graph each new decode length is a new shape for the compiled ``flex_attention``, and after
torch's recompile limit (8 by default) dynamo falls back to the unfused eager path.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    flex_attention,
)

_EAGER_WARNING = "flex_attention called without torch.compile"


def causal_mask_mod(window: int | None = None):
    """The ``mask_mod`` for causal attention, limited to ``window`` keys when given."""
    if window is None:
        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
        return causal

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return sliding


@functools.lru_cache(maxsize=32)
def causal_block_mask(q_len: int, kv_len: int, window: int | None = None, device: str = "cpu") -> BlockMask:
    """The :class:`BlockMask` of :func:`causal_mask_mod` for ``q_len`` queries over ``kv_len`` keys
    (both from position 0), built once per ``(q_len, kv_len, window, device)``."""
    return create_block_mask(causal_mask_mod(window), None, None, q_len, kv_len, device=device)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def attention(q, k, v, block_mask: BlockMask | None = None):
    """``flex_attention(q, k, v, block_mask, enable_gqa=True)`` compiled where that is needed
    (module docstring). ``q [B, H, S, d]``, ``k``/``v [B, Hkv, L, d]`` -> ``[B, H, S, d]``."""
    if torch.compiler.is_compiling():
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    if q.device.type == "cuda":
        return _compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_EAGER_WARNING)
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)


def decode_key_range(pos: int, window: int | None) -> tuple[int, int]:
    """``(start, stop)`` of the cache positions a decode token at ``pos`` attends to."""
    stop = pos + 1
    return (max(0, stop - window) if window else 0), stop
