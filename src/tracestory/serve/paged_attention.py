"""FlexAttention over the paged KV cache: block-table indexing in the mask, no gathered contexts.

The cache of a layer is ``[slots, Hkv, d]`` (slot ``s`` = block ``s // bs``, offset ``s % bs``),
seen by FlexAttention as one key sequence ``[1, Hkv, slots, d]`` (a strided view, no copy) that
every query row shares (batch broadcast). Two per-block tables say what a physical block holds
in this iteration, set on the device from the members' block tables before the layers run::

    block_owner[b]   = id of the member whose table lists block b (-1: nobody in this batch)
    block_logical[b] = index of b in that table (its logical block)

and per query row ``r`` its member id ``row_owner[r]`` and position ``row_pos[r]``. The mask of
query row ``r`` and physical key slot ``s`` (block ``b = s // bs``) is::

    block_owner[b] == row_owner[r]  and  block_logical[b] * bs + s % bs <= row_pos[r]

which is exact on its own: eager FlexAttention (the CPU path, which scores every slot) needs no
more. The block mask only makes the compiled kernels skip blocks: each query tile lists the KV
tiles its rows can see (the decode call: one cache block each; the chunk call: the blocks up
to each member's last position in the tile, :func:`chunk_tiles`), and the chunk call marks as
"full" the tiles wholly inside the causal past of a query tile that holds one member, so the
kernel skips ``mask_mod`` there (``BlockMask.from_kv_blocks``' full lists).

Two shapes:

* **decode**: queries ``[B, H, 1, d]`` (one row per member), tile lists = the members' block
  tables ``[B, 1, 1, W]`` with ``ceil(context / bs)`` valid entries each: FlexAttention's
  decoding kernel (split over KV) reads K/V through the table. Static buffers, so a CUDA graph
  can replay it; rows padded to a bucket repeat row 0 (same member id, same writes).
* **chunk**: the prefill tokens of a mixed iteration as one query sequence ``[1, H, T, d]``; a
  prefill chunk starting at ``start`` sees keys ``0..start+i`` for its row ``i`` (causal, offset
  by its start). Tile lists are the union over the members in each 128-row query tile of the
  blocks up to their last position there, split into masked and full tiles. On CUDA ``T`` is
  padded to a multiple of 128 (padding rows belong to nobody; their output is discarded), so
  the compiled kernel sees a few shapes only. The decode members of a mixed iteration go
  through the decode call (same buckets and table width as the graphs, so the same compiled
  kernels) when the model has decode graphs; else they are rows of the chunk.

The decode call reads its rows' member ids and positions from ``dec_owner``/``dec_pos`` (indexed
by batch entry), the chunk call from ``row_owner``/``row_pos`` (indexed by query row).

KV tiles of the chunk call: compiled, the block mask's KV tile is a group of ``64 / bs``
consecutive physical blocks (:func:`kv_group`; tile ``b // group`` holds block ``b``), so the
prefill kernel runs 64-key tiles (``BLOCK_N`` 64) over 16-token blocks; a tile is listed when
any of its blocks belongs to a member in the query tile, and the mask keeps it exact (blocks
of other requests in a listed tile score nothing). With 16-key tiles a 2,048-token chunk spent
26 ms per iteration in FlexAttention on the H100, 47% of it (benchmarks/gpu/decode_glue.py).
The caches hold whole groups (:func:`cache_blocks`: the blocks after the scratch block belong
to nobody).

Limits: no sliding window, no prefix sharing; the decode call's KV tile is one cache block; a
block size that does not divide 64 runs the chunk kernel with ``BLOCK_N`` = the largest power of
two <= 64 dividing the block size, which must be >= 16 for its matmuls; blocks of a request
scattered over the cache make tiles that are mostly other requests' keys (work, not errors).
"""

from __future__ import annotations

from typing import Any, NamedTuple

Q_TILE = 128          # query rows per tile of the block mask (FlexAttention's default)
NOBODY = -1           # block_owner of a block outside this batch
PAD_ROW = -2          # row_owner of a padding query row (matches no block)


