"""Where a serving step's time goes, and what the fused glue and the GEMM choice change (one GPU).

Parts (``--parts``, default all):

* ``gemm``: the projections of the llama-3-8b shape at small M (1..32 rows), per tensor-parallel
  degree 1/2/4 (the shapes one rank multiplies): bf16 ``F.linear`` against FP8 row-wise (the
  Triton per-row quantiser + ``torch._scaled_mm``, and ``_scaled_mm`` alone), and Wq/Wk/Wv,
  Wg/Wu as one stacked GEMM against one GEMM each. Each time is one call inside a CUDA graph of
  64 calls cycling over copies of the weight (>= 512 MB in all, so the weights come from HBM,
  not L2); GB/s = weight bytes read / time. Also the small-M Triton FP8 kernel
  (:mod:`tracestory.models.fp8_small_m`, each config) on the pre-quantised activation.
* ``step``: a 32-layer llama-3-8b :class:`~tracestory.serve.model.PagedLlama` (bf16, FP8
  row-wise projections, FlexAttention) prepared like the server (decode and prefill/mixed CUDA
  graphs), once per variant (``--glue``: by default the torch glue with ``_scaled_mm`` everywhere,
  then the fused Triton glue with the small-M GEMM where it measured faster; options switch the
  small-M GEMM and programmatic dependent launch off): the decode
  step at batch 1/4/8/16 (contexts of 600 tokens; wall time per step over 30 steps, each
  synchronised, and the device time between the launch's two timing events, median),
  the kernels one step launches and their GPU time by kind (torch.profiler), and one iteration
  with a 2,048-token prefill chunk (the same).

Usage: python benchmarks/gpu/decode_glue.py [--parts gemm,step] [--tp 1,2,4] [--m 1,8] [--block-n 64,32,16]
[--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from roofs import captured_graph, cuda_times   # this folder: run as python3 benchmarks/gpu/decode_glue.py

D, H, KH, HD, FF = 4096, 32, 8, 128, 14336


def _graph_time(calls, reps=64) -> float:
    """Seconds per call of ``calls[i % len]()``, replayed from one CUDA graph of ``reps`` calls
    (median of 5 replays after one)."""
    g = captured_graph(calls, reps, warm=min(3, len(calls)))
    return cuda_times(g.replay, reps=5, warm=1)[1] / reps


def gemm_part(tps=(1, 2, 4), ms=(1, 2, 4, 8, 16, 32), block_ns=(64,), configs=None) -> list[dict]:
    """``configs``: small-M kernel configs ``(BLOCK_K, stages, BLOCK_N, warps)`` to time;
    default: the tuner's :data:`~tracestory.models.fp8_small_m.CONFIGS` at each of ``block_ns``."""
    from tracestory.models import fp8_small_m
    from tracestory.models import quant_triton as qt
    from tracestory.models.fp8 import SMALL_M, Fp8Weight, scaled_mm

    SMALL_M.clear()                   # _scaled_mm only in the fp8 columns

    rows = []
    for tp in tps:
        shapes = {"qkv": [((H + 2 * KH) * HD // tp, D)], "q,k,v": [(H * HD // tp, D), (KH * HD // tp, D),
                                                                     (KH * HD // tp, D)],
                  "wo": [(D, H * HD // tp)], "gu": [(2 * FF // tp, D)], "g,u": [(FF // tp, D)] * 2,
                  "wd": [(D, FF // tp)]}
        for name, parts in shapes.items():
            wbytes = sum(n * k for n, k in parts)
            copies = max(1, -(-512 * 2**20 // wbytes))
            ws = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for n, k in parts]
                  for _ in range(copies)]
            if name in ("qkv", "wo", "gu", "wd"):
                bf = True
            else:
                bf = False
            q8 = [[Fp8Weight(w, "rowwise") for w in c] for c in ws]
            if not bf:
                del ws
            for m in ms:
                x = torch.randn(m, parts[0][1], device="cuda", dtype=torch.bfloat16)
                qx, sx = qt.quantize_per_row(x)
                row = {"tp": tp, "proj": name, "m": m, "weight_mb": round(wbytes / 1e6, 2)}
                t = _graph_time([lambda c=c: [scaled_mm(*qt.quantize_per_row(x), w, torch.bfloat16) for w in c]
                                 for c in q8])
                row["fp8_quant_mm_us"] = t * 1e6
                t = _graph_time([lambda c=c: [scaled_mm(qx, sx, w, torch.bfloat16) for w in c] for c in q8])
                row["fp8_mm_us"] = t * 1e6
                row["fp8_mm_gbps"] = wbytes / t / 1e9
                if m <= fp8_small_m.MAX_M:
                    cfgs = configs or [(bk, st, bn, 4 if bn >= 32 else 2)
                                       for (bk, st), bn in itertools.product(fp8_small_m.CONFIGS, block_ns)]
                    for bk, st, bn, warps in cfgs:
                        if all(fp8_small_m.fits(m, k, bk) for _, k in parts):
                            t = _graph_time([lambda c=c, bk=bk, st=st, bn=bn, warps=warps: [
                                fp8_small_m.matmul(qx, sx, w.weight, w.scale, bk, st, bn, warps) for w in c]
                                for c in q8])
                            label = f"k{bk}_s{st}_n{bn}_w{warps}"   # BLOCK_K, stages, BLOCK_N, warps
                            row[f"triton_{label}_us"] = t * 1e6
                            row[f"triton_{label}_gbps"] = wbytes / t / 1e9
                if bf:
                    t = _graph_time([lambda c=c: [F.linear(x, w) for w in c] for c in ws])
                    row["bf16_us"] = t * 1e6
                    row["bf16_gbps"] = 2 * wbytes / t / 1e9
                rows.append(row)
                print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
                      flush=True)
            del q8
            if bf:
                del ws
            torch.cuda.empty_cache()
    return rows


def _kind(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if "all_reduce" in n:                 # torch symmetric-memory kernels (one-/two-shot)
        return "symm-mem all-reduce"
    if "small_m" in n:                    # _fp8_gemm_small_m_kernel
        return "gemm (triton small-M)"
    if "nvjet" in n or "gemm" in n or "sm90_xmma" in n or "cutlass" in n or "gemv" in n:
        return "gemm"
    if "paged_decode_attn" in n:          # models/decode_attn_triton.py
        return "split-KV decode attention (triton)"
    if "flex" in n or "triton_tem" in n:
        return "flex attention"
    if "argmax" in n:                     # glue_triton.row_max: the LM head's greedy pick
        return "reduction"
    if "norm_quant_kernel" in n or "_norm_kernel" in n or "_rope_qkv" in n or "_silu_mul" in n:
        return "fused glue (triton)"
    if "_quant_row" in n:
        return "fp8 quantiser (triton)"
    if "reduce" in n:
        return "reduction"
    if "elementwise" in n or "vectorized" in n or "index" in n or "copy" in n or "cat" in n:
        return "elementwise"
    return "other"


def _profile(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kinds: dict[str, list] = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        k = kinds.setdefault(_kind(e.name), [0, 0.0])
        k[0] += 1
        k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(v[1] for v in kinds.values())
    return {"kernels": sum(v[0] for v in kinds.values()), "gpu_us": round(total, 1),
            "by_kind": {k: {"kernels": v[0], "us": round(v[1], 1), "share": round(v[1] / total, 3) if total else 0}
                        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][1])}}


def step_part(glues) -> list[dict]:
    from tracestory.models.fp8 import SMALL_M, quantize_stack, weight_bytes
    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve.model import PagedLlama
    from tracestory.serve.scheduler import Member

    cfg = LlamaConfig.from_name("llama-3-8b")
    bs, nb, ctx = 16, 2048, 600
    m = PagedLlama(cfg, layers=32, num_blocks=nb, block_size=bs, vocab=128256, device="cuda",
                   dtype=torch.bfloat16, seed=0, attention="flex")
    quantize_stack(m.stack.layers, "rowwise")
    wbytes = sum(weight_bytes(layer) for layer in m.stack.layers) + m.lm_head.numel() * 2
    out = []
    for variant in glues:
        glue, *opts = variant.split(":")
        os.environ["TRACESTORY_SMALL_M"] = "0" if "nosmall" in opts else "1"
        os.environ["TRACESTORY_PDL"] = "0" if "nopdl" in opts else "1"
        SMALL_M.clear()
        t0 = time.perf_counter()
        m.prepare(max_num_seqs=16, max_batch_tokens=2048, glue=glue)
        glue = variant
        print(f"[{glue}] prepared in {time.perf_counter() - t0:.1f} s: {json.dumps(m.startup)}", flush=True)
        nblk = -(-(ctx + 1) // bs)

        def decode_members(b):
            return [Member(str(i), "decode", ctx, (7 + i,), tuple(range(i * nblk, (i + 1) * nblk)), False, True)
                    for i in range(b)]

        for b in (1, 4, 8, 16):
            mem = decode_members(b)
            for _ in range(5):
                m.launch(mem, 0).result()
            walls, gpus = [], []
            for _ in range(30):
                t = time.perf_counter()
                launch = m.launch(mem, 0)
                launch.result()
                walls.append(time.perf_counter() - t)
                gpus.append(launch.gpu_ns or 0)
            prof = _profile(lambda: m.launch(mem, 0).result())
            med = statistics.median(walls)
            row = {"glue": glue, "what": f"decode batch {b}", "path": launch.path, "wall_ms": round(med * 1e3, 3),
                   "gpu_ms": round(statistics.median(gpus) / 1e6, 3),
                   "weight_gb": round(wbytes / 1e9, 3), "weight_tbps": round(wbytes / med / 1e12, 3), **prof}
            out.append(row)
            print(json.dumps(row), flush=True)
        # one prefill chunk of 2,048 tokens (a new request at position 0)
        pre = [Member("p", "prefill", 0, tuple(range(1, 2049)), tuple(range(1000, 1000 + 2048 // bs)), False, True)]
        for _ in range(3):
            m.launch(pre, 0).result()
        walls = []
        for _ in range(10):
            t = time.perf_counter()
            launch = m.launch(pre, 0)
            launch.result()
            walls.append(time.perf_counter() - t)
        prof = _profile(lambda: m.launch(pre, 0).result())
        med = statistics.median(walls)
        flops = 2 * 2048 * sum(layer.wqkv.weight.numel() + layer.wo.weight.numel() + layer.wgu.weight.numel()
                               + layer.wd.weight.numel() for layer in m.stack.layers)
        row = {"glue": glue, "what": "prefill 2048 tokens", "path": launch.path, "wall_ms": round(med * 1e3, 3),
               "layer_gemm_tflops": round(flops / med / 1e12, 1), **prof}
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="gemm,step")
    ap.add_argument("--glue", default="torch:nosmall,triton",
                    help="variants: GLUE[:OPT...] (torch or triton glue; OPT nosmall: _scaled_mm at every M, "
                         "nopdl: TRACESTORY_PDL=0)")
    ap.add_argument("--tp", default="1,2,4", help="gemm part: the tensor-parallel degrees whose shapes are timed")
    ap.add_argument("--m", default="1,2,4,8,16,32", help="gemm part: the row counts")
    ap.add_argument("--block-n", default="64", help="gemm part: the small-M kernel's BLOCK_N values timed")
    ap.add_argument("--small-m-configs", default="",
                    help="gemm part: small-M configs BLOCK_K:stages:BLOCK_N:warps, comma-separated "
                         "(default: the tuner's configs at each --block-n)")
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    parts = args.parts.split(",")
    if "gemm" in parts:
        cfgs = [tuple(map(int, c.split(":"))) for c in args.small_m_configs.split(",") if c]
        res["gemm"] = gemm_part(tuple(map(int, args.tp.split(","))), tuple(map(int, args.m.split(","))),
                                tuple(map(int, args.block_n.split(","))), cfgs or None)
    if "step" in parts:
        res["step"] = step_part(args.glue.split(","))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
