"""Prefill and mixed iterations from CUDA graphs, one per (chunk rows, decode rows) bucket.

An iteration that carries prefill chunks (with or without decode members) runs, when it fits,
as one graph replay instead of a Python launch of every op of every layer (the eager path
spent a median 137 ms of host time per such iteration on the llama-3-8b shape, 32 layers).

Shape buckets. The iteration's rows are ``[decode rows | chunk rows]``:

* the leading single-token members (decode; the scheduler puts them first) are padded to a
  decode bucket ``bd`` (0, 1, 2, 4, ... ``max_num_seqs``; padding rows repeat row 0, as in
  :mod:`.graphs`), attended by the decode graphs' kernel (the paged split-KV kernels of
  :mod:`tracestory.models.decode_attn_triton`, else FlexAttention's decoding kernel);
* the other members' tokens, ``tc`` rows, are padded to a chunk bucket ``R`` (128, 256, 384, ...
  1024, 1280, 1536, 1920, ... up to the token budget rounded up to 128: :func:`chunk_buckets`), attended as one query
  sequence by the chunk kernel. Padding rows read token 0 at position 0, write their K/V into
  the cache's scratch block (the extra block after ``num_blocks`` that no table lists) and
  belong to nobody in the mask (their outputs are discarded).

Static buffers (device; filled per iteration from pinned host buffers by two copies, one
``int64`` and one ``int32``)::

    int64: tok[N] pos[N] slot[N] (N = bd + R)   mtab[M, W] member block tables (M = max_num_seqs;
           unused rows and columns = num_blocks)   didx[bd] member (= row) of each decode bucket row
           srow[M] row of each sampled token (padding: 0)
    int32: dnblk[bd] dtab[bd, W] (the decode block mask)   rown[R] row owners (-2: padding)
           kvn[nQ] kvi[nQ, KW] chunk tile lists (nQ = R / 128; KW = the cache's KV tiles,
           ``FlexPagedAttention.chunk_width``: 64-key tiles of 4 blocks of 16), fkn[nQ]
           fki[nQ, KW] the full tiles (the mask skipped: :func:`.paged_attention.chunk_tiles`)

``W`` is the decode graphs' table width (``max_model_len`` / block size); an iteration with a
longer table, more members than ``max_num_seqs``, more decode members than the last bucket or
more chunk rows than the last bucket runs eagerly (:meth:`MixedGraphs.fits`). Every sampled row
is computed through the LM head (``M`` rows, padding included): cheap next to the layers.

Capture: per bucket two warm-up runs (the kernels for these shapes were compiled by the model's
start-up warm-ups; a missed one compiles here, not under load), then ``torch.cuda.graph`` with one
memory pool shared by all buckets (one graph runs at a time). ``use_graphs=False`` runs the same
body without graphs (the CPU tests, and the fallback when a capture fails).

Fresh prompts (:mod:`.fresh_attention`): an iteration whose every chunk starts at position 0
has its own bucket ``(bd, R, True)``, whose graph attends the chunk rows with one flash call over
the K/V just written (``cu``: the members' cumulative row offsets, then the padding rows as one
sequence, then empty ones; ``int32[M + 2]``) instead of the FlexAttention chunk kernel; the
others ``(bd, R, False)``. Only where the model says so (:attr:`PagedLlama._fresh`: CUDA, bf16 or
fp16, ``TRACESTORY_FRESH_ATTN`` not 0), so twice the graphs then.

Limits: the chunk tile lists are as wide as the cache (the compiled kernel's shape does not vary
with the iteration), so each iteration copies ``2 x nQ x KW`` int32 (0.6 MB at 16 tiles of
18,000 blocks of 16); the token budget bounds ``R``; buckets grow by 1.5x or 2x, so up to a third of a bucket's
rows can be padding (their matmul FLOPs are spent).
"""

from __future__ import annotations

import time

from ..capture.region import timed
from . import fresh_attention
from .graphs import bucket_for
from .paged_attention import PAD_ROW, Q_TILE, chunk_tiles

RING = 4


