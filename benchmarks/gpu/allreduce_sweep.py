"""All-reduce bus bandwidth per message size, measured directly (a second source for the
bandwidths tracestory computes from traces).

Run under torchrun: ``torchrun --nproc_per_node=N benchmarks/gpu/allreduce_sweep.py --json out.json``.
Each size: warm-up, then ``--iters`` back-to-back all-reduces timed with CUDA events on rank 0's
stream; time per op = elapsed / iters (the max over ranks is taken, as nccl-tests does).
algbw = bytes / time; busbw = algbw * 2 (n - 1) / n (NCCL's all-reduce bus-bandwidth factor).
The algorithm NCCL picked is visible in the kernel names of a trace, not here.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dtype = getattr(torch, args.dtype)
    esize = torch.empty((), dtype=dtype).element_size()
    rows = []
    for log2 in range(10, 31, 2):  # 1 KiB .. 1 GiB
        nbytes = 1 << log2
        x = torch.ones(nbytes // esize, device="cuda", dtype=dtype)
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        t = torch.tensor([start.elapsed_time(end) / args.iters * 1e-3], device="cuda", dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        sec = float(t.item())
        algbw = nbytes / sec
        rows.append({"bytes": nbytes, "time_s": sec, "algbw_bytes_per_s": algbw,
                     "busbw_bytes_per_s": algbw * 2 * (world - 1) / world})
        del x
    if rank == 0:
        doc = {"world_size": world, "dtype": args.dtype, "iters": args.iters,
               "device": torch.cuda.get_device_name(), "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
               "torch": torch.__version__, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        for r in rows:
            print(f"{r['bytes']:>12d} B  {r['time_s'] * 1e6:9.1f} us  algbw {r['algbw_bytes_per_s'] / 1e9:7.1f} GB/s"
                  f"  busbw {r['busbw_bytes_per_s'] / 1e9:7.1f} GB/s")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
