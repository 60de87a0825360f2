"""Tensor-parallel serving on the CPU: shards, plans on the wire, TP=2 (two gloo processes)
against TP=1 under continuous batching, a lost rank, launch errors."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")

from tracestory.cli import main  # noqa: E402
from tracestory.errors import UsageError  # noqa: E402
from tracestory.models.llama_config import LlamaConfig  # noqa: E402
from tracestory.serve import tensor_parallel as tp  # noqa: E402
from tracestory.serve.model import PagedLlama  # noqa: E402
from tracestory.serve.scheduler import Member, Scheduler, SchedulerConfig  # noqa: E402

TINY = LlamaConfig.from_name("tiny")      # D 64, H 4, Hkv 2, d 16, I 160


def _model(**kw):
    return PagedLlama(TINY, layers=2, num_blocks=64, block_size=4, vocab=512, device="cpu",
                      dtype=torch.float32, seed=0, **kw)


# ----------------------------------------------------------------------------- shards
def test_local_config_keeps_head_dim():
    loc = tp.local_config(TINY, 2)
    assert (loc.n_heads, loc.n_kv_heads, loc.ffn_dim, loc.dim) == (2, 1, 80, 64)
    assert loc.head_dim == 16 == TINY.head_dim          # 64 // 4, not 64 // 2
    assert loc.group == TINY.group == 2


def test_shard_shapes_and_slices():
    full, shard = _model(), _model()
    tp.shard_model(shard, rank=1, n=2)
    d = 16
    for fl, sl in zip(full.stack.layers, shard.stack.layers):
        # rank 1 of 2: query heads 2,3 -> rows 32..63; kv head 1 -> rows 16..31; MLP rows 80..159
        assert tuple(sl.wq.shape) == (2 * d, 64) and torch.equal(sl.wq, fl.wq[32:64])
        assert tuple(sl.wk.shape) == (d, 64) and torch.equal(sl.wk, fl.wk[16:32])
        assert torch.equal(sl.wv, fl.wv[16:32])
        assert tuple(sl.wo.shape) == (64, 2 * d) and torch.equal(sl.wo, fl.wo[:, 32:64])
        assert tuple(sl.wg.shape) == (80, 64) and torch.equal(sl.wg, fl.wg[80:160])
        assert torch.equal(sl.wu, fl.wu[80:160])
        assert tuple(sl.wd.shape) == (64, 80) and torch.equal(sl.wd, fl.wd[:, 80:160])
        assert torch.equal(sl.n1, fl.n1) and torch.equal(sl.n2, fl.n2)
    assert torch.equal(shard.embed, full.embed) and torch.equal(shard.lm_head, full.lm_head)
    # 64 blocks of 4 slots plus the scratch block padding rows write into; one KV head of 2
    assert tuple(shard.k_cache[0].shape) == ((64 + 1) * 4, 1, d) == tuple(shard.v_cache[1].shape)
    assert shard.cfg.n_heads == 2 and shard.tp == {"rank": 1, "size": 2}


def test_vocab_parallel_head_keeps_a_slice_and_picks_the_global_argmax():
    full, shard = _model(), _model()
    n, v = 2, full.vocab // 2
    # the other rank's (value, global id) pairs, as an all-gather would return them
    other = torch.tensor([[5.0, 1.0], [float(v + 3), float(v + 7)]])

    def gather(t):
        return torch.stack((t, other))
    tp.shard_model(shard, rank=0, n=n, gather=gather)
    assert torch.equal(shard.lm_head, full.lm_head[:v])
    logits = torch.zeros(2, v)
    logits[0, 9], logits[1, 4] = 4.0, 1.0      # row 0: 4.0 < the other rank's 5.0; row 1: a tie at 1.0
    # row 0 -> the other rank's id v+3; row 1 -> the tie goes to rank 0's id 4 (lowest id, as argmax)
    assert shard.tp_argmax(logits).tolist() == [v + 3, 4]
    # the same pick when this rank's (value, id) come from a row_max callable (the GPU's kernels):
    # here one that reports row 0's best as 6.0 at id 2, above the other rank's 5.0
    seen = []

    def row_max(lg):
        seen.append(lg)
        return torch.tensor([6.0, 1.0]), torch.tensor([2, 4])
    assert shard.tp_argmax(logits, row_max=row_max).tolist() == [2, 4] and seen[0] is logits


def test_divisibility_errors_name_what_does_not_divide():
    with pytest.raises(UsageError, match=r"--tensor-parallel 3: expected the query heads of tiny to divide by 3, found 4"):
        tp.local_config(TINY, 3)
    with pytest.raises(UsageError, match=r"KV heads of tiny to divide by 4, found 2"):
        tp.check_divisible(TINY, 4)
    with pytest.raises(UsageError, match=r"MLP width of odd to divide by 4, found 150"):
        tp.check_divisible(LlamaConfig("odd", 64, 4, 4, 150), 4)


def test_plan_round_trip():
    members = [Member("a", "prefill", 0, (5, 6, 7), (3, 9), True, False),
               Member("b", "decode", 11, (-2,), (1, 4, 8), False, True)]
    header, payload = tp.encode_plan(members, 17, [5, 6, 7, -2])
    # header: plan, iteration + 1, 2 members, 4 ids, 5 table entries
    assert header.tolist() == [tp.CMD_PLAN, 18, 2, 4, 5, 0]
    assert payload.tolist() == [0, 3, 0, 2, 11, 1, 1, 3, 5, 6, 7, -2, 3, 9, 1, 4, 8]
    it, got, ids = tp.decode_plan(header, payload)
    assert it == 17 and ids == [5, 6, 7, -2]
    assert [(m.start, m.token_ids, m.block_table, m.samples) for m in got] == \
        [(0, (5, 6, 7), (3, 9), False), (11, (-2,), (1, 4, 8), True)]


# ----------------------------------------------------------------------------- launch errors
def test_rank_from_env():
    assert tp.rank_from_env(2, {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}) == tp.RankInfo(1, 2, 1)
    with pytest.raises(UsageError, match=r"expected to run under torchrun, found no WORLD_SIZE/RANK.*"
                                         r"torchrun --nproc_per_node=2 -m tracestory.cli serve --tensor-parallel 2"):
        tp.rank_from_env(2, {})
    with pytest.raises(UsageError, match=r"expected torchrun with 2 processes \(WORLD_SIZE=2\), found WORLD_SIZE=4"):
        tp.rank_from_env(2, {"WORLD_SIZE": "4", "RANK": "0"})


def test_cli_refuses_tensor_parallel_without_torchrun(monkeypatch, capsys):
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert main(["serve", "--tensor-parallel", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected to run under torchrun" in err[0] and "--nproc_per_node=2" in err[0]
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert main(["serve", "--tensor-parallel", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "found WORLD_SIZE=3" in err[0]
    assert main(["serve", "--tensor-parallel", "0"]) == 2
    assert "--tensor-parallel: expected an integer >= 1, found 0" in capsys.readouterr().err


# ----------------------------------------------------------------------------- two processes
# Continuous batching: A arrives first, B two iterations later, C (longer than the 16-token
# budget: chunked prefill) a third later, so decodes, mixed and chunked iterations all occur.
ARRIVALS = {0: [("A", list(range(10, 20)), 6)], 2: [("B", list(range(40, 47)), 5)],
            3: [("C", list(range(100, 120)), 4)]}


def _drive(model) -> tuple[dict[str, list[int]], int]:
    """Run the scheduler over ``model`` (``step``) until every request finished: the tokens of
    each request and the number of forwards."""
    sched = Scheduler(SchedulerConfig(block_size=4, num_blocks=64, max_batch_tokens=16, max_num_seqs=4))
    out: dict[str, list[int]] = {}
    it = steps = 0
    while it == 0 or sched.has_work or it <= max(ARRIVALS):
        for rid, prompt, n in ARRIVALS.get(it, []):
            sched.add_request(rid, prompt, n, ignore_eos=True)
        if sched.has_work:
            plan = sched.schedule()
            res = sched.complete(plan, model.step(plan.members, plan.iteration))
            steps += 1
            for rid, tok in res.new_tokens:
                out.setdefault(rid, []).append(tok)
        it += 1
    return out, steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, q, mode: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if mode.startswith("allreduce"):
        _allreduce_rank(rank, q, mode)
        dist.destroy_process_group()
        return
    ctl = tp.Control(dist.new_group(backend="gloo"), rank)
    model = _model()

    def all_reduce(x):
        dist.all_reduce(x)
        return x

    tp.shard_model(model, rank, 2, all_reduce, tp.all_gather_fn(2))
    assert model.lm_head.shape[0] == model.vocab // 2 and model.tp_argmax is not None
    if rank == 1:
        if mode == "die":                     # take one plan, then vanish without a word
            ctl.receive()
            os._exit(3)
        q.put(("ran", tp.follow(model, ctl)))
        dist.destroy_process_group()
        return
    lost: list[str] = []
    front = tp.TensorParallelFront(model, ctl, lost.append)
    if mode == "die":
        import time

        t0, err = time.monotonic(), None
        try:
            for _ in range(50):
                _drive(front)
        except tp.WorkerLost as e:
            err = str(e)
        q.put(("lost", err, lost, time.monotonic() - t0))
        return
    tokens, _ = _drive(front)
    front.stop()
    q.put(("tokens", tokens))
    dist.destroy_process_group()


def _allreduce_rank(rank: int, q, mode: str) -> None:
    """The serving all-reduce (:class:`~tracestory.serve.allreduce.AllReduce`) on gloo: its
    set-up's verdict, a sum, and which path served it."""
    from tracestory.serve.allreduce import ENV, AllReduce

    if mode == "allreduce-nccl":
        os.environ[ENV] = "nccl"
    elif mode == "allreduce":
        os.environ[ENV] = "auto"      # symmetric memory asked for: gloo rules it out
    else:
        os.environ.pop(ENV, None)     # the default: NCCL
    ar = AllReduce()
    info = ar.prepare(8, 64, torch.float32, "cpu")
    x = torch.full((3, 64), float(rank + 1))
    y = ar(x)
    q.put((f"rank{rank}", info, y is x, sorted(set(y.flatten().tolist())), dict(ar.calls)))