def chunk_buckets(max_batch_tokens: int) -> list[int]:
    """Chunk row buckets: each bucket a quarter above the last, in whole 128-row query tiles and
    at least one tile (128, 256, 384, ... 1024 in steps of 128, then 1280, 1536, 1920, 2048...),
    up to the token budget rounded up to 128, then that. A chunk of ``tc`` rows pads to the
    first bucket >= ``tc``, so at most a fifth of a bucket's rows are padding (a step of a
    quarter) and, below 1,024 rows, fewer than one query tile. Padding rows run every GEMM like
    real ones: in call 26 of docs/BENCHMARKS.md (512-1023-token prompts, median 765 chunk rows)
    the earlier 1.5x/2x steps (128, 256, 384, 512, 768, 1024, 1536, 2048) made 14.2% of the chunk
    rows padding; these steps make 7.4% of the same iterations' rows padding, for 12 buckets
    instead of 8 (each bucket costs start-up time: a compile of the chunk kernel and one graph
    per decode bucket)."""
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    top = -(-max_batch_tokens // Q_TILE) * Q_TILE
    out, r = [], Q_TILE
    while r < top:
        out.append(r)
        r += max(Q_TILE, r // 4 // Q_TILE * Q_TILE)
    return out + [top]


class MixedGraphs:
    """Static buffers, block masks and graphs of a model's prefill and mixed iterations."""

    def __init__(self, model, decode_buckets: list[int], row_buckets: list[int], width: int,
                 max_members: int, *, use_graphs: bool = True, fresh: bool | None = None):
        import numpy as np
        import torch

        self.model, self.torch, self.np = model, torch, np
        self.dbuckets = [0] + list(decode_buckets)
        self.rbuckets = list(row_buckets)
        self.width, self.M, self.use_graphs = int(width), int(max_members), use_graphs
        self.on_cuda = bool(model.on_cuda)
        # fresh-prompt buckets (module docstring); the model decides unless told
        self.fresh = bool(getattr(model, "_fresh", False)) if fresh is None else bool(fresh)
        self.fresh_runs = 0                  # iterations run through a fresh bucket (tests, logs)
        if use_graphs and not self.on_cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        B, R, W, M = self.dbuckets[-1], self.rbuckets[-1], self.width, self.M
        kw = self.kw = model._flex.chunk_width       # KV tiles per chunk tile list
        self.bmax, self.rmax, self.nq = B, R, -(-R // Q_TILE)
        N = B + R
        # int64 layout
        self._o64 = o = {}
        off = 0
        for name, n in (("tok", N), ("pos", N), ("slot", N), ("mtab", M * W), ("didx", B), ("srow", M)):
            o[name] = (off, n)
            off += n
        self._n64 = off
        self._o32 = o32 = {}
        off = 0
        for name, n in (("dnblk", B), ("dtab", B * W), ("rown", R), ("kvn", self.nq), ("kvi", self.nq * kw),
                        ("fkn", self.nq), ("fki", self.nq * kw), ("cu", M + 2)):
            o32[name] = (off, n)
            off += n
        self._n32 = off
        dev = model.device
        self.d64 = torch.zeros(self._n64, dtype=torch.long, device=dev)
        self.d32 = torch.zeros(self._n32, dtype=torch.int32, device=dev)
        self.ring = [(torch.zeros(self._n64, dtype=torch.long, pin_memory=self.on_cuda),
                      torch.zeros(self._n32, dtype=torch.int32, pin_memory=self.on_cuda),
                      torch.cuda.Event() if self.on_cuda else None) for _ in range(RING)]
        self._next = 0
        v = self.d64
        self.tok, self.pos, self.slot = (v[o[k][0]:o[k][0] + o[k][1]] for k in ("tok", "pos", "slot"))
        self.mtab = v[o["mtab"][0]:o["mtab"][0] + M * W].view(M, W)
        self.didx = v[o["didx"][0]:o["didx"][0] + B]
        self.srow = v[o["srow"][0]:o["srow"][0] + M]
        self.mids = torch.arange(M, device=dev)
        w = self.d32
        self.dnblk = w[o32["dnblk"][0]:o32["dnblk"][0] + B]
        self.dtab = w[o32["dtab"][0]:o32["dtab"][0] + B * W].view(B, W)
        self.rown = w[o32["rown"][0]:o32["rown"][0] + R]
        self.kvn = w[o32["kvn"][0]:o32["kvn"][0] + self.nq]
        self.kvi = w[o32["kvi"][0]:o32["kvi"][0] + self.nq * kw].view(self.nq, kw)
        self.fkn = w[o32["fkn"][0]:o32["fkn"][0] + self.nq]
        self.fki = w[o32["fki"][0]:o32["fki"][0] + self.nq * kw].view(self.nq, kw)
        self.cu = w[o32["cu"][0]:o32["cu"][0] + M + 2]
        self.graphs: dict[tuple[int, int, bool], object] = {}
        self.dmasks: dict[int, object] = {}
        self.cmasks: dict[int, object] = {}
        self.failed: str | None = None       # why graphs were given up (the static body still runs)

    # ------------------------------------------------------------------ what fits
    def split(self, members) -> int:
        """How many leading members go through the decode call (single-token, table within W)."""
        lead = 0
        while (lead < len(members) and members[lead].tokens == 1
               and len(members[lead].block_table) <= self.width):
            lead += 1
        return min(lead, self.bmax)

    def key(self, members) -> tuple[int, int, bool] | None:
        """The bucket ``(bd, R, fresh)`` of an iteration with chunk rows, or None when it does not
        fit; ``fresh``: every chunk starts at position 0 and the fresh buckets are on."""
        if not members or len(members) > self.M:
            return None
        if any(len(m.block_table) > self.width for m in members):
            return None
        lead = self.split(members)
        tc = sum(m.tokens for m in members[lead:])
        if tc == 0:
            return None                     # decode-only: the decode graphs' job
        bd = bucket_for(lead, self.dbuckets) if lead else 0
        r = bucket_for(tc, self.rbuckets)
        if bd is None or r is None:
            return None
        return bd, r, self.fresh and all(m.start == 0 for m in members[lead:])

    # ------------------------------------------------------------------ packing
    def pack(self, members, ids, key, h64, h32) -> None:
        """Fill the pinned buffers for ``members`` (input ``ids``) in bucket ``key``."""
        np, model = self.np, self.model
        bs, nb = model.block_size, model.num_blocks
        bd, R = key[:2]
        W, M = self.width, self.M
        o, o32 = self._o64, self._o32
        a, b = h64.numpy(), h32.numpy()
        lead = self.split(members)
        ids = np.asarray(ids, dtype=np.int64)
        pos_l, own_l = [], []
        for i, m in enumerate(members):
            pos_l.append(np.arange(m.start, m.start + m.tokens, dtype=np.int64))
            own_l.append(np.full(m.tokens, i, dtype=np.int64))
        pos = np.concatenate(pos_l)
        own = np.concatenate(own_l)
        tabs = np.full((M, W), nb, dtype=np.int64)
        for i, m in enumerate(members):
            tabs[i, :len(m.block_table)] = m.block_table
        slot = tabs[own, pos // bs] * bs + pos % bs
        N = bd + R
        tok = np.zeros(N, dtype=np.int64)
        p = np.zeros(N, dtype=np.int64)
        s = np.full(N, nb * bs, dtype=np.int64)      # padding rows write the scratch block
        if bd:
            src = np.where(np.arange(bd) < lead, np.arange(bd), 0)
            tok[:bd], p[:bd], s[:bd] = ids[src], pos[src], slot[src]
        tc = len(ids) - lead
        tok[bd:bd + tc], p[bd:bd + tc], s[bd:bd + tc] = ids[lead:], pos[lead:], slot[lead:]
        a[o["tok"][0]:o["tok"][0] + N] = tok
        a[o["pos"][0]:o["pos"][0] + N] = p
        a[o["slot"][0]:o["slot"][0] + N] = s
        a[o["mtab"][0]:o["mtab"][0] + M * W] = tabs.ravel()
        if bd:
            a[o["didx"][0]:o["didx"][0] + bd] = src      # decode row -> member (= its row); pads: 0
        rows, off = [], 0
        for i, m in enumerate(members):
            off += m.tokens
            if m.samples:                     # the member's last row, in [decode | chunk] order
                rows.append(off - 1 if i < lead else bd + (off - 1 - lead))
        srow = np.zeros(M, dtype=np.int64)
        srow[:len(rows)] = rows
        a[o["srow"][0]:o["srow"][0] + M] = srow
        # int32: decode mask, row owners, chunk tile lists
        if bd:
            b[o32["dnblk"][0]:o32["dnblk"][0] + bd] = (-(-(pos[src] + 1) // bs))
            b[o32["dtab"][0]:o32["dtab"][0] + bd * W] = tabs[src].ravel()
        rown = np.full(R, PAD_ROW, dtype=np.int32)
        rown[:tc] = own[lead:]
        b[o32["rown"][0]:o32["rown"][0] + R] = rown
        nq = -(-R // Q_TILE)
        tiles, off = [], 0
        for m in members[lead:]:
            tiles.append((off, m.tokens, m.start, m.block_table))
            off += m.tokens
        ct = chunk_tiles(tiles, bs, R, model._flex.group)
        kw = self.kw
        for nk, ik, num, idx in (("kvn", "kvi", ct.kv_num, ct.kv_idx), ("fkn", "fki", ct.full_num, ct.full_idx)):
            b[o32[nk][0]:o32[nk][0] + nq] = num
            full = np.empty((nq, kw), dtype=np.int32)
            full[:, :idx.shape[1]] = idx[:, :kw]
            full[:, idx.shape[1]:] = idx[:, :1]      # padding entries repeat the first, never read
            b[o32[ik][0]:o32[ik][0] + nq * kw] = full.ravel()
        if len(key) > 2 and key[2]:
            b[o32["cu"][0]:o32["cu"][0] + M + 2] = fresh_attention.offsets([m.tokens for m in members[lead:]], R, M + 1)

    # ------------------------------------------------------------------ masks, body, graphs
    def masks(self, key):
        """The decode and chunk block masks of a bucket: views of the static buffers."""
        bd, R = key[:2]
        model = self.model
        fa, slots = model._flex, model.k_cache[0].shape[0]
        if bd and bd not in self.dmasks:
            self.dmasks[bd] = fa.decode_block_mask(self.dtab[:bd], self.dnblk[:bd], slots)
        if R not in self.cmasks:
            nq = -(-R // Q_TILE)
            self.cmasks[R] = fa.chunk_block_mask(self.kvn[:nq], self.kvi[:nq], R, slots, self.fkn[:nq], self.fki[:nq])
        return (self.dmasks[bd] if bd else None), self.cmasks[R]

    def body(self, key) -> None:
        """One iteration of bucket ``key`` over the static buffers (no host sync, no allocation
        that depends on the contents), sampled ids into the model's buffer."""
        self.model._mixed_static(self, key, *self.masks(key))

    def build(self, say) -> tuple[float, float]:
        """Warm up and capture every bucket; returns (warm-up seconds, capture seconds). A
        capture that fails gives graphs up (said once; the static body keeps running)."""
        torch, model = self.torch, self.model
        for key in self.keys():
            self.masks(key)
        self._harmless()
        if not self.on_cuda:
            return 0.0, 0.0
        warm_s = capture_s = 0.0
        stream = torch.cuda.Stream(model.device)
        stream.wait_stream(torch.cuda.current_stream(model.device))
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        for key in self.keys():
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.body(key)
            torch.cuda.synchronize(model.device)
            warm_s += time.perf_counter() - t0
            if not self.use_graphs:
                continue
            t0 = time.perf_counter()
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream, pool=pool):
                    self.body(key)
                torch.cuda.synchronize(model.device)
            except Exception as e:  # noqa: BLE001 -- keep serving without graphs, say why
                self.failed = f"graph capture of mixed bucket {key} failed: {' '.join(str(e).split())[:200]}"
                say(self.failed + "; prefill and mixed iterations run the static body without graphs")
                self.graphs.clear()
                self.use_graphs = False
                break
            self.graphs[key] = g
            capture_s += time.perf_counter() - t0
        torch.cuda.current_stream(model.device).wait_stream(stream)
        return warm_s, capture_s

    def keys(self) -> list[tuple[int, int, bool]]:
        fresh = (False, True) if self.fresh else (False,)
        return [(bd, r, f) for r in self.rbuckets for bd in self.dbuckets for f in fresh]

    def _harmless(self) -> None:
        """Inputs that touch only the scratch block: every row writes there, owns nothing."""
        model = self.model
        nb, bs = model.num_blocks, model.block_size
        self.d64.zero_()
        self.slot.fill_(nb * bs)
        self.mtab.fill_(nb)
        self.d32.zero_()
        self.dnblk.fill_(1)
        self.dtab.fill_(nb)
        self.rown.fill_(PAD_ROW)
        self.kvn.fill_(1)
        self.kvi.fill_(nb // model._flex.group)      # the KV tile holding the scratch block
        self.fkn.fill_(0)
        self.fki.fill_(nb // model._flex.group)
        self.cu.zero_()                  # every fresh sequence empty: nothing read beyond any bucket

    def run(self, members, ids, key) -> None:
        """Copy the inputs (two copies) and replay the bucket's graph (or run its body)."""
        h64, h32, ev = self.ring[self._next]
        self._next = (self._next + 1) % RING
        if ev is not None:
            with timed("input_wait_ns"):          # the event log's line (serve.engine)
                ev.synchronize()                  # the copies that last read these buffers are done
        self.pack(members, ids, key, h64, h32)
        self.d64.copy_(h64, non_blocking=self.on_cuda)
        self.d32.copy_(h32, non_blocking=self.on_cuda)
        if ev is not None:
            ev.record()
        self.fresh_runs += bool(len(key) > 2 and key[2])
        if self.use_graphs and key in self.graphs:
            with timed("replay_ns"):
                self.graphs[key].replay()
        else:
            self.body(key)
