"""Fresh-prompt chunk attention: the flash variable-length call against the paged FlexAttention
chunk kernel and SDPA on contiguous prompts (one GPU).

For each layout (chunk members' lengths in a bucket of ``R`` rows; the rest padding) the cache
holds each prompt's K/V in consecutive 16-token blocks, as a fresh cache hands them out, and:

* ``flex``: the server's chunk kernel (:class:`tracestory.serve.paged_attention.FlexPagedAttention`,
  causal + full tile lists, the server's kernel options) over the paged cache, ``R`` rows;
* ``fresh``: :func:`tracestory.serve.fresh_attention.attend` (K/V gathered at the rows' slots,
  one ``_flash_attention_forward`` over ``cu``), eager and replayed from a CUDA graph captured
  on another layout of the same bucket (so the replay reads this layout's ``cu`` and slots from
  the static buffers);
* ``sdpa_cudnn`` / ``sdpa_flash``: SDPA causal on the members as contiguous ``[n, 32, L, 128]``
  tensors (equal lengths only; K/V repeated to 32 heads), the roof of chunk_attn.py.

Checked: ``fresh`` (eager and graph) against :func:`~tracestory.serve.fresh_attention.reference`
in float32 on the real rows, and ``flex`` against the same. FLOPs: causal, ``4 d H sum (pos+1)``.
Times: median of 20 (CUDA events, 3 warm-ups).

Usage: python benchmarks/gpu/fresh_attn.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    fa = FlexPagedAttention(num_blocks=NB, block_size=BS, max_rows=2048, device="cuda", compiled=True)
    nslots = cache_blocks(NB, BS, True) * BS
    kc = torch.randn(nslots, KH, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(nslots, KH, D, device="cuda", dtype=torch.bfloat16)
    rows, graphs = [], {}
    for lengths, R in LAYOUTS:
        name = "+".join(map(str, lengths)) + f" in {R}"
        tc = sum(lengths)
        flops = 4 * D * H * sum(n * (n + 1) / 2 for n in lengths)
        q = torch.randn(H, R, D, device="cuda", dtype=torch.bfloat16)
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

        # fresh, eager
        o = fresh.attend(q, kc, vc, slots, cu, R)
        row("fresh", _time(lambda: fresh.attend(q, kc, vc, slots, cu, R)), err(o))
        # fresh from a CUDA graph of this bucket, captured on static buffers, then fed this layout
        if R not in graphs:
            sq = torch.zeros(H, R, D, device="cuda", dtype=torch.bfloat16)
            ss = torch.full((R,), (kc.shape[0] // BS - 1) * BS, device="cuda", dtype=torch.long)
            sc = torch.tensor(fresh.offsets([R], R, M + 1), device="cuda")
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fresh.attend(sq, kc, vc, ss, sc, R)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                so = fresh.attend(sq, kc, vc, ss, sc, R)
            graphs[R] = (g, sq, ss, sc, so)
        g, sq, ss, sc, so = graphs[R]
        sq.copy_(q)
        ss.copy_(slots)
        sc.copy_(cu)
        g.replay()
        row("fresh_graph", _time(g.replay), err(so))
        # flex chunk kernel, as the server runs it
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
            rows.append({"layout": name, "variant": "flex", "error": " ".join(str(e).split())[:200]})
            print(json.dumps(rows[-1]), flush=True)
        # SDPA on contiguous equal-length members (the roof)
        if len(set(lengths)) == 1:
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
                    rows.append({"layout": name, "variant": vname, "error": " ".join(str(e).split())[:160]})
                    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
