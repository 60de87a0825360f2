"""Programmatic dependent launch, A/B on the same GPU at the same time (one GPU).

Two 32-layer llama-3-8b :class:`~tracestory.serve.model.PagedLlama` with the same weights (bf16,
FP8 row-wise projections, FlexAttention, the fused glue and the small-M GEMM), prepared like the
server, each with ``TRACESTORY_PDL`` as ``--variants`` says (``nopdl`` or ``pdl``; a repeated
variant is a model of its own, an A/A control of the method's noise). The small-M GEMM's configs
are tuned once, for the first model, and reused by the others,
so the variants differ only in how their kernels launch. Then the decode steps of the variants
alternate (A, B, C, A, B, C, ...) at each batch size (contexts of 600 tokens), each step
synchronised, so clock and neighbour drift hit every variant alike; per variant and batch: the
median device time between the launch's timing events (``Launch.gpu_ns``) and wall time.

Usage: python benchmarks/gpu/pdl_ab.py [--variants nopdl,pdl,nopdl] [--batches 1,4,16] [--steps 200] [--json OUT]

(Session 12's first run also had variants that prefetched weight rows into L2, since removed;
its JSON is kept in benchmarks/results/h100/small_m/session12_pdl_ab.json.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from ab_steps import alternate  # this folder: run as python3 benchmarks/gpu/pdl_ab.py


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="nopdl,pdl,nopdl", help="nopdl or pdl each; the first is the baseline")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()

    from tracestory.models import fp8
    from tracestory.models.fp8 import SMALL_M, quantize_stack
    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve.model import PagedLlama
    from tracestory.serve.scheduler import Member

    cfg = LlamaConfig.from_name("llama-3-8b")
    bs, nb, ctx = 16, 2048, 600
    names = args.variants.split(",")
    if not set(names) <= {"nopdl", "pdl"}:
        raise SystemExit(f"--variants: expected nopdl or pdl, found {args.variants!r}")
    variants = [(f"{n}#{i}", {"TRACESTORY_PDL": "0" if n == "nopdl" else "1"}) for i, n in enumerate(names)]
    models, tuned = {}, None
    tune = fp8.tune_small_m
    for name, env in variants:
        os.environ.update(env)
        m = PagedLlama(cfg, layers=args.layers, num_blocks=nb, block_size=bs, vocab=128256, device="cuda",
                       dtype=torch.bfloat16, seed=0, attention="flex")
        quantize_stack(m.stack.layers, "rowwise")
        if tuned is not None:            # the first model's choice for every variant
            fp8.tune_small_m = lambda groups, rows: (SMALL_M.clear(), SMALL_M.update(tuned), [])[-1]
        t0 = time.perf_counter()
        m.prepare(max_num_seqs=16, max_batch_tokens=2048, mixed_graphs=False)
        fp8.tune_small_m = tune
        if tuned is None:
            tuned = dict(SMALL_M)
        print(f"[{name}] prepared in {time.perf_counter() - t0:.1f} s, pdl={m.startup.get('pdl')}, "
              f"small-M configs {sorted(set(tuned.values()))}", flush=True)
        models[name] = m
    nblk = -(-(ctx + 1) // bs)
    rows = []
    for b in map(int, args.batches.split(",")):
        mem = [Member(str(i), "decode", ctx, (7 + i,), tuple(range(i * nblk, (i + 1) * nblk)), False, True)
               for i in range(b)]
        gpu, wall, _paths = alternate(models, mem, args.steps)
        base = statistics.median(gpu[variants[0][0]])
        for n in models:
            g = statistics.median(gpu[n])
            row = {"variant": n, "batch": b, "gpu_ms": round(g / 1e6, 4), "wall_ms": round(statistics.median(wall[n]) * 1e3, 4),
                   "gpu_p10_ms": round(sorted(gpu[n])[len(gpu[n]) // 10] / 1e6, 4), "vs_first": round(g / base, 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "context": ctx,
                       "small_m": {str(k): v for k, v in tuned.items()}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