def _spawn(mode: str, timeout_s: float = 60.0) -> list[tuple]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, q, mode)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} rank(s) still running after {timeout_s} s (a hang)"
    got = []
    while not q.empty():
        got.append(q.get())
    return got + [("exit", [p.exitcode for p in procs])]


def test_tp2_gives_the_tokens_of_tp1_under_continuous_batching():
    ref, steps = _drive(_model())
    assert sorted(ref) == ["A", "B", "C"] and [len(ref[k]) for k in "ABC"] == [6, 5, 4]
    got = dict((k, v) for k, v, *_ in _spawn("serve"))
    assert got["exit"] == [0, 0]
    assert got["tokens"] == ref
    assert got["ran"] == steps              # rank 1 ran every forward rank 0 ran


def test_lost_rank_is_reported_not_a_hang():
    got = {k: rest for k, *rest in _spawn("die", timeout_s=90)}
    err, lost, seconds = got["lost"]
    assert err is not None and err.startswith("tensor-parallel rank lost")
    assert lost == [err]                   # the server's stop callback was told once
    assert seconds < 60, (seconds, err)
    assert got["exit"][0][1] == 3


@pytest.mark.parametrize("mode", ["allreduce", "allreduce-nccl", "allreduce-default"])
def test_serving_all_reduce_falls_back_to_dist_all_reduce_on_gloo(mode):
    got = {k: rest for k, *rest in _spawn(mode)}
    assert got["exit"] == [[0, 0]]
    for rank in (0, 1):
        info, in_place, values, calls = got[f"rank{rank}"]
        assert info["chosen"] == "dist.all_reduce" and info["backend"] == "gloo" and info["world_size"] == 2
        # the reason names what ruled symmetric memory out: the flag first, else the CPU / gloo
        want = {"allreduce-nccl": "TRACESTORY_ALLREDUCE=nccl", "allreduce": "no symmetric memory on gloo / cpu",
                "allreduce-default": "NCCL is the default (TRACESTORY_ALLREDUCE=auto tries symmetric memory)"}[mode]
        assert info["reason"] == want
        assert in_place and values == [3.0]      # 1 + 2, summed in place
        assert calls == {"one_shot": 0, "two_shot": 0, "dist": 1}


def test_all_reduce_mode_reads_the_environment(monkeypatch):
    from tracestory.serve import allreduce

    monkeypatch.delenv(allreduce.ENV, raising=False)
    assert allreduce.mode() == "nccl"     # the default: symmetric memory was not faster (docs/BENCHMARKS.md)
    monkeypatch.setenv(allreduce.ENV, " Auto ")
    assert allreduce.mode() == "auto"
    monkeypatch.setenv(allreduce.ENV, " NCCL ")
    assert allreduce.mode() == "nccl"
    monkeypatch.setenv(allreduce.ENV, "mpi")
    with pytest.raises(ValueError, match=r"TRACESTORY_ALLREDUCE: expected one of auto, nccl, found 'mpi'"):
        allreduce.mode()
