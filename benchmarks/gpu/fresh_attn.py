"""Fresh-prompt chunk attention: the flash variable-length call against cuDNN's variable-length
call, FlexAttention with a document mask, the paged FlexAttention chunk kernel and SDPA on
contiguous prompts (one GPU).

For each layout (chunk members' lengths in a bucket of ``R`` rows; the rest padding) the cache
holds each prompt's K/V in consecutive 16-token blocks, as a fresh cache hands them out, and:

* ``flex``: the server's chunk kernel (:class:`tracestory.serve.paged_attention.FlexPagedAttention`,
  causal + full tile lists, the server's kernel options) over the paged cache, ``R`` rows;
* ``fresh``: :func:`tracestory.serve.fresh_attention.attend` (K/V gathered at the rows' slots,
  one ``_flash_attention_forward`` over ``cu``), eager and replayed from a CUDA graph captured
  on another layout of the same bucket (so the replay reads this layout's ``cu`` and slots from
  the static buffers);
* ``fresh_flash`` / ``fresh_cudnn``: the same gather, then the kernel named (:func:`flash_call`,
  the call ``fresh`` makes; :func:`cudnn_call`: cuDNN's ragged SDPA, ``aten._cudnn_attention_forward``
  with ``cum_seq_q = cum_seq_k = cu``, grouped-query heads as they are), eager and (``_graph``)
  replayed from a CUDA graph captured on another layout of the bucket, as ``fresh`` is;
  ``first_ms``: the first eager call of a variant in a new bucket (cuDNN builds its plan there,
  FlexAttention compiles);
* ``flex_doc``: compiled FlexAttention on the gathered, contiguous K/V (``enable_gqa``) with a
  causal document mask whose block lists are built from ``cu`` by tensor ops (no host sync), so the
  ``_graph`` variant captures the mask build and the kernel together;
* ``njt_cudnn`` (``_mha``: K/V repeated to 32 heads first): SDPA on nested jagged tensors with the
  cuDNN backend, the members only (eager; its error if refused);
* ``sdpa_cudnn`` / ``sdpa_flash``: SDPA causal on the members as contiguous ``[n, 32, L, 128]``
  tensors (equal lengths only; K/V repeated to 32 heads), the roof of chunk_attn.py.

Checked: every variant against :func:`~tracestory.serve.fresh_attention.reference` in float32 on
the real rows (``max_abs_err``). FLOPs: causal, ``4 d H sum (pos+1)``. Times: median of 20 (CUDA
events, 3 warm-ups). ``--skip`` leaves variants out (e.g. ``flex`` to save its compile time).

Usage: python benchmarks/gpu/fresh_attn.py [--json OUT] [--skip flex,...]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from roofs import cuda_times   # this folder: run as python3 benchmarks/gpu/fresh_attn.py
from tracestory.serve import fresh_attention as fresh
from tracestory.serve.paged_attention import FlexPagedAttention, cache_blocks, chunk_tiles

H, KH, D, BS, NB, M = 32, 8, 128, 16, 16384, 32
LAYOUTS = [((2048,), 2048), ((1024, 1024), 2048), ((512,) * 4, 2048), ((700, 900), 2048),
           ((300, 200, 250), 1024), ((128,) * 16, 2048), ((512,), 512)]


def _time(fn) -> float:
    return cuda_times(fn, warm=3)[1]


def setup(lengths, R, fa, kc):
    """Slots [R] (padding rows: the scratch slot), spans for the tile lists, cu (device)."""
    spans, slots, b0, off = [], [], 64, 0
    for n in lengths:
        nblk = -(-n // BS)
        table = list(range(b0, b0 + nblk))
        b0 += -(-nblk // 4) * 4 + 4                        # group-aligned, a gap between prompts
        spans.append((off, n, 0, table))
        slots += [table[p // BS] * BS + p % BS for p in range(n)]
        off += n
    scratch = (kc.shape[0] // BS - 1) * BS
    slots += [scratch] * (R - off)
    cu = torch.tensor(fresh.offsets(lengths, R, M + 1), device="cuda")
    return spans, torch.tensor(slots, device="cuda"), cu


def graph_of(fn, static, before_capture=None):
    """A CUDA graph of ``fn(*static)`` (two warm-ups on a side stream first) and its output;
    ``before_capture(stream)``: called with the capture stream before the capture starts."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(*static)
    torch.cuda.current_stream().wait_stream(s)
    g, cap = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    if before_capture is not None:
        before_capture(cap)
    with torch.cuda.graph(g, stream=cap):
        out = fn(*static)
    return g, out


