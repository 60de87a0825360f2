"""The host-side plan of the paged split-KV decode attention (:mod:`.decode_attn_triton`).

No heavy import here (the CPU tests check this part without Triton). The kernels' model:

* one new token per sequence ``b`` at position ``pos[b]`` attends the keys ``0..pos[b]`` of its
  block table (its own K/V already written), GQA: the ``G = H / Hkv`` query heads of one KV head
  share its keys;
* one program per (sequence, KV head, split): the split takes an equal share of
  the sequence's key tiles of :data:`BLOCK_N` keys (``ceil(tiles / splits)`` each, so a short
  context leaves the last splits empty), gathers each tile's keys through the block table, and
  keeps an online softmax in float32; it writes its partial ``(max, sum, acc)`` per query head
  to a workspace;
* a second kernel, one program per (sequence, query head), combines the partials of the
  non-empty splits; or (``fused``, opt-in: ``TRACESTORY_DECODE_ATTN_FUSED=1``) the last split
  program of a (sequence, KV head) to finish does it for the group's heads, and optionally
  (``TRACESTORY_DECODE_ATTN_QUANT=1``) the last group of a sequence writes the FP8 row-wise
  quantisation of the output row, the input of an FP8 ``Wo`` (both read by
  :func:`.switches.opted_in`).

The split count is fixed per call from the batch, the KV heads, the GPU's SM count and the
longest context the call may see (:func:`num_splits`), never from the positions, so a CUDA graph
captured once replays with new tables and positions: no host sync, no shape from the data.

Limits: one query token per sequence (decode only; prefill chunks and the decode rows of mixed
iterations stay on FlexAttention); no sliding window; float16, bfloat16 or float32.
"""

from __future__ import annotations

from .switches import env_on

ENV = "TRACESTORY_DECODE_ATTN"
# opt-in until measured on a GPU (their results were checked there, their speed not yet):
FUSED_ENV = "TRACESTORY_DECODE_ATTN_FUSED"   # 1: the last split combines (one launch a layer, not two)
QUANT_ENV = "TRACESTORY_DECODE_ATTN_QUANT"   # 1 (with FUSED): the kernel also writes Wo's FP8 input
BLOCK_N = 64          # keys per tile of kernel 1
WAVES = 2             # programs of kernel 1 aimed at: WAVES x the SM count
MAX_SPLITS = 32       # most splits per (sequence, KV head)


def num_splits(batch: int, kv_heads: int, sms: int, max_keys: int, *, block_n: int = BLOCK_N,
               waves: int = WAVES, cap: int = MAX_SPLITS) -> int:
    """Splits per (sequence, KV head): enough programs for ``waves`` x ``sms``
    (``ceil(waves * sms / (batch * kv_heads))``), at most ``cap`` and at most the key tiles of
    the longest context ``max_keys`` (a split beyond those would be empty for every sequence);
    at least 1."""
    if batch < 1 or kv_heads < 1 or sms < 1 or max_keys < 1:
        raise ValueError(f"num_splits: expected positive batch, kv_heads, sms, max_keys, found "
                         f"{batch}, {kv_heads}, {sms}, {max_keys}")
    want = -(-waves * sms // (batch * kv_heads))
    tiles = -(-max_keys // block_n)
    return max(1, min(want, cap, tiles))


def split_ranges(pos: int, splits: int, block_n: int = BLOCK_N) -> list[tuple[int, int]]:
    """The key tiles ``[t0, t1)`` each split of a sequence at position ``pos`` reads (the
    kernels' arithmetic, in Python: ``per = ceil(tiles / splits)``; split ``s`` reads
    ``s * per .. min((s + 1) * per, tiles)``, empty when ``s * per >= tiles``)."""
    tiles = -(-(pos + 1) // block_n)
    per = -(-tiles // splits)
    return [(min(s * per, tiles), min((s + 1) * per, tiles)) for s in range(splits)]


def workspace_shapes(batch: int, heads: int, splits: int, head_dim: int) -> dict[str, tuple[int, ...]]:
    """Float32 workspace of the partials: running max and sum ``[B, H, S]``, unnormalised
    output ``[B, H, S, d]``."""
    return {"max": (batch, heads, splits), "sum": (batch, heads, splits),
            "acc": (batch, heads, splits, head_dim)}


def query_rows(group: int) -> int:
    """Rows of kernel 1's query tile: the group's heads padded to a power of two >= 16 (tl.dot)."""
    n = 16
    while n < group:
        n *= 2
    return n


def wanted(dtype_name: str, on_cuda: bool) -> bool:
    """Whether the decode graphs should use the kernels: CUDA, a dtype they take and
    ``TRACESTORY_DECODE_ATTN`` not off (Triton's presence is checked by the caller)."""
    return on_cuda and dtype_name in ("float16", "bfloat16", "float32") and env_on(ENV)

