"""The built-in Llama testbench model run over the paged KV cache, one forward per iteration.

Weights: the decoder layers are those of :func:`tracestory.models.llama.build_model` (same
seed, same layer math: RMSNorm, RoPE rotate-half, GQA, SwiGLU), plus a random token embedding
``[vocab, D]``, a final RMSNorm and a random LM head ``[vocab, D]`` (scaled 1/sqrt(D)). Random
weights, fixed seed: the generated ids are meaningless but deterministic.

Cache: per layer one K and one V tensor of ``[num_blocks * block_size, Hkv, d]`` token slots;
token position ``p`` of a request lives in slot ``table[p // bs] * bs + p % bs`` of its block
table (:mod:`.kv_cache`).

One iteration (:meth:`PagedLlama.step`) over members ``m`` with ``n_m`` new tokens at positions
``start_m .. start_m + n_m - 1``::

    x = embed[concat(token ids)]                                   # [T, D], T = sum n_m
    per layer:
        q, k, v = RoPE(Wq·n1(x)), RoPE(Wk·n1(x)), Wv·n1(x)          # [T, H|Hkv, d]
        K[slots], V[slots] = k, v                                   # write the new tokens
        per member: o_m = SDPA(q_m, K[ctx slots], V[ctx slots])     # keys 0..start_m+i for query i
        x = x + Wo·o ;  x = x + Wd·(silu(Wg·n2(x)) * Wu·n2(x))
    next token of a sampling member = argmax(LM head · norm(x[last row of m]))

The matmuls and MLP run once over all ``T`` tokens (prefill chunks and decode tokens mixed).
Attention gathers K/V through the block tables: the single-token members (decode) in one
batched SDPA, their contexts padded to the longest and the padding masked; each longer member
(a prefill chunk) in its own SDPA with a causal mask offset by its start. Query heads are
folded into ``Hkv`` groups (``[.., Hkv, g·n, d]``) so K/V are not repeated per head.
Correctness over speed: the gather copies every member's context in every layer (no paged
attention kernel), and the index tensors of an iteration go to the device in one copy.

Each iteration is a :func:`tracestory.region` named ``iteration N``, so torch.profiler, nsys and
ncu see the iterations. Device memory (``torch.cuda.memory_allocated/reserved``) is reported on
CUDA only (:meth:`PagedLlama.memory`; ``None`` on CPU).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ..capture.region import region
from ..models.llama_config import LlamaConfig, layer_params

# A realistic LM-head width for the real presets, a small one for the tiny test config.
DEFAULT_VOCAB = {"tiny": 512, "llama-2-7b": 32000, "llama-3-8b": 128256}


def kv_bytes_per_block(cfg: LlamaConfig, layers: int, block_size: int, dtype_bytes: int) -> int:
    """Bytes of K and V for one block over all layers: ``2 * layers * block_size * Hkv * d * b``."""
    return 2 * layers * block_size * cfg.n_kv_heads * cfg.head_dim * dtype_bytes


def weight_bytes(cfg: LlamaConfig, layers: int, vocab: int, dtype_bytes: int) -> int:
    """Bytes of the weights: the layers plus embedding, LM head and final norm."""
    return (layers * layer_params(cfg) + 2 * vocab * cfg.dim + cfg.dim) * dtype_bytes


def _identity(x):
    return x


def _sdpa_backends():
    """SDPA without the cuDNN backend: it builds an execution plan for every new shape (about
    40 ms each on an H200 with torch 2.11), and under continuous batching nearly every iteration
    has a new (members, longest context) shape. Flash, memory-efficient and math kernels need no
    plan. A no-op where torch has no ``torch.nn.attention``."""
    import contextlib

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class PagedLlama:
    """``layers`` Llama decoder layers with an embedding, LM head and a paged KV cache."""

    def __init__(self, cfg: LlamaConfig, *, layers: int, num_blocks: int, block_size: int,
                 vocab: int | None = None, device: str = "cpu", dtype=None, seed: int = 0):
        import torch

        from ..models import llama

        self.torch = torch
        self.cfg = cfg
        self.num_layers = int(layers)
        self.block_size = int(block_size)
        self.num_blocks = int(num_blocks)
        self.vocab = int(vocab or DEFAULT_VOCAB.get(cfg.name, 32000))
        self.device = device
        self.dtype = dtype or torch.float32
        self._rms_norm, self._rope, self._linear = llama.rms_norm, llama.rope, llama.linear
        # the layers' own contiguous caches (batch 1, max_len 1) are unused: a few bytes each
        self.stack = llama.build_model(cfg, layers=layers, batch=1, max_len=1, device=device, dtype=self.dtype, seed=seed)
        gen = torch.Generator().manual_seed(seed + 1)
        D = cfg.dim
        self.embed = torch.randn(self.vocab, D, generator=gen).to(device, self.dtype)
        self.norm = (1 + 0.1 * torch.randn(D, generator=gen)).to(device, self.dtype)
        self.lm_head = (torch.randn(self.vocab, D, generator=gen) / D ** 0.5).to(device, self.dtype)
        slots = self.num_blocks * self.block_size
        shape = (slots, cfg.n_kv_heads, cfg.head_dim)
        self.k_cache = [torch.zeros(shape, device=device, dtype=self.dtype) for _ in range(layers)]
        self.v_cache = [torch.zeros(shape, device=device, dtype=self.dtype) for _ in range(layers)]
        d = cfg.head_dim
        self._inv_freq = (1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)).to(device)
        self._table_dtype = torch.promote_types(self.dtype, torch.float32)
        # sums the partial outputs of row-parallel projections across tensor-parallel ranks;
        # the identity on one GPU
        self.tp_reduce = _identity

    # ------------------------------------------------------------------ public
    def step(self, members: Sequence, iteration: int | None = None) -> dict[str, int]:
        """Run one iteration over scheduler members (:class:`~.scheduler.Member`); returns the
        greedy next token of every member with ``samples``."""
        torch = self.torch
        name = f"iteration {iteration}" if iteration is not None else "iteration"
        with region(name), torch.inference_mode():
            ids = [t for m in members for t in m.token_ids]
            x = self.embed[torch.tensor(ids, device=self.device, dtype=torch.long)]
            spans = [(m.start, m.tokens, m.block_table) for m in members]
            h = self.forward_hidden(x, spans)
            rows, who, off = [], [], 0
            for m in members:
                off += m.tokens
                if m.samples:
                    rows.append(off - 1)
                    who.append(m.request_id)
            if not rows:
                return {}
            last = self._rms_norm(h[torch.tensor(rows, device=self.device)], self.norm, self.cfg.norm_eps)
            logits = self._linear(last, self.lm_head)          # [n_sampling, vocab]
            nxt = logits.float().argmax(-1).tolist()                           # syncs the device
        return dict(zip(who, (int(t) for t in nxt)))

    def forward_hidden(self, x, spans: Sequence[tuple[int, int, Sequence[int]]]):
        """Hidden states ``[T, D]`` after the layers for ``x`` ``[T, D]`` made of spans
        ``(start, n, block_table)``: ``n`` tokens at positions ``start..start+n-1`` of a request
        whose cache blocks are ``block_table``. Writes their K/V into the cache."""
        lay = self._layout(spans)
        with _sdpa_backends():
            return self._layers(x, lay)

    def _layers(self, x, lay):
        import torch.nn.functional as F

        torch, cfg = self.torch, self.cfg
        T = x.shape[0]
        H, K, d, g = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group
        ang = lay["pos"].to(torch.float64)[:, None] * self._inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos().to(self._table_dtype), ang.sin().to(self._table_dtype)   # [T, d]
        rows, B = lay["rows"], lay["rows"].shape[0]
        for li, layer in enumerate(self.stack.layers):
            a = self._rms_norm(x, layer.n1, cfg.norm_eps)
            q = self._rope(self._linear(a, layer.wq).view(T, H, d).transpose(0, 1), cos, sin)   # [H, T, d]
            k = self._rope(self._linear(a, layer.wk).view(T, K, d).transpose(0, 1), cos, sin)   # [Hkv, T, d]
            v = self._linear(a, layer.wv).view(T, K, d)
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[lay["slots"]] = k.transpose(0, 1)
            vc[lay["slots"]] = v
            o = torch.empty(T, H * d, device=x.device, dtype=x.dtype)
            if B:
                # single-token spans (decode) in one SDPA: context padded to the longest, padding masked
                qs = q[:, rows].transpose(0, 1).reshape(B, K, g, d)             # [B, Hkv, g, d]
                ks = kc[lay["pad"]].transpose(1, 2)                              # [B, Hkv, Lmax, d]
                vs = vc[lay["pad"]].transpose(1, 2)
                os_ = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=lay["pad_mask"])
                o[rows] = os_.reshape(B, H * d)
            for off, n, cs, mask in lay["multi"]:
                qm = q[:, off:off + n].reshape(K, g * n, d)                   # [Hkv, g·n, d]
                km, vm = kc[cs].transpose(0, 1), vc[cs].transpose(0, 1)       # [Hkv, ctx, d]
                om = F.scaled_dot_product_attention(qm, km, vm, attn_mask=mask)
                o[off:off + n] = om.reshape(H, n, d).transpose(0, 1).reshape(n, H * d)
            h = x + self.tp_reduce(self._linear(o, layer.wo))
            m = self._rms_norm(h, layer.n2, cfg.norm_eps)
            x = h + self.tp_reduce(self._linear(F.silu(self._linear(m, layer.wg)) * self._linear(m, layer.wu), layer.wd))
        return x

    def memory(self) -> dict | None:
        """``{"allocated_bytes", "reserved_bytes"}`` of the CUDA caching allocator; None on CPU."""
        torch = self.torch
        if not str(self.device).startswith("cuda"):
            return None
        return {"allocated_bytes": int(torch.cuda.memory_allocated(self.device)),
                "reserved_bytes": int(torch.cuda.memory_reserved(self.device))}

    # ------------------------------------------------------------------ helpers
    def _layout(self, spans) -> dict:
        """Index tensors of one forward, built in numpy and copied to the device in one transfer:
        ``pos``/``slots`` of the new tokens; for the single-token spans their rows in the batch,
        their context slots padded to the longest (``pad`` [B, Lmax], padding -> slot 0) and the
        padding mask (None when all contexts are equally long); for longer spans (prefill
        chunks) ``(offset, n, context slots, causal mask)``: query i (position start+i) sees keys
        0..start+i, the mask rows repeated per folded query head."""
        import numpy as np

        torch, bs, dev, g = self.torch, self.block_size, self.device, self.cfg.group
        pos_l, slot_l, single, multi = [], [], [], []
        off = 0
        for start, n, table in spans:
            ctx = start + n
            table = np.asarray(table, dtype=np.int64)
            if len(table) * bs < ctx:
                raise ValueError(f"block table of {len(table)} blocks cannot hold {ctx} tokens")
            p = np.arange(ctx, dtype=np.int64)
            cs = table[p // bs] * bs + p % bs
            pos_l.append(p[start:])
            slot_l.append(cs[start:])
            (single if n == 1 else multi).append((off, start, n, cs))
            off += n
        T, B = off, len(single)
        lmax = max((len(cs) for *_, cs in single), default=0)
        pad = np.zeros((B, lmax), dtype=np.int64)
        for i, (*_, cs) in enumerate(single):
            pad[i, :len(cs)] = cs
        ctxs = np.array([len(cs) for *_, cs in single], dtype=np.int64)
        rows = np.array([o for o, *_ in single], dtype=np.int64)
        buf = torch.from_numpy(np.concatenate(pos_l + slot_l + [rows, ctxs, pad.ravel()] + [cs for *_, cs in multi]))
        buf = buf.to(dev)
        cut = np.cumsum([0, T, T, B, B, B * lmax] + [len(cs) for *_, cs in multi])
        part = [buf[a:b] for a, b in itertools.pairwise(cut)]
        out = {"pos": part[0], "slots": part[1], "rows": part[2], "pad": part[4].view(B, lmax), "pad_mask": None}
        if B and (ctxs != lmax).any():
            keys = torch.arange(lmax, device=dev)
            out["pad_mask"] = (keys[None, :] < part[3][:, None]).view(B, 1, 1, lmax)
        out["multi"] = []
        for (o, start, n, cs), dcs in zip(multi, part[5:]):
            keys, qpos = torch.arange(len(cs), device=dev), torch.arange(start, start + n, device=dev)
            out["multi"].append((o, n, dcs, (keys[None, :] <= qpos[:, None]).repeat(g, 1)))
        return out
