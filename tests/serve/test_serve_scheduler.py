"""The paged KV cache bookkeeping and the continuous-batching scheduler (pure logic, no torch).

Expected values are hand-worked scenarios (written out step by step below) or invariants
checked from the public views (block tables, free list, plans) against the test's own records.
"""

from __future__ import annotations

import itertools
import math
import random
import zlib

import pytest

from tracestory.serve.kv_cache import BlockManager, KVCacheFull
from tracestory.serve.scheduler import RequestRejected, Scheduler, SchedulerConfig


# --------------------------------------------------------------------------- kv cache
def test_block_manager_allocates_in_order_and_by_ceil():
    kv = BlockManager(num_blocks=6, block_size=4)
    assert kv.append("a", 5) == [0, 1]          # ceil(5/4) = 2 blocks, fresh cache hands out 0, 1
    assert kv.append("a", 3) == []              # 8 tokens fit in the same 2 blocks
    assert kv.append("a", 1) == [2]             # the 9th token opens a third block
    assert kv.append("b", 4) == [3]
    assert (kv.free_count, kv.in_use, kv.num_tokens("a")) == (2, 4, 9)
    assert kv.blocks_needed("a", 3) == 0 and kv.blocks_needed("a", 4) == 1   # 12 slots in 3 blocks
    assert kv.tokens_fitting("a") == 3 + 2 * 4
    kv.check()


def test_block_manager_full_changes_nothing():
    kv = BlockManager(num_blocks=2, block_size=2)
    kv.append("a", 3)
    with pytest.raises(KVCacheFull, match="needs 2 blocks for 3 more tokens, found 0 free"):
        kv.append("b", 3)                        # needs 2, 0 free
    with pytest.raises(KVCacheFull):
        kv.append("a", 2)                        # 5 tokens need 3 blocks, 2 exist
    assert kv.block_table("a") == [0, 1] and not kv.has("b") and kv.num_tokens("a") == 3
    kv.check()


def test_freed_blocks_are_reused_first():
    kv = BlockManager(num_blocks=8, block_size=4)
    kv.append("a", 12)                           # blocks 0, 1, 2
    kv.append("b", 4)                            # block 3
    assert kv.free("a") == 3 and kv.free("a") == 0
    # LIFO free list: the blocks "a" returned come back first, its first block first
    assert kv.append("c", 12) == [0, 1, 2]
    assert kv.append("d", 4) == [4]
    assert (kv.allocated_total, kv.freed_total) == (8, 3)
    kv.check()


# --------------------------------------------------------------------------- hand-worked scenarios
def _run(s: Scheduler, tokens=lambda rid, k: 7):
    """One iteration: plan, fake model (token k of request rid), complete."""
    plan = s.schedule()
    out = s.complete(plan, {m.request_id: tokens(m.request_id, len(s.output_of(m.request_id)))
                            for m in plan.members if m.samples})
    return plan, out


def test_chunked_prefill_under_token_budget():
    # block 4, budget 8: a 10-token prompt is prefilled as 8 + 2, then decodes one token a step
    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=8, max_batch_tokens=8, max_num_seqs=4))
    s.add_request("A", list(range(10)), max_new_tokens=3)
    p0, r0 = _run(s)
    assert [(m.phase, m.start, m.tokens, m.chunked, m.samples) for m in p0.members] == [("prefill", 0, 8, True, False)]
    assert [(d.action, d.reason) for d in p0.decisions] == [
        ("admit", "8 blocks free >= 2 needed"), ("chunk", "prompt 10 > token budget left 8")]
    assert p0.blocks_allocated == 2 and r0.new_tokens == () and r0.kv_in_use == 2
    p1, r1 = _run(s)
    assert [(m.phase, m.start, m.tokens, m.chunked, m.samples) for m in p1.members] == [("prefill", 8, 2, False, True)]
    assert p1.blocks_allocated == 1 and r1.first_tokens == ("A",)          # 10 tokens: ceil(10/4) = 3 blocks
    p2, _ = _run(s)
    p3, r3 = _run(s)
    assert [(m.phase, m.start, m.tokens, m.context) for m in p2.members + p3.members] == [
        ("decode", 10, 1, 11), ("decode", 11, 1, 12)]
    assert [f.reason for f in r3.finished] == ["length"] and r3.finished[0].output_tokens == 3
    assert [(d.action, d.reason) for d in r3.decisions] == [("finish", "length: 3 of max 3 new tokens; 3 blocks freed")]
    assert r3.blocks_freed == 3 and r3.kv_in_use == 0 and not s.has_work


