"""The chunk (prefill) attention kernel alone, against a flash kernel at the same FLOPs (one GPU).

The server's chunk call (:class:`tracestory.serve.paged_attention.FlexPagedAttention`, compiled
FlexAttention over the paged cache, llama-3-8b heads: 32 query heads, 8 KV heads, d = 128, bf16,
16-token blocks in 64-key tiles) at ``S`` = 2,048 query rows, for three layouts of the rows
(``--layouts``): one 2,048-token prompt, two of 1,024, four of 512 (each from position 0, its
blocks consecutive in the cache, as a fresh cache hands them out), in tile-list variants:

* ``whole``: each query tile lists its members' whole tables, the mask on every tile (before);
* ``causal``: only the tiles up to the members' last position in the query tile;
* ``causal+full``: that, and tiles wholly in a one-member query tile's causal past "full"
  (``mask_mod`` skipped: :func:`~tracestory.serve.paged_attention.chunk_tiles`, the server's);

and kernel options (``BLOCK_M``/``BLOCK_N``/``num_warps``/``num_stages``: the first is what the
server ran before call 6, the third what it runs since, chosen from this script's numbers).
The roof: ``F.scaled_dot_product_attention`` causal on the same prompts as contiguous
``[n, 32, L, 128]`` tensors (K/V repeated to 32 heads), flash and cuDNN backends. FLOPs are the
causal ones: ``4 d H sum_rows (pos + 1)``. Each time: median of 20 calls (CUDA events, after 3
warm-ups). Every variant's output is checked against the SDPA result on the real rows.

Usage: python benchmarks/gpu/chunk_attn.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from roofs import cuda_times   # this folder: run as python3 benchmarks/gpu/chunk_attn.py
from tracestory.serve.paged_attention import FlexPagedAttention, cache_blocks, chunk_tiles

H, KH, D, BS, NB, S = 32, 8, 128, 16, 16384, 2048
OPTIONS = [
    {"BLOCK_M": 64, "BLOCK_N": 64},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
]


def _time(fn) -> float:
    return cuda_times(fn, warm=3)[1]   # the median


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--layouts", default="1x2048,2x1024,4x512")
    args = ap.parse_args()
    torch.manual_seed(0)
    fa = FlexPagedAttention(num_blocks=NB, block_size=BS, max_rows=S, device="cuda", compiled=True)
    slots = cache_blocks(NB, BS, True) * BS
    kc = torch.randn(slots, KH, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(slots, KH, D, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(H, S, D, device="cuda", dtype=torch.bfloat16)
    rows = []
    for layout in args.layouts.split(","):
        n, L = (int(v) for v in layout.split("x"))
        nblk = L // BS
        tables = [list(range(64 + i * nblk, 64 + (i + 1) * nblk)) for i in range(n)]   # consecutive, group-aligned
        spans = [(i * L, L, 0, t) for i, t in enumerate(tables)]
        flops = 4 * D * H * n * L * (L + 1) / 2
        # the mask state, as the server sets it
        tab = torch.tensor(tables, device="cuda")
        fa.set_blocks(tab, torch.arange(n, device="cuda"))
        fa.row_owner[:S] = torch.arange(n, device="cuda", dtype=torch.int32).repeat_interleave(L)
        fa.row_pos[:S] = torch.arange(L, device="cuda", dtype=torch.int32).repeat(n)
        # the roof and the reference: SDPA on contiguous prompts
        qs = q.view(H, n, L, D).transpose(0, 1).contiguous()                        # [n, H, L, D]
        flat = torch.tensor([s for t in tables for b in t for s in range(b * BS, (b + 1) * BS)], device="cuda")
        ks = kc[flat].view(n, L, KH, D).transpose(1, 2).repeat_interleave(H // KH, dim=1).contiguous()
        vs = vc[flat].view(n, L, KH, D).transpose(1, 2).repeat_interleave(H // KH, dim=1).contiguous()
        ref = None
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
                    t = _time(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True))
                ref = o if ref is None else ref
                rows.append({"layout": layout, "variant": name, "ms": t * 1e3, "tflops": flops / t / 1e12})
            except RuntimeError as e:
                rows.append({"layout": layout, "variant": name, "error": " ".join(str(e).split())[:160]})
            print(json.dumps(rows[-1]), flush=True)
        ref_rows = ref.transpose(0, 1).reshape(H, S, D)                              # [H, S, D] like q
        for variant, kw in (("whole", dict(causal=False, full=False)), ("causal", dict(causal=True, full=False)),
                            ("causal+full", dict(causal=True, full=True))):
            ct = chunk_tiles(spans, BS, S, fa.group, **kw)
            pad = fa.chunk_width
            kvi = torch.tensor(ct.kv_idx, device="cuda")
            kvi = torch.cat((kvi, kvi[:, :1].expand(-1, pad - kvi.shape[1])), 1).contiguous()
            fki = torch.tensor(ct.full_idx, device="cuda")
            fki = torch.cat((fki, fki[:, :1].expand(-1, pad - fki.shape[1])), 1).contiguous()
            full = variant == "causal+full"
            mask = fa.chunk_block_mask(torch.tensor(ct.kv_num, device="cuda"), kvi, S, slots,
                                       torch.tensor(ct.full_num, device="cuda") if full else None,
                                       fki if full else None)
            for opts in OPTIONS if variant == "causal+full" else OPTIONS[:1]:
                fa._chunk_options = dict(opts)
                try:
                    o = fa.chunk(q, kc, vc, mask, S)                                 # [S, H*D]
                    err = (o.view(S, H, D).transpose(0, 1).float() - ref_rows.float()).abs().max().item()
                    t = _time(lambda: fa.chunk(q, kc, vc, mask, S))
                    row = {"layout": layout, "variant": variant, "options": opts, "ms": t * 1e3,
                           "tflops": flops / t / 1e12, "max_abs_err_vs_sdpa": err,
                           "masked_tiles": int(ct.kv_num.sum()), "full_tiles": int(ct.full_num.sum()) if full else 0}
                except Exception as e:  # noqa: BLE001 -- a kernel option the compiler refuses: say so, go on
                    row = {"layout": layout, "variant": variant, "options": opts,
                           "error": " ".join(str(e).split())[:200]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
