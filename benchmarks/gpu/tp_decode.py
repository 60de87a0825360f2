"""The decode step of the serving model at TP=1/2/4, NCCL against symmetric-memory all-reduce.

A 32-layer llama-3-8b :class:`~tracestory.serve.model.PagedLlama` (bf16, FP8 row-wise
projections, FlexAttention, the fused glue and the small-M GEMM as the server runs them) is built
on each rank, sharded as ``tracestory serve --tensor-parallel N`` shards it
(:func:`tracestory.serve.tensor_parallel.shard_model`, vocab-parallel LM head), and prepared with
its decode CUDA graphs (no prefill/mixed graphs, a 256-token budget: prefill is not timed here) once per all-reduce mode
(``--modes``: ``TRACESTORY_ALLREDUCE`` values; ``auto`` = symmetric memory where it sets up). Per
mode and batch (1, 4, 8 rows, contexts of 600 tokens, every rank runs the same steps): wall time
per step over 50 steps, each waiting for its sampled ids (``launch().result()``, as the engine
does), rank 0's median; the sampled ids of the last step (compared across modes); and one step
under torch.profiler (kernels and GPU time by kind, rank 0).

Usage: python benchmarks/gpu/tp_decode.py --json OUT                     (TP=1)
       torchrun --nproc_per_node=N benchmarks/gpu/tp_decode.py [--modes nccl,auto] --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from decode_glue import _profile   # this folder: run as python3/torchrun benchmarks/gpu/tp_decode.py

BATCHES = (1, 4, 8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="nccl,auto")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    from tracestory.models.fp8 import quantize_stack
    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve import allreduce
    from tracestory.serve import tensor_parallel as tp
    from tracestory.serve.model import PagedLlama
    from tracestory.serve.scheduler import Member

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    torch.cuda.set_device(dev)
    if world > 1:
        import torch.distributed as dist

        for k, v in tp.SAFE_NCCL_ENV.items():
            os.environ.setdefault(k, v)
        dist.init_process_group("nccl", device_id=dev)
    cfg = LlamaConfig.from_name("llama-3-8b")
    bs, nb, ctx = 16, 2048, 600
    m = PagedLlama(cfg, layers=32, num_blocks=nb, block_size=bs, vocab=128256, device=str(dev),
                   dtype=torch.bfloat16, seed=0, attention="flex")
    if world > 1:
        tp.shard_model(m, rank, world, allreduce.AllReduce(), tp.all_gather_fn(world))
    quantize_stack(m.stack.layers, "rowwise")
    nblk = -(-(ctx + 1) // bs)

    def members(b):
        return [Member(str(i), "decode", ctx, (7 + i,), tuple(range(i * nblk, (i + 1) * nblk)), False, True)
                for i in range(b)]

    rows = []
    for mode in (args.modes.split(",") if world > 1 else ["none"]):
        if world > 1:
            os.environ[allreduce.ENV] = mode
            m.tp_reduce = allreduce.AllReduce()
        t0 = time.perf_counter()
        # a small token budget: one chunk bucket to warm up (prefill is not timed here)
        m.prepare(max_num_seqs=max(BATCHES), max_batch_tokens=256, mixed_graphs=False)
        info = m.startup.get("all_reduce")
        if rank == 0:
            print(f"[tp{world} {mode}] prepared in {time.perf_counter() - t0:.1f} s, all-reduce {json.dumps(info)}",
                  flush=True)
        for b in BATCHES:
            mem = members(b)
            for _ in range(5):
                m.launch(mem, 0).result()
            walls, ids = [], None
            for _ in range(args.steps):
                t = time.perf_counter()
                launch = m.launch(mem, 0)
                ids = launch.result()
                walls.append(time.perf_counter() - t)
            prof = _profile(lambda mem=mem: m.launch(mem, 0).result()) if b in (1, 8) else {}
            row = {"tp": world, "mode": mode, "all_reduce": (info or {}).get("chosen", "-"), "batch": b,
                   "path": launch.path, "wall_ms_p50": round(statistics.median(walls) * 1e3, 3),
                   "wall_ms_min": round(min(walls) * 1e3, 3), "ids": [ids[str(i)] for i in range(b)], **prof}
            rows.append(row)
            if rank == 0:
                print(json.dumps({k: v for k, v in row.items() if k != "ids"}), flush=True)
    if rank == 0:
        modes = sorted({r["mode"] for r in rows})
        if len(modes) > 1:
            for b in BATCHES:
                same = len({tuple(r["ids"]) for r in rows if r["batch"] == b}) == 1
                print(f"batch {b}: sampled ids the same in every mode: {same}", flush=True)
        if args.json:
            doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "world_size": world,
                   "context": ctx, "steps": args.steps, "rows": rows}
            with open(args.json, "w") as fh:
                json.dump(doc, fh, indent=1)
    if world > 1:
        import sys

        import torch.distributed as dist

        # no destroy_process_group: after CUDA graphs captured NCCL all-reduces it did not return
        # on H100s (serve.tensor_parallel.Group.close); leave as the server's ranks do
        dist.barrier()
        torch.cuda.synchronize()
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