def test_preemption_by_hand():
    # 3 blocks of 2 tokens. A and B: prompt 2, 4 new tokens (each needs 2 + 4 - 1 = 5 slots).
    s = Scheduler(SchedulerConfig(block_size=2, num_blocks=3, max_batch_tokens=8, max_num_seqs=4))
    s.add_request("A", [1, 2], 4)
    s.add_request("B", [3, 4], 4)
    p, _ = _run(s)                                 # iter 0: both admitted, one block each
    assert [(d.request_id, d.action, d.reason) for d in p.decisions] == [
        ("A", "admit", "3 blocks free >= 1 needed"), ("B", "admit", "2 blocks free >= 1 needed")]
    p, _ = _run(s)                                 # iter 1: A's decode takes the last block; B has none
    assert [(m.request_id, m.phase) for m in p.members] == [("A", "decode")]
    assert [(d.request_id, d.action) for d in p.decisions] == [("B", "preempt"), ("B", "wait")]
    assert p.decisions[1].reason == "needs 2 blocks, 1 free"          # B re-prefills 2 + 1 tokens
    assert (p.blocks_allocated, p.blocks_freed) == (1, 1)
    p, _ = _run(s)                                 # iter 2: A decodes into its second block's free slot
    assert p.blocks_allocated == 0 and [d.reason for d in p.decisions] == ["needs 2 blocks, 1 free"]
    p, r = _run(s)                                 # iter 3: A takes block 3 and finishes
    assert [d.reason for d in p.decisions] == ["needs 2 blocks, 0 free"]
    assert [(f.request_id, f.reason, f.output_tokens) for f in r.finished] == [("A", "length", 4)]
    p, r = _run(s)                                 # iter 4: B readmitted, recomputes prompt + 1 output
    assert [(d.action, d.reason) for d in p.decisions] == [
        ("admit", "3 blocks free >= 2 needed (recompute 3 tokens after preemption)")]
    assert [(m.phase, m.start, m.tokens, m.token_ids, m.samples) for m in p.members] == [
        ("prefill", 0, 3, (3, 4, 7), True)]
    assert r.first_tokens == ()                    # B's first token was already sent before preemption
    _run(s)
    _, r = _run(s)
    assert [(f.request_id, f.output_tokens) for f in r.finished] == [("B", 4)] and not s.has_work


def test_admission_waits_for_max_num_seqs_and_budget():
    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=64, max_batch_tokens=6, max_num_seqs=2))
    for rid in "ABC":
        s.add_request(rid, [1, 2], 5)
    p, _ = _run(s)
    assert [(d.request_id, d.action) for d in p.decisions] == [("A", "admit"), ("B", "admit"), ("C", "wait")]
    assert p.decisions[-1].reason == "max_num_seqs 2 requests running"
    s2 = Scheduler(SchedulerConfig(block_size=4, num_blocks=64, max_batch_tokens=4, max_num_seqs=8))
    s2.add_request("A", [1, 2, 3, 4], 5)
    s2.add_request("B", [1], 5)
    p, _ = _run(s2)
    assert [(d.request_id, d.action, d.reason) for d in p.decisions] == [
        ("A", "admit", "64 blocks free >= 1 needed"), ("B", "wait", "token budget of 4 used by running requests")]


def test_eos_stops_unless_ignored():
    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=16, max_batch_tokens=16, max_num_seqs=4, eos_token_id=0))
    s.add_request("A", [5, 6], 10)
    s.add_request("B", [5, 6], 4, ignore_eos=True)
    outs = {}
    while s.has_work:
        _, r = _run(s, tokens=lambda rid, k: 0 if k == 2 else 9)   # the third token is EOS
        outs.update({f.request_id: (f.reason, f.output_tokens) for f in r.finished})
    assert outs == {"A": ("stop", 3), "B": ("length", 4)}


def test_requests_that_can_never_run_are_rejected():
    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=4, max_batch_tokens=8, max_num_seqs=4))
    s.add_request("ok", list(range(10)), 7)          # 10 + 7 - 1 = 16 slots = the whole cache
    with pytest.raises(RequestRejected, match="needs 17 KV slots, the cache holds 16"):
        s.add_request("big", list(range(10)), 8)
    with pytest.raises(RequestRejected, match="at least 1 token"):
        s.add_request("empty", [], 4)
    with pytest.raises(RequestRejected, match="already queued"):
        s.add_request("ok", [1], 1)
    fin = s.abort("ok")
    assert (fin.reason, fin.prompt_tokens, fin.output_tokens) == ("cancelled", 10, 0) and not s.has_work


