"""The serving all-reduce on two GPUs (:mod:`tracestory.serve.allreduce`, run on the device
machine): symmetric memory against NCCL.

Expected values from a second path: ``dist.all_reduce`` (NCCL) on the same tensors, and the
whole TP=2 engine (2 layers of the llama-3-8b shape, bf16, FP8 row-wise, FlexAttention, decode
and prefill/mixed CUDA graphs) run once with ``TRACESTORY_ALLREDUCE=nccl``: at TP=2 both sum
``x0 + x1`` rounded once, so the greedy tokens must be the same."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

BS, NB, SEQS, BUDGET = 16, 96, 4, 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_tokens(rank: int):
    """One continuous-batching run over 7 ragged requests on this rank's shard (both ranks run
    the same schedule; the ids agree on every rank): (tokens, paths, startup all-reduce info,
    the reducer's per-kind call counts)."""
    import torch.distributed as dist

    from tracestory.models.fp8 import quantize_stack
    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve import tensor_parallel as tp
    from tracestory.serve.allreduce import AllReduce
    from tracestory.serve.model import PagedLlama

    from ragged_requests import drive  # tests/gpu/ragged_requests.py (its folder is on the path)

    cfg = LlamaConfig.from_name("llama-3-8b")
    m = PagedLlama(cfg, layers=2, num_blocks=NB, block_size=BS, vocab=1024, device=f"cuda:{rank}",
                   dtype=torch.bfloat16, seed=2, attention="flex")
    reduce = AllReduce()
    tp.shard_model(m, rank, 2, reduce, tp.all_gather_fn(2))
    quantize_stack(m.stack.layers, "rowwise")
    m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET)
    out, paths = drive(m, block_size=BS, num_blocks=NB, max_batch_tokens=BUDGET, max_num_seqs=SEQS)
    dist.barrier()
    return out, paths, m.startup["all_reduce"], dict(reduce.calls)


def _rank_main(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from tracestory.serve import tensor_parallel as tp
    from tracestory.serve.allreduce import ENV, AllReduce

    # the small-M GEMM off: its start-up timing may pick another kernel (other last bits) per run
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRACESTORY_SMALL_M="0", **tp.SAFE_NCCL_ENV)
    dev = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=dev)
    # no destroy_process_group at the end: after CUDA graphs captured NCCL all-reduces it did not
    # return on H100s (serve.tensor_parallel.Group.close); the rank leaves by os._exit
    try:
        # decode-size tensors, random values: the one-shot kernel against NCCL, bit for bit
        os.environ[ENV] = "auto"   # symmetric memory asked for (NCCL is the default)
        ar = AllReduce()
        info = ar.prepare(64, 4096, torch.bfloat16, dev)
        gen = torch.Generator(device=dev).manual_seed(10 + rank)
        same = []
        for rows in (1, 3, 8, 32):
            x = torch.randn(rows, 4096, generator=gen, device=dev).to(torch.bfloat16)
            want = x.clone()
            dist.all_reduce(want)
            same.append(bool(torch.equal(ar(x), want)))
        q.put((f"direct{rank}", info, same, dict(ar.calls)))
        runs = {}
        for mode in ("nccl", "auto"):
            os.environ[ENV] = mode
            runs[mode] = _serve_tokens(rank)
        q.put((f"serve{rank}", runs))
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def tp2():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {torch.cuda.device_count()}")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(200)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} rank(s) still running after 200 s (a hang)"
    got = {}
    while not q.empty():
        k, *rest = q.get()
        got[k] = rest
    assert [p.exitcode for p in procs] == [0, 0], sorted(got)
    return got


def test_one_shot_all_reduce_sums_as_nccl_bit_for_bit(tp2):
    for rank in (0, 1):
        info, same, calls = tp2[f"direct{rank}"]
        assert info["chosen"] == "symm_mem", info
        assert same == [True] * 4
        # 1-32 rows of 4,096 bf16 (8-256 KiB): all through the one-shot kernel (and set-up's check)
        assert calls == {"one_shot": 4, "two_shot": 0, "dist": 0}


def test_tp2_engine_gives_the_tokens_of_nccl_with_symmetric_memory(tp2):
    runs = tp2["serve0"][0]
    tok_nccl, paths_nccl, info_nccl, calls_nccl = runs["nccl"]
    tok_symm, paths_symm, info_symm, calls_symm = runs["auto"]
    assert info_nccl["chosen"] == "dist.all_reduce" and info_nccl["reason"] == "TRACESTORY_ALLREDUCE=nccl"
    assert info_symm["chosen"] == "symm_mem"
    assert calls_nccl["one_shot"] == 0 and calls_nccl["dist"] > 0
    # TP=2: up to 1 MiB (128 rows) one-shot, above (the 256-row chunk buckets) two-shot, nothing NCCL
    assert calls_symm["one_shot"] > 0 and calls_symm["two_shot"] > 0 and calls_symm["dist"] == 0
    assert {"graph", "mixed-graph"} <= set(paths_symm) and paths_symm == paths_nccl
    assert sorted(tok_symm) == [f"r{i}" for i in range(7)]
    assert tok_symm == tok_nccl
    assert tp2["serve1"][0]["auto"][0] == tok_symm      # rank 1 computed the same ids
