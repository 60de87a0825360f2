"""Attention of fresh prompts: chunks whose keys are their own tokens, through a flash kernel.

A prefill chunk that starts at position 0 (a fresh prompt: no earlier cached blocks) attends
only to the K/V its own iteration just computed. For an iteration whose every chunk is fresh,
the chunk rows ``[R, H, d]`` (``R`` = the chunk bucket, the last ``R - tc`` rows padding) are one
variable-length batch of causal sequences described by cumulative row offsets::

    cu = [0, n_1, n_1 + n_2, ..., tc, R, R, ..., R]      (int32, length max_members + 2)

one sequence per chunk member, then the padding rows as one sequence of their own (their output
is discarded), then empty sequences up to a fixed count, so the tensor's shape, and with it a
CUDA graph of the call, does not depend on the iteration. K/V are read back from the cache at
the rows' slots (the RoPE kernel wrote them there; a gather of ``2 R Hkv d`` values, about 8 MB
at R = 2,048), and the batch runs one call of FlashAttention-2's variable-length kernel
(``torch.ops.aten._flash_attention_forward`` with ``cum_seq_q = cum_seq_k = cu``, causal,
``max_q = max_k = R``, grouped-query heads as they are). The paged FlexAttention kernel stays
for chunks that attend to cached blocks (:mod:`.paged_attention`).

Why: on one H100 the compiled FlexAttention chunk kernel over the paged cache ran a 2,048-token
prompt in 0.268 ms where cuDNN's SDPA took 0.115 ms and flash 0.207 ms on contiguous K/V
(docs/BENCHMARKS.md, "The chunk attention kernel alone").

Off CUDA (the CPU tests) the same call runs :func:`reference`: SDPA with the block-diagonal
causal mask that ``cu`` describes (math, no host sync), the semantics the flash call must match.
``TRACESTORY_FRESH_ATTN=0`` turns the path off (every chunk through FlexAttention: A/B).

Limits: causal prompts from position 0 only; softmax scale ``1/sqrt(d)``; bf16/fp16 on CUDA
(flash's dtypes); a zero-length sequence in ``cu`` relies on the kernel skipping it (checked
against :func:`reference` in float32 by ``benchmarks/gpu/fresh_attn.py`` on an H100, eagerly and
from a CUDA graph: every layout there has empty sequences).

Not cuDNN (yet): its variable-length call (``aten._cudnn_attention_forward`` over ``cu``) runs
the attention in 64 us of device time where flash takes 155 us (2 x 1,024 tokens, H100), but
torch 2.11 rebuilds its cuDNN graph at every call (46-62 ms of host time) and cannot capture it;
FlexAttention with a document mask was 1.5-3.3x slower than flash (docs/BENCHMARKS.md, "Faster
kernels for fresh prompts, tried").
"""

from __future__ import annotations

from ..models.switches import env_on

ENV = "TRACESTORY_FRESH_ATTN"


def enabled() -> bool:
    """The fresh-prompt path is on unless ``TRACESTORY_FRESH_ATTN=0``."""
    return env_on(ENV)


def offsets(lengths, rows: int, count: int):
    """``cu`` (numpy int32, ``count + 1`` entries, module docstring) for chunk members of
    ``lengths`` tokens in a bucket of ``rows`` rows: ``count`` sequences in all (the members, the
    padding rows when there are any, then empty ones). ValueError when they do not fit."""
    import numpy as np

    lengths = [int(n) for n in lengths]
    tc = sum(lengths)
    if tc > rows or any(n < 1 for n in lengths):
        raise ValueError(f"chunk lengths {lengths} do not fit a bucket of {rows} rows")
    need = len(lengths) + (1 if tc < rows else 0)
    if need > count:
        raise ValueError(f"{need} sequences exceed the {count} prepared for")
    cu = np.full(count + 1, rows, dtype=np.int32)
    cu[0] = 0
    cu[1:len(lengths) + 1] = np.cumsum(lengths)
    return cu


def is_fresh(chunks) -> bool:
    """Whether every chunk ``(start, tokens)`` starts at position 0."""
    chunks = list(chunks)
    return bool(chunks) and all(int(start) == 0 for start, _n in chunks)


def attend(q, kc, vc, slots, cu, rows: int):
    """``q`` ``[H, R, d]`` (the chunk rows, padded to ``R = rows``), the layer's caches ``[S, Hkv, d]``
    holding these rows' K/V at ``slots`` ``[R]``, ``cu`` (device int32) -> ``[R, H*d]``."""
    H, R, d = q.shape
    k, v = kc[slots], vc[slots]                           # [R, Hkv, d]
    qt = q.transpose(0, 1).contiguous()                   # [R, H, d]
    if q.device.type != "cuda":
        return reference(qt, k, v, cu).reshape(R, H * d)
    torch = _torch()
    o = torch.ops.aten._flash_attention_forward(qt, k, v, cu, cu, rows, rows, 0.0, True, False)[0]
    return o.reshape(R, H * d)


def reference(q, k, v, cu):
    """SDPA over ``q`` ``[R, H, d]``, ``k, v`` ``[R, Hkv, d]`` with the causal block-diagonal mask of
    ``cu`` (row ``i`` sees row ``j`` when both lie in one sequence and ``j <= i``) -> ``[R, H, d]``."""
    torch = _torch()
    import torch.nn.functional as F

    R, H, d = q.shape
    g = H // k.shape[1]
    idx = torch.arange(R, device=q.device)
    seq = torch.searchsorted(cu.to(torch.int64), idx, right=True)      # sequence of each row
    mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
    kk = k.repeat_interleave(g, dim=1).transpose(0, 1)                  # [H, R, d]
    vv = v.repeat_interleave(g, dim=1).transpose(0, 1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask)   # [H, R, d]
    return o.transpose(0, 1)


def _torch():
    import torch

    return torch