CHUNK_KV_TILE = 64    # key slots per tile of the compiled chunk kernel (and of its block mask)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def kv_group(block_size: int, compiled: bool) -> int:
    """Cache blocks per KV tile of the chunk call: ``64 / block_size`` when compiled and the
    block size divides 64 (16-token blocks: 4), else 1 (the tile is one block)."""
    if compiled and block_size < CHUNK_KV_TILE and CHUNK_KV_TILE % block_size == 0:
        return CHUNK_KV_TILE // block_size
    return 1


def cache_blocks(num_blocks: int, block_size: int, compiled: bool) -> int:
    """Blocks the cache tensors hold: ``num_blocks``, the scratch block, then up to a whole KV
    group (:func:`kv_group`), so every chunk tile lies inside the cache; the extra blocks
    belong to nobody."""
    g = kv_group(block_size, compiled)
    return -(-(num_blocks + 1) // g) * g


class FlexPagedAttention:
    """The mask state and the FlexAttention calls of one model (shared by its layers).

    ``compiled``: wrap ``flex_attention`` in ``torch.compile`` (CUDA); else the eager
    implementation (CPU; exact, scores every slot)."""

    def __init__(self, *, num_blocks: int, block_size: int, max_rows: int, device, compiled: bool):
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        self.torch = torch
        self.bs = int(block_size)
        self.num_blocks = int(num_blocks)
        self.compiled = bool(compiled)
        # chunk tiles of `group` blocks; the tables cover every block of the cache (the
        # scratch block `num_blocks`, where padding columns point, and the group's rest)
        self.group = kv_group(self.bs, self.compiled)
        entries = cache_blocks(self.num_blocks, self.bs, self.compiled)
        self.chunk_width = entries // self.group        # KV tiles of a chunk call
        self.block_owner = torch.full((entries,), NOBODY, dtype=torch.int32, device=device)
        self.block_logical = torch.zeros(entries, dtype=torch.int32, device=device)
        self.row_owner = torch.full((max_rows,), PAD_ROW, dtype=torch.int32, device=device)
        self.row_pos = torch.zeros(max_rows, dtype=torch.int32, device=device)
        # the decode call's rows are its batch entries: their own owner/position tables
        self.dec_owner = torch.full((max_rows,), PAD_ROW, dtype=torch.int32, device=device)
        self.dec_pos = torch.zeros(max_rows, dtype=torch.int32, device=device)
        if self.compiled:
            import torch._dynamo

            # one compiled kernel per shape bucket: more than the default recompile limit
            for key in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, key):
                    setattr(torch._dynamo.config, key, max(getattr(torch._dynamo.config, key), 64))
            self._flex = torch.compile(flex_attention, dynamic=False, fullgraph=True)
        else:
            self._flex = flex_attention
        bs, owner, logical = self.bs, self.block_owner, self.block_logical
        row_owner, row_pos, dec_owner, dec_pos = self.row_owner, self.row_pos, self.dec_owner, self.dec_pos

        def decode_mask(b, h, q_idx, kv_idx):
            blk = kv_idx // bs
            return (owner[blk] == dec_owner[b]) & (logical[blk] * bs + kv_idx % bs <= dec_pos[b])

        def chunk_mask(b, h, q_idx, kv_idx):
            blk = kv_idx // bs
            return (owner[blk] == row_owner[q_idx]) & (logical[blk] * bs + kv_idx % bs <= row_pos[q_idx])

        self._decode_mask, self._chunk_mask = decode_mask, chunk_mask
        # the compiled prefill kernel's KV tile must divide the block mask's (a group of cache
        # blocks; the decoding kernel shrinks its own): the largest power of two <= 64 dividing it
        tile = 1
        while tile < 64 and (self.bs * self.group) % (tile * 2) == 0:
            tile *= 2
        # 128 query rows (the block mask's query tile), 8 warps, 3 stages: at S = 2,048 on the H100
        # 0.27 ms a layer for one prompt against 0.42 ms with (64, 64, 4 warps, 2 stages), 0.21 vs
        # 0.27 for two of 1,024 (benchmarks/gpu/chunk_attn.py, docs/BENCHMARKS.md)
        self._chunk_options = ({"BLOCK_M": Q_TILE, "BLOCK_N": tile, "num_warps": 8, "num_stages": 3}
                               if self.compiled else None)

    # ------------------------------------------------------------------ mask state
    def set_blocks(self, tables, member_ids) -> None:
        """Device-side: ``tables`` ``[R, W]`` (int64; padding columns = ``num_blocks``) and the
        member id of each table row ``[R]``. Capturable in a CUDA graph (no host sync)."""
        torch = self.torch
        self.block_owner.fill_(NOBODY)
        R, W = tables.shape
        self.block_owner[tables] = member_ids.to(torch.int32)[:, None].expand(R, W)
        self.block_logical[tables] = torch.arange(W, device=tables.device, dtype=torch.int32)[None, :].expand(R, W)
        self.block_owner[self.num_blocks:].fill_(NOBODY)    # padding columns: the scratch block, nobody's

    def decode_block_mask(self, tables_i32, nblk_i32, slots: int):
        """Block mask of ``B = len(nblk)`` single-token rows over ``slots`` key slots; its
        tensors are views of the caller's (static) buffers."""
        from torch.nn.attention.flex_attention import BlockMask

        B, W = tables_i32.shape
        return _from_kv_blocks(BlockMask, nblk_i32.view(B, 1, 1), tables_i32.view(B, 1, 1, W),
                               BLOCK_SIZE=(Q_TILE, self.bs), mask_mod=self._decode_mask, seq_lengths=(1, slots))

    def chunk_block_mask(self, kv_num_i32, kv_idx_i32, rows: int, slots: int, full_num_i32=None,
                         full_idx_i32=None):
        """Block mask of one query sequence of ``rows`` rows: ``kv_num`` ``[nQ]``, ``kv_idx``
        ``[nQ, W]`` (tiles the mask runs on) and, optionally, the full tiles ``full_num`` ``[nQ]``,
        ``full_idx`` ``[nQ, FW]`` (:func:`chunk_tiles`; the mask is skipped there)."""
        from torch.nn.attention.flex_attention import BlockMask

        nq, W = kv_idx_i32.shape
        fk = {}
        if full_num_i32 is not None:
            fk = {"full_kv_num_blocks": full_num_i32.view(1, 1, nq),
                  "full_kv_indices": full_idx_i32.view(1, 1, nq, full_idx_i32.shape[-1])}
        return _from_kv_blocks(BlockMask, kv_num_i32.view(1, 1, nq), kv_idx_i32.view(1, 1, nq, W),
                               BLOCK_SIZE=(Q_TILE, self.bs * self.group), mask_mod=self._chunk_mask,
                               seq_lengths=(rows, slots), **fk)

    # ------------------------------------------------------------------ attention
    @staticmethod
    def cache_view(cache):
        """``[slots, Hkv, d]`` -> ``[1, Hkv, slots, d]`` (a view)."""
        return cache.unsqueeze(0).transpose(1, 2)

    def decode(self, q, kc, vc, block_mask):
        """``q`` ``[H, B, d]`` (one token per member) -> ``[B, H*d]``."""
        H, B, d = q.shape
        o = self._flex(q.transpose(0, 1).unsqueeze(2), self.cache_view(kc), self.cache_view(vc),
                       block_mask=block_mask, enable_gqa=True)           # [B, H, 1, d]
        return o.reshape(B, H * d)

    def chunk(self, q, kc, vc, block_mask, rows: int):
        """``q`` ``[H, T, d]`` (all tokens of the iteration; ``rows >= T`` when padded) -> ``[T, H*d]``."""
        torch = self.torch
        H, T, d = q.shape
        qq = q.unsqueeze(0)
        # contiguous either way: the compiled kernel is specialised on the query's strides, and
        # the start-up warm-up (a whole bucket, no padding) must match the padded calls, else
        # each bucket compiles again in a live iteration (a 1-2 s stall seen on the H100)
        if rows > T:
            qq = torch.cat((qq, qq.new_zeros(1, H, rows - T, d)), dim=2)
        else:
            qq = qq.contiguous()
        o = self._flex(qq, self.cache_view(kc), self.cache_view(vc), block_mask=block_mask, enable_gqa=True,
                       kernel_options=self._chunk_options)
        return o[0, :, :T].transpose(0, 1).reshape(T, H * d)


