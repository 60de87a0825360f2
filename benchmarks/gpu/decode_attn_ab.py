"""The paged split-KV decode kernels against FlexAttention's decoding kernel (one GPU).

Parts (``--parts``, default both):

* ``kernel``: the attention of one layer alone, llama-3-8b shape at TP=1 (32 query heads, 8 KV
  heads, head dim 128, bf16, 16-token blocks, tables 512 blocks wide as in the server's decode
  graphs), per batch and context: :func:`tracestory.models.decode_attn_triton.decode` (fused, with
  the second combine kernel, fused writing Wo's FP8 input, at the default split count; fixed split
  counts with ``--splits``) and :meth:`tracestory.serve.paged_attention.FlexPagedAttention.decode`
  (compiled, its block mask as the decode graphs build it). Each time is one call inside a CUDA
  graph of 32 calls, each over its own layer's cache (so K/V come from HBM, not L2), median of 5
  replays; also the largest difference between the two outputs. ``+quantiser``: followed by the
  FP8 row-wise quantiser kernel (what the step runs before Wo).
* ``step``: 32-layer llama-3-8b :class:`~tracestory.serve.model.PagedLlama` with the same
  weights (bf16, FP8 row-wise projections, the fused glue, the small-M GEMM tuned once for the
  first model and reused), prepared like the server, one per ``--variants`` entry:
  ``TRACESTORY_DECODE_ATTN=0`` (``flex``), on (``triton``, two kernels), on with
  ``TRACESTORY_DECODE_ATTN_FUSED=1`` (``triton_fused``), and with ``TRACESTORY_DECODE_ATTN_QUANT=1``
  too (``triton_fused_quant``); each model holds about 18 GB at the default contexts, so at most
  three fit an H100 next to each other; their decode steps alternate at each (context, batch),
  each step synchronised; per variant the median of ``Launch.gpu_ns`` (device time of the
  step) and of the wall time (as benchmarks/gpu/pdl_ab.py does).

Usage: python benchmarks/gpu/decode_attn_ab.py [--parts kernel,step] [--batches 1,4,16] [--contexts 600,4000]
[--steps 120] [--variants flex,triton,triton_fused_quant]
[--splits 4,8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from ab_steps import alternate  # this folder: run as python3 benchmarks/gpu/decode_attn_ab.py
from roofs import captured_graph, cuda_times

H, KH, HD, BS, WIDTH = 32, 8, 128, 16, 8192 // 16


def kernel_part(batches, contexts, layers=32, fixed_splits=()) -> list[dict]:
    """Per batch one set of caches (for the longest context) and one compiled FlexAttention;
    per context new tables and positions (same shapes: nothing compiles again)."""
    from tracestory.serve.paged_attention import FlexPagedAttention, cache_blocks

    rows = []
    for B in batches:
        nb = B * -(-max(contexts) // BS) + 8
        slots = cache_blocks(nb, BS, True) * BS
        kcs = [torch.randn(slots, KH, HD, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        vcs = [torch.randn(slots, KH, HD, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        fa = FlexPagedAttention(num_blocks=nb, block_size=BS, max_rows=max(B, 16), device="cuda", compiled=True)
        q = torch.randn(B, H, HD, device="cuda", dtype=torch.bfloat16).transpose(0, 1)   # rope_qkv's layout
        for ctx in contexts:
            rows += _kernel_case(fa, q, kcs, vcs, ctx, layers, fixed_splits)
        del kcs, vcs, fa
        torch.cuda.empty_cache()
    return rows


def _kernel_case(fa, q, kcs, vcs, ctx: int, layers: int, fixed_splits) -> list[dict]:
    from tracestory.models import decode_attn_triton as dat

    B = q.shape[1]
    nb, slots = fa.num_blocks, kcs[0].shape[0]
    nblk = -(-ctx // BS)
    tables = torch.full((B, WIDTH), nb, dtype=torch.int64, device="cuda")
    tables[:, :nblk] = torch.arange(B * nblk, device="cuda").view(B, nblk)
    pos = torch.full((B,), ctx - 1, dtype=torch.int64, device="cuda")
    mids = torch.arange(B, device="cuda")
    fa.set_blocks(tables, mids)
    fa.dec_owner[:B] = mids.to(torch.int32)
    fa.dec_pos[:B] = pos.to(torch.int32)
    nblk32 = torch.full((B,), nblk, dtype=torch.int32, device="cuda")
    mask = fa.decode_block_mask(tables.to(torch.int32), nblk32, slots)
    t0 = time.perf_counter()
    ref = fa.decode(q, kcs[0], vcs[0], mask)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    default = dat.splits_for(q, kcs[0], tables, BS)
    from tracestory.models.quant_triton import quantize_per_row

    variants = [("flex", lambda li: fa.decode(q, kcs[li], vcs[li], mask)),
                ("flex+quantiser", lambda li: quantize_per_row(fa.decode(q, kcs[li], vcs[li], mask))),
                (f"triton_2kernels_s{default}", lambda li: dat.decode(q, kcs[li], vcs[li], tables, pos, BS,
                                                                      fused=False)),
                (f"triton_fused_s{default}", lambda li: dat.decode(q, kcs[li], vcs[li], tables, pos, BS,
                                                                   fused=True)),
                (f"triton_fused_s{default}+quantiser",
                 lambda li: quantize_per_row(dat.decode(q, kcs[li], vcs[li], tables, pos, BS, fused=True))),
                (f"triton_fused_quant_s{default}", lambda li: dat.decode(q, kcs[li], vcs[li], tables, pos, BS,
                                                                         fused=True, quant=True))]
    for s in fixed_splits:
        if s != default:
            variants.append((f"triton_fused_s{s}",
                             lambda li, s=s: dat.decode(q, kcs[li], vcs[li], tables, pos, BS, splits=s,
                                                        fused=True)))
    rows = []
    for name, fn in variants:
        out = fn(0)
        diff = (out.float() - ref.float()).abs().max().item() if not isinstance(out, tuple) else None
        g = captured_graph([lambda li=li, fn=fn: fn(li) for li in range(layers)], layers, warm=layers)
        t = cuda_times(g.replay, reps=5, warm=1)[1] / layers
        row = {"part": "kernel", "context": ctx, "batch": B, "variant": name, "us_per_layer": round(t * 1e6, 2),
               "max_abs_diff_vs_flex": None if diff is None else round(diff, 5)}
        if name == "flex":
            row["compile_s"] = round(compile_s, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


STEP_VARIANTS = {"flex": ("0", "0", "0"), "triton": ("1", "0", "0"), "triton_fused": ("1", "1", "0"),
                 "triton_fused_quant": ("1", "1", "1")}   # TRACESTORY_DECODE_ATTN, _FUSED, _QUANT


def step_part(batches, contexts, steps, names, layers=32) -> tuple[list[dict], dict]:
    from tracestory.models import fp8
    from tracestory.models.fp8 import SMALL_M, quantize_stack
    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve.model import PagedLlama
    from tracestory.serve.scheduler import Member

    cfg = LlamaConfig.from_name("llama-3-8b")
    nblk_max = -(-(max(contexts) + 1) // BS)
    nb = max(batches) * nblk_max + 16
    variants = [(n, *STEP_VARIANTS[n]) for n in names]
    models, tuned, startup = {}, {}, {}
    tune = fp8.tune_small_m

    def reuse(groups, rows):             # the first model's choice for every variant
        SMALL_M.clear()
        SMALL_M.update(tuned)
        return []

    for name, on, fused, quant in variants:
        os.environ["TRACESTORY_DECODE_ATTN"] = on
        os.environ["TRACESTORY_DECODE_ATTN_FUSED"] = fused
        os.environ["TRACESTORY_DECODE_ATTN_QUANT"] = quant
        m = PagedLlama(cfg, layers=layers, num_blocks=nb, block_size=BS, vocab=128256, device="cuda",
                       dtype=torch.bfloat16, seed=0, attention="flex")
        quantize_stack(m.stack.layers, "rowwise")
        if models:
            fp8.tune_small_m = reuse
        t0 = time.perf_counter()
        m.prepare(max_num_seqs=max(batches), max_batch_tokens=128, mixed_graphs=False)
        fp8.tune_small_m = tune
        if not models:
            tuned.update(SMALL_M)
        startup[name] = {k: m.startup.get(k) for k in ("decode_attn", "decode_attn_fused", "decode_attn_quant", "pdl",
                                                        "compile_s", "graph_capture_s",
                                                        "table_width_blocks", "decode_buckets")}
        print(f"[{name}] prepared in {time.perf_counter() - t0:.1f} s: {startup[name]}", flush=True)
        models[name] = m
    rows = []
    for ctx in contexts:
        nblk = -(-(ctx + 1) // BS)
        for b in batches:
            mem = [Member(str(i), "decode", ctx, (7 + i,), tuple(range(i * nblk, (i + 1) * nblk)), False, True)
                   for i in range(b)]
            gpu, wall, paths = alternate(models, mem, steps)
            base = statistics.median(gpu[names[0]])
            for n in models:
                g = statistics.median(gpu[n])
                row = {"part": "step", "context": ctx, "batch": b, "variant": n, "gpu_ms": round(g / 1e6, 4),
                       "wall_ms": round(statistics.median(wall[n]) * 1e3, 4),
                       "gpu_p10_ms": round(sorted(gpu[n])[len(gpu[n]) // 10] / 1e6, 4),
                       "vs_first": round(g / base, 4), "paths": sorted(paths[n])}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows, {"startup": startup, "small_m": {str(k): v for k, v in tuned.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="kernel,step")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--contexts", default="600,4000")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--variants", default="flex,triton,triton_fused_quant",
                    help=f"step part, the first is the baseline; of {','.join(STEP_VARIANTS)}")
    ap.add_argument("--splits", default="", help="fixed split counts to time too (kernel part), e.g. 4,8,16,32")
    ap.add_argument("--json")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    parts = args.parts.split(",")
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    if "kernel" in parts:
        out["rows"] += kernel_part(batches, contexts, fixed_splits=[int(x) for x in args.splits.split(",") if x])
        save()
    if "step" in parts:
        names = args.variants.split(",")
        if not set(names) <= set(STEP_VARIANTS):
            raise SystemExit(f"--variants: expected names of {', '.join(STEP_VARIANTS)}, found {args.variants!r}")
        rows, meta = step_part(batches, contexts, args.steps, names)
        out["rows"] += rows
        out.update(meta)
        save()


if __name__ == "__main__":
    main()
