"""Decode-only iterations from CUDA graphs, one per batch-size bucket.

A decode-only iteration (every member one token, every member sampling) of ``B`` members runs
as bucket ``b`` = the smallest of 1, 2, 4, 8, ... (up to ``max_num_seqs``, which is always the
last bucket) that is ``>= B``: rows ``B..b-1`` repeat row 0 (same token, position, slot and
table, so their cache writes are identical to row 0's and their outputs are ignored).

Static buffers (device, ``int64``, one packed tensor so an iteration's inputs are one
host-to-device copy from a pinned buffer)::

    tok[b]     input id (``-(r+1)``: row r of the previous launch's samples)
    pos[b]     position (context - 1)        slot[b]  cache slot of the new token
    nblk[b]    blocks of the context         mid[b]   member id (row index; pads: 0)
    tables[b, W]  block tables, padding columns = ``num_blocks``

``W`` (blocks) bounds the context a graph serves; a longer one or more members than the last
bucket run eagerly; an iteration with prefill tokens is :mod:`.mixed`'s (same ``W``). The graph's body (:meth:`PagedLlama._decode_static`)
embeds, runs the layers with the paged split-KV decode kernels (:mod:`tracestory.models.decode_attn`;
or FlexAttention's decoding kernel, ``TRACESTORY_DECODE_ATTN=0``) over the paged cache and writes
the greedy ids into the model's sampled buffer. Capture: two warm-up runs per bucket (the
first compiles the attention for that shape; the time is reported), then
``torch.cuda.graph``. The pinned input buffers rotate (4), each reused only after the copy
out of it finished (an event).

``use_graphs=False`` (``--enforce-eager``) keeps the buckets and static buffers and runs the
same body without a graph (also on the CPU, where the body runs eager FlexAttention: the
bucket padding and static buffers are tested there).
"""

from __future__ import annotations

import time

from ..capture.region import timed

RING = 4


def decode_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


def bucket_for(n: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding ``n`` rows (None when ``n`` exceeds the largest)."""
    for b in buckets:
        if b >= n:
            return b
    return None


def pad_rows(values: list, bucket: int) -> list:
    """``values`` padded to ``bucket`` entries by repeating the first one."""
    if not values or len(values) > bucket:
        raise ValueError(f"expected 1..{bucket} rows, found {len(values)}")
    return list(values) + [values[0]] * (bucket - len(values))


class DecodeGraphs:
    """The static buffers, per-bucket block masks and graphs of a :class:`~.model.PagedLlama`."""

    def __init__(self, model, buckets: list[int], width: int, *, use_graphs: bool = True):
        import numpy as np
        import torch

        self.model, self.buckets, self.width, self.use_graphs = model, list(buckets), int(width), use_graphs
        self.torch, self.np = torch, np
        B, W = self.buckets[-1], self.width
        self.bmax = B
        self._n = 5 * B + B * W
        dev = model.device
        self.dev = torch.zeros(self._n, dtype=torch.long, device=dev)
        self.on_cuda = bool(getattr(model, "on_cuda", False))
        if use_graphs and not self.on_cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        self.ring = [(torch.zeros(self._n, dtype=torch.long, pin_memory=self.on_cuda),
                      torch.cuda.Event() if self.on_cuda else None) for _ in range(RING)]
        self._next = 0
        v = self.dev
        self.tok, self.pos, self.slot, self.nblk, self.mid = (v[i * B:(i + 1) * B] for i in range(5))
        self.tables = v[5 * B:].view(B, W)
        self.tables32 = torch.zeros(B, W, dtype=torch.int32, device=dev)
        self.nblk32 = torch.zeros(B, dtype=torch.int32, device=dev)
        self.graphs: dict[int, object] = {}
        self.masks: dict[int, object] = {}

    def fits(self, members) -> bool:
        """A decode-only iteration within the buckets and the table width."""
        if not members or len(members) > self.bmax:
            return False
        W = self.width
        return all(m.tokens == 1 and m.samples and len(m.block_table) <= W for m in members)

    def build(self, say) -> tuple[float, float]:
        """Warm up (compile) and capture every bucket; returns (compile seconds, capture seconds)."""
        torch, model = self.torch, self.model
        fa = model._flex
        slots = model.k_cache[0].shape[0]
        for b in self.buckets:
            self.masks[b] = fa.decode_block_mask(self.tables32[:b], self.nblk32[:b], slots)
        # a harmless input: every row reads block 0, position 0, writes slot 0
        self.dev.zero_()
        self.nblk.fill_(1)
        compile_s = capture_s = 0.0
        if not self.on_cuda:
            return compile_s, capture_s
        stream = torch.cuda.Stream(model.device)
        stream.wait_stream(torch.cuda.current_stream(model.device))
        for b in self.buckets:
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                for _ in range(2):
                    model._decode_static(b, self)
            torch.cuda.synchronize(model.device)
            dt = time.perf_counter() - t0
            compile_s += dt
            if not self.use_graphs:
                say(f"decode bucket {b}: flex decoding compiled in {dt:.1f} s")
                continue
            t0 = time.perf_counter()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                model._decode_static(b, self)
            torch.cuda.synchronize(model.device)
            self.graphs[b] = g
            capture_s += time.perf_counter() - t0
            say(f"decode bucket {b}: compiled in {dt:.1f} s, graph captured in {time.perf_counter() - t0:.2f} s")
        torch.cuda.current_stream(model.device).wait_stream(stream)
        return compile_s, capture_s

    def pack(self, members, ids, host) -> int:
        """Fill the pinned buffer ``host`` for ``members`` (with input ``ids``); returns the bucket."""
        np, B, W, bs = self.np, self.bmax, self.width, self.model.block_size
        n = len(members)
        b = bucket_for(n, self.buckets)
        a = host.numpy()
        ctx = np.fromiter((m.start + 1 for m in members), dtype=np.int64, count=n)
        tok = np.asarray(ids, dtype=np.int64)
        first_block = np.fromiter((m.block_table[m.start // bs] for m in members), dtype=np.int64, count=n)
        pos = ctx - 1
        rows = np.arange(b)
        src = np.where(rows < n, rows, 0)          # padding rows repeat row 0
        a[0:b] = tok[src]
        a[B:B + b] = pos[src]
        a[2 * B:2 * B + b] = (first_block * bs + pos % bs)[src]
        a[3 * B:3 * B + b] = (-(-ctx // bs))[src]
        a[4 * B:4 * B + b] = np.where(rows < n, rows, 0)
        tab = a[5 * B:].reshape(B, W)
        tab[:b] = self.model.num_blocks
        for i, m in enumerate(members):
            tab[i, :len(m.block_table)] = m.block_table
        if b > n:
            tab[n:b] = tab[0]
        return b

    def run(self, members, ids) -> None:
        """Copy the inputs (one copy) and replay the bucket's graph (or run its body)."""
        host, ev = self.ring[self._next]
        self._next = (self._next + 1) % RING
        if ev is not None:
            with timed("input_wait_ns"):      # the event log's line (serve.engine)
                ev.synchronize()              # the copy that last read this pinned buffer is done
        b = self.pack(members, ids, host)
        self.dev.copy_(host, non_blocking=self.on_cuda)
        if ev is not None:
            ev.record()
        if self.use_graphs:
            with timed("replay_ns"):
                self.graphs[b].replay()
        else:
            self.model._decode_static(b, self)