def _from_kv_blocks(cls, kv_num, kv_idx, **kw):
    """``BlockMask.from_kv_blocks`` without the transposed (backward-only) tables where torch
    allows it: they would cost a sort per call and hold stale data in a CUDA graph."""
    try:
        return cls.from_kv_blocks(kv_num, kv_idx, compute_q_blocks=False, **kw)
    except TypeError:
        return cls.from_kv_blocks(kv_num, kv_idx, **kw)


class ChunkTiles(NamedTuple):
    """Tile lists of a chunk call, per 128-row query tile: the KV tiles the mask must run on
    (``kv_num [nQ]``, ``kv_idx [nQ, W]``) and the "full" ones where it is true for every row and
    key, so FlexAttention skips ``mask_mod`` there (``full_num [nQ]``, ``full_idx [nQ, FW]``).
    The two lists of a query tile are disjoint; padding entries repeat the list's first (0 when
    empty), never read."""

    kv_num: Any
    kv_idx: Any
    full_num: Any
    full_idx: Any


def chunk_tiles(spans, block_size: int, rows: int, group: int = 1, *, causal: bool = True,
                full: bool = True) -> ChunkTiles:
    """Host-side tile lists of a chunk call (numpy). ``spans``: ``(offset, n, start, table)`` per
    member in row order (rows ``offset..offset+n-1`` at positions ``start..start+n-1``; ``table``
    its block table); KV tile ``b // group`` holds physical block ``b``.

    For query tile ``t`` and a member with rows in it at positions ``p_lo..p_hi``:

    * listed (``causal``): the tiles of its logical blocks ``0 .. p_hi // bs`` -- the blocks a
      causal row of the tile can see (``causal=False``: the whole table, as before);
    * full (``full``), only when the member is the tile's one member (the tile's other rows are
      padding, whose outputs are discarded): a KV tile all of whose ``group`` blocks are the
      member's logical blocks ``l`` with ``(l + 1) * bs - 1 <= p_lo`` (every key at or before
      every row's position), so the mask is true on the whole tile. A prompt's chunk of ``n``
      rows then runs the mask on about ``n / 64 + 2`` tiles per query tile, the diagonal, and
      the rest full; tiles of several members stay masked (their rows must not see each other).

    Widths: ``W`` / ``FW`` the widest list, at least 1."""
    import numpy as np

    nq = max(1, blocks_for(rows, Q_TILE))
    lists: list[list] = [[] for _ in range(nq)]
    fulls: list = [None] * nq
    members: list[list] = [[] for _ in range(nq)]
    for off, n, start, table in spans:
        if n < 1:
            continue
        for t in range(off // Q_TILE, (off + n - 1) // Q_TILE + 1):
            members[t].append((off, n, start, table))
    bs = int(block_size)
    for t in range(nq):
        for off, n, start, table in members[t]:
            tab = np.asarray(table, dtype=np.int64)
            r0, r1 = max(off, t * Q_TILE), min(off + n, (t + 1) * Q_TILE) - 1
            p_lo, p_hi = start + r0 - off, start + r1 - off
            seen = tab[:p_hi // bs + 1] if causal else tab
            lists[t].append(seen // group)
            if full and len(members[t]) == 1:
                inside = tab[:(p_lo + 1) // bs] // group       # blocks wholly at or before p_lo
                u, c = np.unique(inside, return_counts=True)
                fulls[t] = u[c == group]
    uniq, fuq = [], []
    for t in range(nq):
        u = np.unique(np.concatenate(lists[t])) if lists[t] else np.zeros(0, dtype=np.int64)
        f = fulls[t] if fulls[t] is not None else np.zeros(0, dtype=np.int64)
        uniq.append(np.setdiff1d(u, f, assume_unique=True))
        fuq.append(f)
    return ChunkTiles(*_pack_lists(uniq), *_pack_lists(fuq))


def _pack_lists(lists):
    """``(num [nQ], idx [nQ, W])`` int32 of per-tile lists; padding repeats the first entry."""
    import numpy as np

    W = max(1, max(len(u) for u in lists))
    idx = np.zeros((len(lists), W), dtype=np.int32)
    num = np.zeros(len(lists), dtype=np.int32)
    for t, u in enumerate(lists):
        num[t] = len(u)
        idx[t, :len(u)] = u
        if len(u):
            idx[t, len(u):] = u[0]
    return num, idx