def flash_call(q, k, v, cu, R):
    """FlashAttention-2's variable-length forward (fresh_attention.attend's call): [R, H, D] rows."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, R, R, 0.0, True, False)[0]


def cudnn_call(q, k, v, cu, R):
    """cuDNN's ragged SDPA over the same arguments (no log-sum-exp)."""
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, R, R, False, 0.0, True, False)[0]


def gathered(kernel):
    """``attend`` with the K/V gather and the given kernel (fresh_attention's two), -> [R, H*D]."""
    def run(q, kc, vc, slots, cu, R):
        k, v = kc[slots], vc[slots]
        return kernel(q.transpose(0, 1).contiguous(), k, v, cu, R).reshape(R, H * D)
    return run


# FlexAttention with a causal document mask over contiguous K/V (module docstring: flex_doc)
FB = 128                                   # flex's block (rows and keys)
SEQ = None                                 # [2048] int32: each row's sequence, read by the mask


def doc_causal(b, h, q, kv):
    return (SEQ[q] == SEQ[kv]) & (kv <= q)


def doc_mask(cu, R):
    """BlockMask of causal sequences ``cu`` over ``R`` rows from tensor ops alone: a key block is
    listed for a query block when their sequence ranges overlap and it is not later; full when
    both blocks lie inside one sequence and the key block is earlier."""
    from torch.nn.attention.flex_attention import BlockMask

    idx = torch.arange(R, device="cuda", dtype=torch.int32)
    seq = torch.searchsorted(cu, idx, right=True).to(torch.int32)
    SEQ[:R].copy_(seq)
    nb = R // FB
    first, last = seq.view(nb, FB)[:, 0], seq.view(nb, FB)[:, -1]
    qi = torch.arange(nb, device="cuda")[:, None]
    ki = torch.arange(nb, device="cuda")[None, :]
    listed = (ki <= qi) & (first[None, :] <= last[:, None]) & (last[None, :] >= first[:, None])
    one = first == last
    full = (ki < qi) & one[:, None] & one[None, :] & (first[:, None] == first[None, :])
    part = listed & ~full

    def lists(m):
        return (m.sum(-1).to(torch.int32)[None, None],
                torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None, None])

    kn, ki_ = lists(part)
    fn, fi = lists(full)
    return BlockMask.from_kv_blocks(kn, ki_, fn, fi, BLOCK_SIZE=FB, mask_mod=doc_causal)


_flex_doc_compiled = None


def flex_doc(q, kc, vc, slots, cu, R):
    global _flex_doc_compiled
    if _flex_doc_compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex_doc_compiled = torch.compile(flex_attention, dynamic=False)
    k = kc[slots].transpose(0, 1).contiguous()[None]          # [1, KH, R, D]
    v = vc[slots].transpose(0, 1).contiguous()[None]
    o = _flex_doc_compiled(q[None], k, v, block_mask=doc_mask(cu, R), enable_gqa=True)   # [1, H, R, D]
    return o[0].transpose(0, 1).reshape(R, H * D)