# --------------------------------------------------------------------------- randomized invariants
def _fake_token(rid: str, k: int) -> int:
    return zlib.crc32(f"{rid}:{k}".encode()) % 1000


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_randomized_workload_invariants(seed):
    bs, nb, budget, max_seqs = 4, 24, 32, 6
    s = Scheduler(SchedulerConfig(block_size=bs, num_blocks=nb, max_batch_tokens=budget, max_num_seqs=max_seqs))
    rng = random.Random(seed)
    reqs = {f"r{i}": (rng.randint(1, 40), rng.randint(1, 20)) for i in range(60)}   # prompt, max_new
    pending = list(reqs)
    emitted = {rid: [] for rid in reqs}            # tokens seen in StepResult.new_tokens
    steps = {rid: [] for rid in reqs}              # members since the request's last (re)admission
    never_preempted = set(reqs)
    finished, last_owner, reuses, chunks = {}, {}, 0, 0
    for it in range(5000):
        for _ in range(rng.choice((0, 0, 1, 2))):
            if pending:
                rid = pending.pop(0)
                s.add_request(rid, [rng.randrange(1000) for _ in range(reqs[rid][0])], reqs[rid][1])
        if not s.has_work:
            if not pending:
                break
            continue
        plan = s.schedule()
        # token budget, sequence cap, one entry per request
        assert 0 < plan.num_tokens <= budget
        assert len(plan.members) <= max_seqs and s.num_running <= max_seqs
        assert len({m.request_id for m in plan.members}) == len(plan.members)
        for d in plan.decisions:
            if d.action == "preempt":
                never_preempted.discard(d.request_id)
                steps[d.request_id] = []
            chunks += d.action == "chunk"
        # blocks: the tables of every unfinished request and the free list partition all blocks
        live = [rid for rid in reqs if rid not in finished and s.kv.has(rid)]
        owned = [b for rid in live for b in s.kv.block_table(rid)]
        assert sorted(owned + s.kv.free_block_ids()) == list(range(nb))
        for m in plan.members:
            assert len(m.block_table) == math.ceil(m.context / bs)
            assert m.tokens == 1 if m.phase == "decode" else m.tokens >= 1
            for b in m.block_table:
                if last_owner.get(b, m.request_id) != m.request_id:
                    reuses += 1                  # a block another request held earlier
                last_owner[b] = m.request_id
            steps[m.request_id].append(m)
        sampled = {m.request_id: _fake_token(m.request_id, len(emitted[m.request_id]))
                   for m in plan.members if m.samples}
        res = s.complete(plan, sampled)
        for rid, tok in res.new_tokens:
            emitted[rid].append(tok)
        for f in res.finished:
            finished[f.request_id] = f
    else:
        pytest.fail("the workload did not drain in 5000 iterations")
    # every request finished, with all its tokens, in order
    assert set(finished) == set(reqs)
    for rid, (prompt, max_new) in reqs.items():
        f = finished[rid]
        assert (f.reason, f.prompt_tokens, f.output_tokens) == ("length", prompt, max_new)
        assert emitted[rid] == [_fake_token(rid, k) for k in range(max_new)]
        st = steps[rid]
        # contiguous steps from position 0 since the last admission, ending at prompt + max_new - 1
        assert st[0].start == 0 and all(a.context == b.start for a, b in itertools.pairwise(st))
        assert st[-1].context == prompt + max_new - 1
        if rid in never_preempted:
            assert sum(m.tokens for m in st if m.phase == "prefill") == prompt       # chunks sum to the prompt
            assert sum(m.phase == "decode" for m in st) == max_new - 1
    # this workload overfills the cache: preemption happened and every preempted request recovered
    assert len(never_preempted) < len(reqs)
    assert chunks > 0 and reuses > 0
    assert s.kv.free_count == nb and s.kv.freed_total == s.kv.allocated_total
    s.kv.check()


def _finish_iterations(fair: int | None) -> tuple[dict[str, int], dict[str, int], list, Scheduler]:
    """A long request A (prompt 4, 13 new tokens: 16 KV slots = the whole 4 x 4-token cache) and a
    short one S (prompt 4, 2 new) arriving before iteration 10, when A holds every block."""
    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=4, max_batch_tokens=16, max_num_seqs=4,
                                  fair_wait_iterations=fair))
    s.add_request("A", [1, 2, 3, 4], 13, ignore_eos=True)
    done, outputs, decisions = {}, {}, []
    for _ in range(60):
        if s.iteration == 10:
            s.add_request("S", [5, 6, 7, 8], 2, ignore_eos=True)
        if not s.has_work:
            break
        plan = s.schedule()
        decisions += plan.decisions
        r = s.complete(plan, {m.request_id: 9 for m in plan.members if m.samples})
        for f in r.finished:
            done[f.request_id], outputs[f.request_id] = plan.iteration, f.output_tokens
    return done, outputs, decisions, s


def test_fairness_lets_a_short_request_past_a_long_stream():
    # FCFS: A samples its k-th token in iteration k-1, so its 13th in iteration 12, and only then
    # frees its 4 blocks; S is prefilled in 13 and decodes its 2nd token in 14
    done, outputs, decisions, s = _finish_iterations(None)
    assert done == {"A": 12, "S": 14} and outputs == {"A": 13, "S": 2}
    assert not any(d.action == "preempt" for d in decisions)
    # fair_wait_iterations 1: S waited iterations 10 and 11; in 11 A (running since 0) is
    # preempted and requeued behind S: S is prefilled in 11 and decodes its 2nd token in 12
    done, outputs, decisions, s = _finish_iterations(1)
    assert done["S"] == 12 and outputs == {"A": 13, "S": 2}
    fair = [d for d in decisions if d.action == "preempt" and d.reason.startswith("fairness:")]
    assert [d.request_id for d in fair] == ["A"] and "S waited 1 iterations" in fair[0].reason
    assert s.kv.in_use == 0 and not s.has_work


def test_fairness_setting_is_checked():
    with pytest.raises(ValueError, match="fair_wait_iterations"):
        SchedulerConfig(fair_wait_iterations=0)
