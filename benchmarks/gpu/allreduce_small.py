"""Decode-size all-reduce latency: NCCL against torch symmetric-memory kernels (P2P, no multicast).

A tensor-parallel decode step runs 2 all-reduces per layer of ``rows x 4096`` bf16 (rows = the
batch bucket, 1..32). Per method and size: 64 back-to-back all-reduces captured in one CUDA
graph (as the decode graphs run them), replayed 10 times; time per all-reduce = median replay
time / 64, the max over ranks. Methods:

* ``nccl``: ``dist.all_reduce`` (NCCL, NVLS off: ``NCCL_NVLS_ENABLE=0``);
* ``one_shot``: ``torch.ops.symm_mem.one_shot_all_reduce_out`` (each rank reads every peer's
  symmetric buffer over NVLink and sums: one kernel, no NCCL);
* ``two_shot``: ``torch.ops.symm_mem.two_shot_all_reduce_`` (reduce-scatter + all-gather, in place);
* ``one_shot_copy``: ``one_shot_all_reduce_copy_out`` from a local tensor back into it (the kernel
  copies it into the symmetric buffer first: what ``tracestory serve`` runs, :mod:`tracestory.serve.allreduce`);
* ``two_shot_copy``: the local tensor copied into the symmetric buffer, then
  ``two_shot_all_reduce_out`` into the local tensor (two kernels; the server's two-shot path).

The symmetric buffer is allocated once for the largest size; each size uses its leading slice
(as the server does).

Multicast stays off (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``; the multimem kernels are not tried).
A method the installed torch lacks or refuses is recorded with its error. Results are checked
against the expected sum (every rank adds ``rank + 1``).

Usage: torchrun --nproc_per_node=N benchmarks/gpu/allreduce_small.py [--rows 1,2,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from roofs import captured_graph, cuda_times   # this folder: run as torchrun ... benchmarks/gpu/allreduce_small.py

HIDDEN = 4096
ROWS = (1, 2, 4, 8, 16, 32)
REPS = 64


def _graph_us(fn) -> float:
    """Microseconds per call of ``fn`` replayed from one CUDA graph of :data:`REPS` calls (median of
    10 replays), the slowest rank's."""
    g = captured_graph([fn], REPS, warm=3)
    dist.barrier()
    t = torch.tensor([cuda_times(g.replay, reps=10, warm=0)[1] * 1e6 / REPS], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts (rows x 4096 bf16)")
    args = ap.parse_args()
    sizes = [int(r) for r in args.rows.split(",")]
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    gname = group.group_name
    symm = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(gname)
        symm = symm_mem
    except Exception as e:  # noqa: BLE001 -- recorded below
        print(f"rank {rank}: no symmetric memory: {e}", flush=True)
    want = world * (world + 1) / 2
    rows = []
    big = None
    if symm is not None:
        big = symm.empty(max(sizes) * HIDDEN, dtype=torch.bfloat16, device="cuda")
        symm.rendezvous(big, gname)
    for r in sizes:
        n = r * HIDDEN
        row = {"rows": r, "bytes": n * 2}
        x = torch.full((n,), rank + 1.0, device="cuda", dtype=torch.bfloat16)
        try:
            y = x.clone()
            dist.all_reduce(y)
            ok = bool((y == want).all().item())
            row["nccl_us"] = _graph_us(lambda: dist.all_reduce(x))
            row["nccl_ok"] = ok
        except Exception as e:  # noqa: BLE001
            row["nccl_error"] = " ".join(str(e).split())[:200]
        if symm is not None:
            buf = big[:n]
            out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
            loc = torch.empty(n, dtype=torch.bfloat16, device="cuda")

            def two_copy(buf=buf, loc=loc):
                buf.copy_(loc)
                torch.ops.symm_mem.two_shot_all_reduce_out(buf, "sum", gname, loc)

            for name, call in (
                ("one_shot", lambda: torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", gname, out)),
                ("two_shot", lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", gname)),
                ("one_shot_copy", lambda: torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf, loc, "sum", gname, loc)),
                ("two_shot_copy", two_copy),
            ):
                try:
                    buf.fill_(rank + 1.0)
                    loc.fill_(rank + 1.0)
                    dist.barrier()
                    call()
                    torch.cuda.synchronize()
                    res = {"one_shot": out, "two_shot": buf}.get(name, loc)
                    row[f"{name}_ok"] = bool((res == want).all().item())
                    row[f"{name}_us"] = _graph_us(call)
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_error"] = " ".join(str(e).split())[:200]
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0 and args.json:
        doc = {"world_size": world, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())), "reps_per_graph": REPS, "rows": rows}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
