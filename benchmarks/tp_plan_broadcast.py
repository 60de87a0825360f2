"""Cost of sending one iteration's plan from rank 0 to rank 1 (gloo, 2 CPU processes):
``broadcast_object_list`` of plain tuples (members rebuilt on rank 1) vs the two int64
broadcasts of ``tracestory.serve.tensor_parallel`` (``Control.send``/``receive``).

Run: ``PYTHONPATH=src python benchmarks/tp_plan_broadcast.py`` (decode plans of 1, 32 and 128
members with 4, 16 and 64 blocks each; medians of 250 after 50 warm-up sends, each after a
barrier). Results: docs/CAPTURE.md, "Tensor parallelism".
"""

from __future__ import annotations

import os
import statistics
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from tracestory.serve import tensor_parallel as tp
from tracestory.serve.scheduler import Member


def plan(batch, ctx_blocks):
    return [Member(f"cmpl-{i}", "decode", ctx_blocks * 16 - 1, (17,), tuple(range(i * ctx_blocks, (i + 1) * ctx_blocks)), False, True)
            for i in range(batch)]

def worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    g = dist.new_group(backend="gloo")
    ctl = tp.Control(g, rank)
    res = {}
    for batch, blocks in ((1, 4), (32, 16), (128, 64)):
        members = plan(batch, blocks)
        ids = [t for m in members for t in m.token_ids]
        for how in ("object", "tensor"):
            ts = []
            for rep in range(300):
                dist.barrier(group=g)
                t0 = time.perf_counter()
                if how == "object":
                    obj = [(3, [(m.start, m.token_ids, m.block_table, m.samples) for m in members], ids)] if rank == 0 else [None]
                    dist.broadcast_object_list(obj, src=0, group=g)
                    if rank == 1:
                        _, rows, _ids = obj[0]
                        [Member(str(i), "decode", a, b, c, False, d) for i, (a, b, c, d) in enumerate(rows)]
                else:
                    if rank == 0:
                        ctl.send(tp.CMD_PLAN, members, 3, ids)
                    else:
                        ctl.receive()
                ts.append(time.perf_counter() - t0)
            res[(batch, blocks, how)] = statistics.median(ts[50:]) * 1e6
    out.put((rank, res))
    dist.destroy_process_group()

if __name__ == "__main__":
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(29611, q), nprocs=2)
    got = dict(q.get() for _ in range(2))
    for key in sorted(got[0]):
        b, bl, how = key
        print(f"batch {b:4d} x {bl:3d} blocks  {how:6s}: rank 0 sends in {got[0][key]:7.1f} us, rank 1 has the plan after {got[1][key]:7.1f} us (medians of 250)")