def njt_cudnn(q, kc, vc, slots, cu, lengths, gqa=True):
    """SDPA on nested jagged tensors (cuDNN backend) over the members only -> [tc, H*D]; ``gqa``
    False: K/V repeated to the query heads first."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tc = sum(lengths)
    off = torch.tensor([0, *np.cumsum(lengths)], device="cuda", dtype=torch.int64)
    qt = q.transpose(0, 1)[:tc].contiguous()
    k, v = kc[slots[:tc]], vc[slots[:tc]]
    if not gqa:
        k, v = k.repeat_interleave(H // KH, 1), v.repeat_interleave(H // KH, 1)

    def nj(x):
        return torch.nested.nested_tensor_from_jagged(x, off, max_seqlen=max(lengths)).transpose(1, 2)

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(nj(qt), nj(k), nj(v), is_causal=True, enable_gqa=gqa)
    return o.transpose(1, 2).values().reshape(tc, H * D)


def main() -> None:
    global SEQ
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--skip", default="", help="comma-separated variants to leave out: fresh, cudnn, flash, "
                    "flex_doc, njt, flex, sdpa")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda}), flush=True)
    try:
        print(torch.ops.aten._cudnn_attention_forward.default._schema, flush=True)
    except Exception as e:  # noqa: BLE001 -- say it and go on
        print("no _cudnn_attention_forward:", e, flush=True)
    fa = None if "flex" in skip else FlexPagedAttention(num_blocks=NB, block_size=BS, max_rows=2048,
                                                         device="cuda", compiled=True)
    nslots = cache_blocks(NB, BS, True) * BS
    kc = torch.randn(nslots, KH, D, generator=gen).to("cuda", torch.bfloat16)
    vc = torch.randn(nslots, KH, D, generator=gen).to("cuda", torch.bfloat16)
    SEQ = torch.zeros(2048, device="cuda", dtype=torch.int32)
    rows, graphs, seen, no_graph = [], {}, set(), set()
    variants = [("fresh_cudnn", gathered(cudnn_call)), ("fresh_flash", gathered(flash_call)),
                ("fresh", fresh.attend), ("flex_doc", flex_doc)]
    variants = [(n, f) for n, f in variants
                if n not in skip and n.removeprefix("fresh_") not in skip]
    for lengths, R in LAYOUTS:
        name = "+".join(map(str, lengths)) + f" in {R}"
        tc = sum(lengths)
        flops = 4 * D * H * sum(n * (n + 1) / 2 for n in lengths)
        q = torch.randn(H, R, D, generator=gen).to("cuda", torch.bfloat16)   # CPU RNG: a failed capture breaks CUDA's
        spans, slots, cu = setup(lengths, R, fa, kc)
        ref = fresh.reference(q.transpose(0, 1).float(), kc[slots].float(), vc[slots].float(), cu)  # [R, H, D]
        ref = ref.reshape(R, H * D)[:tc]

        def err(o):
            return (o[:tc].float() - ref).abs().max().item()

        def row(variant, t, e=None, **kw):
            r = {"layout": name, "variant": variant, "ms": round(t * 1e3, 4), "tflops": round(flops / t / 1e12, 1),
                 **({"max_abs_err": e} if e is not None else {}), **kw}
            rows.append(r)
            print(json.dumps(r), flush=True)

        def failed(variant, e):
            rows.append({"layout": name, "variant": variant, "error": " ".join(str(e).split())[:300]})
            print(json.dumps(rows[-1]), flush=True)

        for vname, fn in variants:
            try:
                extra = {}
                if (vname, R) not in seen:                  # first call of this bucket: plan build / compile
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn(q, kc, vc, slots, cu, R)
                    torch.cuda.synchronize()
                    extra["first_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
                    seen.add((vname, R))
                o = fn(q, kc, vc, slots, cu, R)
                row(vname, _time(lambda fn=fn: fn(q, kc, vc, slots, cu, R)), err(o), **extra)
            except Exception as e:  # noqa: BLE001 -- report and go on
                failed(vname, e)
                continue
            # the same from a CUDA graph of this bucket, captured on another layout, fed this one
            if vname in no_graph:
                continue
            try:
                if (vname, R) not in graphs:
                    static = (torch.zeros(H, R, D, device="cuda", dtype=torch.bfloat16), kc, vc,
                              torch.full((R,), (kc.shape[0] // BS - 1) * BS, device="cuda", dtype=torch.long),
                              torch.tensor(fresh.offsets([R], R, M + 1), device="cuda"), R)
                    graphs[vname, R] = (*graph_of(fn, static), static)
                g, so, static = graphs[vname, R]
                static[0].copy_(q)
                static[3].copy_(slots)
                static[4].copy_(cu)
                g.replay()
                row(vname + "_graph", _time(g.replay), err(so))
            except Exception as e:  # noqa: BLE001 -- report and go on (no second capture of it)
                failed(vname + "_graph", e)
                no_graph.add(vname)
        if "flex_doc" not in skip:                           # its mask build alone (once per iteration)
            try:
                row("flex_doc_mask", _time(lambda: doc_mask(cu, R)))
            except Exception as e:  # noqa: BLE001 -- report and go on
                failed("flex_doc_mask", e)
        for gqa in ([] if "njt" in skip else [True, False]):
            vname = "njt_cudnn" + ("" if gqa else "_mha")
            try:
                o = njt_cudnn(q, kc, vc, slots, cu, lengths, gqa)
                row(vname, _time(lambda gqa=gqa: njt_cudnn(q, kc, vc, slots, cu, lengths, gqa)), err(o))
            except Exception as e:  # noqa: BLE001 -- report and go on
                failed(vname, e)
        # flex chunk kernel, as the server runs it
        if fa is not None:
            fa.set_blocks(torch.tensor([t + [NB] * (128 - len(t)) for *_, t in spans], device="cuda"),
                          torch.arange(len(spans), device="cuda"))
            own = np.full(R, -2, dtype=np.int32)
            pos = np.zeros(R, dtype=np.int32)
            for i, (off, n, _s, _t) in enumerate(spans):
                own[off:off + n] = i
                pos[off:off + n] = np.arange(n)
            fa.row_owner[:R] = torch.tensor(own, device="cuda")
            fa.row_pos[:R] = torch.tensor(pos, device="cuda")
            ct = chunk_tiles(spans, BS, R, fa.group)
            pad = fa.chunk_width
            kvi = torch.tensor(ct.kv_idx, device="cuda")
            kvi = torch.cat((kvi, kvi[:, :1].expand(-1, pad - kvi.shape[1])), 1).contiguous()
            fki = torch.tensor(ct.full_idx, device="cuda")
            fki = torch.cat((fki, fki[:, :1].expand(-1, pad - fki.shape[1])), 1).contiguous()
            mask = fa.chunk_block_mask(torch.tensor(ct.kv_num, device="cuda"), kvi, R, nslots,
                                       torch.tensor(ct.full_num, device="cuda"), fki)
            try:
                o = fa.chunk(q, kc, vc, mask, R)
                row("flex", _time(lambda: fa.chunk(q, kc, vc, mask, R)), err(o))
            except Exception as e:  # noqa: BLE001 -- report and go on
                failed("flex", e)
        # SDPA on contiguous equal-length members (the roof)
        if len(set(lengths)) == 1 and "sdpa" not in skip:
            n, L = len(lengths), lengths[0]
            qs = q[:, :tc].reshape(H, n, L, D).transpose(0, 1).contiguous()
            ks = kc[slots[:tc]].view(n, L, KH, D).transpose(1, 2).repeat_interleave(H // KH, 1).contiguous()
            vs = vc[slots[:tc]].view(n, L, KH, D).transpose(1, 2).repeat_interleave(H // KH, 1).contiguous()
            from torch.nn.attention import SDPBackend, sdpa_kernel

            for vname, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel(be):
                        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
                        t = _time(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True))
                    row(vname, t, err(o.transpose(1, 2).reshape(tc, H * D)))
                except RuntimeError as e:
                    failed(vname, e)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
