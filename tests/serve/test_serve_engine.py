"""FlexAttention over the paged cache, decode buckets, and the overlapped engine, on the CPU.

Second sources: the SDPA gather path (checked against a contiguous reference in
test_serve_server.py) for the tokens of the FlexAttention paths; a plain loop over the
scheduler (which applies max_new_tokens and EOS itself, one iteration at a time) for the
engine that hands tokens out one iteration later; hand-written arrays for the bucket packing."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch

from tracestory.models.llama_config import LlamaConfig
from tracestory.serve import graphs, mixed
from tracestory.serve.engine import Engine
from tracestory.serve.eventlog import EventLog
from tracestory.serve.model import PagedLlama
from tracestory.serve.scheduler import Member, Scheduler, SchedulerConfig

CFG = LlamaConfig.from_name("tiny")
BS, NB, BUDGET, SEQS = 4, 8, 12, 4


def _requests(n=6, seed=0):
    rng = random.Random(seed)
    return [(f"r{i}", [rng.randrange(512) for _ in range(rng.randrange(2, 22))], rng.randrange(2, 9), i % 3 == 0)
            for i in range(n)]


def _model(attention="sdpa", static_decode=False):
    m = PagedLlama(CFG, layers=1, num_blocks=NB, block_size=BS, dtype=torch.float64, seed=1, attention=attention)
    if static_decode:                 # the CUDA graphs' body and buckets, run eagerly
        m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET)
        m._graphs = graphs.DecodeGraphs(m, graphs.decode_buckets(SEQS), 4, use_graphs=False)
        m._graphs.build(lambda _line: None)
        # the start-up warm-up of mixed iterations' decode call writes K/V into free blocks:
        # the tokens below must not change
        lines = []
        m._warm_mixed_decode(lines.append)
        assert lines and "[1, 2, 4]" in lines[0]
    return m


def _scheduler(eos=None):
    return Scheduler(SchedulerConfig(block_size=BS, num_blocks=NB, max_batch_tokens=BUDGET, max_num_seqs=SEQS,
                                     eos_token_id=eos))


def _reference(model, eos=None):
    """The plain loop: schedule, step, complete; the scheduler decides every finish."""
    s = _scheduler(eos)
    for rid, prompt, n, ignore in _requests():
        s.add_request(rid, prompt, n, ignore_eos=ignore)
    out, fins, preempt, paths = {}, {}, 0, []
    while s.has_work:
        p = s.schedule()
        preempt += sum(d.action == "preempt" for d in p.decisions)
        launch = model.launch(p.members, p.iteration)
        paths.append(launch.path)
        r = s.complete(p, launch.result())
        for rid, tok in r.new_tokens:
            out.setdefault(rid, []).append(tok)
        fins.update({f.request_id: (f.reason, f.output_tokens) for f in r.finished})
    return out, fins, preempt, paths


@pytest.fixture(scope="module")
def sdpa_run():
    return _reference(_model("sdpa"))


def test_flex_gives_the_tokens_of_sdpa_over_continuous_batching(sdpa_run):
    out, fins, preempt, _ = sdpa_run
    assert preempt >= 1                                       # the small cache forces a recompute
    assert {f[0] for f in fins.values()} == {"length"} and len(fins) == 6
    flex_out, _, _, _ = _reference(_model("flex"))
    assert flex_out == out
    static_out, _, _, static_paths = _reference(_model("flex", static_decode=True))
    assert "static" in static_paths and "eager" in static_paths     # decode buckets and mixed iterations
    assert static_out == out


def _mixed_model(width=6):
    """Decode buckets and prefill/mixed buckets, both as their graphs' bodies run eagerly."""
    m = _model("flex", static_decode=True)
    m.prepare(max_num_seqs=SEQS, max_batch_tokens=16)       # row buffers for the 16-row chunk bucket
    m._graphs = graphs.DecodeGraphs(m, graphs.decode_buckets(SEQS), 4, use_graphs=False)
    m._graphs.build(lambda _line: None)
    m._mixed = mixed.MixedGraphs(m, graphs.decode_buckets(SEQS), [8, 16], width, SEQS, use_graphs=False)
    m._mixed.build(lambda _line: None)
    return m


def test_prefill_and_mixed_buckets_give_the_tokens_of_sdpa(sdpa_run):
    out, fins, _, _ = sdpa_run
    got, got_fins, _, paths = _reference(_mixed_model())
    # prefill-only and mixed iterations through the static buckets, decode through its buckets, and
    # the members whose block tables exceed the width (6 blocks) eagerly
    assert {"mixed-static", "static", "eager"} <= set(paths)
    assert got == out and got_fins == fins


def test_fresh_prompts_give_the_tokens_of_sdpa(sdpa_run, monkeypatch):
    """Iterations whose chunks are all fresh prompts through :mod:`tracestory.serve.fresh_attention`
    (on the CPU its masked-SDPA reference; on CUDA the flash call, tests/gpu), in the eager
    FlexAttention path and in the fresh prefill/mixed buckets' bodies: the SDPA path's tokens."""
    from tracestory.serve import fresh_attention

    calls = []
    real = fresh_attention.attend
    monkeypatch.setattr(fresh_attention, "attend", lambda *a: calls.append(a[-1]) or real(*a))
    out, fins, _, _ = sdpa_run
    m = _model("flex")
    m._fresh = True
    got, got_fins, _, _ = _reference(m)
    assert calls and got == out and got_fins == fins
    calls.clear()
    mm = _mixed_model()
    mm._fresh = True
    mm._mixed = mixed.MixedGraphs(mm, graphs.decode_buckets(SEQS), [8, 16], 6, SEQS, use_graphs=False)
    mm._mixed.build(lambda _line: None)
    assert mm._mixed.fresh and (0, 8, True) in mm._mixed.keys() and len(mm._mixed.keys()) == 2 * 4 * 2
    got, got_fins, _, paths = _reference(mm)
    assert mm._mixed.fresh_runs >= 1 and "mixed-static" in paths
    assert set(calls) & {8, 16}                     # bucket rows: the fresh buckets' calls
    assert got == out and got_fins == fins


def test_chunk_buckets():
    # by hand: steps of one 128-row tile up to 1024, then a quarter of the bucket rounded down
    # to whole tiles (1024/4 = 256, 1280/4 = 320 -> 256, 1536/4 = 384), the last one the budget
    assert mixed.chunk_buckets(2048) == [128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1920, 2048]
    assert mixed.chunk_buckets(256) == [128, 256]
    assert mixed.chunk_buckets(100) == [128]
    assert mixed.chunk_buckets(640) == [128, 256, 384, 512, 640]
    # 1920 + 1920/4 (480 -> 384) = 2304, 2304 + 512 = 2816; 3000 rounds up to 3072
    assert mixed.chunk_buckets(3000) == [128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1920, 2304, 2816, 3072]
    for budget in (300, 2048, 5000, 8192):   # a fifth of a bucket at most is padding, whole tiles
        b = mixed.chunk_buckets(budget)
        assert all(r % 128 == 0 for r in b) and b == sorted(set(b))
        assert all(hi - lo <= max(128, lo // 4) for lo, hi in zip(b, b[1:]))
    with pytest.raises(ValueError):
        mixed.chunk_buckets(0)


def test_mixed_packing_by_hand():
    m = _mixed_model()
    g = m._mixed
    # a decode member (position 5, blocks [3, 7]) then a prefill chunk of 3 tokens at 0..2 in block [2]
    members = [Member("a", "decode", 5, (11,), (3, 7), False, True),
               Member("b", "prefill", 0, (21, 22, 23), (2,), False, True)]
    # 1 decode row, 3 chunk rows -> the 8-row bucket; not a fresh bucket: those are off on the CPU
    assert g.key(members) == (1, 8, False)
    h64 = torch.zeros(g._n64, dtype=torch.long)
    h32 = torch.zeros(g._n32, dtype=torch.int32)
    g.pack(members, [11, 21, 22, 23], (1, 8, False), h64, h32)
    a, b = h64.numpy(), h32.numpy()
    o, o32 = g._o64, g._o32
    N, scratch = 1 + 8, NB * BS                     # scratch block = block NB, slot NB * BS = 32
    np.testing.assert_array_equal(a[o["tok"][0]:o["tok"][0] + N], [11, 21, 22, 23, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(a[o["pos"][0]:o["pos"][0] + N], [5, 0, 1, 2, 0, 0, 0, 0, 0])
    # position 5 of a: block 7 (index 1), offset 1 -> 29; b's positions 0..2 in block 2 -> 8, 9, 10
    np.testing.assert_array_equal(a[o["slot"][0]:o["slot"][0] + N], [29, 8, 9, 10] + [scratch] * 5)
    tabs = a[o["mtab"][0]:o["mtab"][0] + SEQS * 6].reshape(SEQS, 6)
    np.testing.assert_array_equal(tabs[:2], [[3, 7, NB, NB, NB, NB], [2, NB, NB, NB, NB, NB]])
    assert (tabs[2:] == NB).all()
    # sampled rows: a's only row (0) and b's last (decode rows 1 + chunk row 2 = 3)
    np.testing.assert_array_equal(a[o["srow"][0]:o["srow"][0] + SEQS], [0, 3, 0, 0])
    np.testing.assert_array_equal(b[o32["dnblk"][0]:o32["dnblk"][0] + 1], [2])     # context 6 -> 2 blocks
    np.testing.assert_array_equal(b[o32["rown"][0]:o32["rown"][0] + 8], [1, 1, 1, -2, -2, -2, -2, -2])
    assert b[o32["kvn"][0]] == 1 and b[o32["kvi"][0]] == 2        # the chunk's one tile reads block 2
    # decode-only iterations are the decode graphs' job; a table wider than 6 blocks runs eagerly
    assert g.key(members[:1]) is None
    assert g.key([Member("c", "prefill", 0, (1, 2), tuple(range(7)), False, True)]) is None


def test_decode_buckets_and_padding():
    assert graphs.decode_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert graphs.decode_buckets(6) == [1, 2, 4, 6]
    assert graphs.decode_buckets(1) == [1]
    assert [graphs.bucket_for(n, [1, 2, 4, 6]) for n in (1, 3, 5, 6, 7)] == [1, 4, 6, 6, None]
    assert graphs.pad_rows([5, 6, 7], 4) == [5, 6, 7, 5]
    with pytest.raises(ValueError):
        graphs.pad_rows([], 4)


def test_bucket_packing_repeats_row_zero():
    m = _model("flex")
    m.prepare(max_num_seqs=4, max_batch_tokens=8)
    g = graphs.DecodeGraphs(m, [1, 2, 4], 3, use_graphs=False)
    # two decode members: context 6 (position 5, block table [3, 7]) and 1 (position 0, [2])
    members = [Member("a", "decode", 5, (11,), (3, 7), False, True),
               Member("b", "decode", 0, (-1,), (2,), False, True)]
    host = torch.zeros(g._n, dtype=torch.long)
    assert g.pack(members, [11, -1], host) == 2
    a = host.numpy()
    B, W = 4, 3
    # slot of position 5 = block 7 (index 5 // 4 = 1), offset 1 -> 29; position 0 of b -> 2*4 = 8
    np.testing.assert_array_equal(a[0:2], [11, -1])          # ids (b's from the previous launch, row 0)
    np.testing.assert_array_equal(a[B:B + 2], [5, 0])        # positions
    np.testing.assert_array_equal(a[2 * B:2 * B + 2], [29, 8])
    np.testing.assert_array_equal(a[3 * B:3 * B + 2], [2, 1])  # blocks of the context
    np.testing.assert_array_equal(a[5 * B:].reshape(B, W)[:2], [[3, 7, NB], [2, NB, NB]])
    assert g.pack(members[:1] + members[1:] + [members[0]], [11, -1, 11], host) == 4
    np.testing.assert_array_equal(a[0:4], [11, -1, 11, 11])   # the padding row repeats row 0
    np.testing.assert_array_equal(a[4 * B:4 * B + 4], [0, 1, 2, 0])   # member ids; padding: row 0's


class _Recording(PagedLlama):
    """Records whether any launch took an input id from the previous launch's device rows."""

    from_device = 0

    def launch(self, members, iteration=None, token_ids=None):
        if token_ids is not None and any(t < 0 for t in token_ids):
            self.from_device += 1
        return super().launch(members, iteration, token_ids)


def _engine_run(eos, overlap):
    model = _Recording(CFG, layers=1, num_blocks=NB, block_size=BS, dtype=torch.float64, seed=1)
    e = Engine(_scheduler(eos), model, EventLog(None, {}), overlap=overlap)
    out, fins, done = {}, {}, threading.Event()

    def sink_for(rid):
        def sink(kind, payload):
            if kind == "token":
                out.setdefault(rid, []).append(payload)
            else:
                fins[rid] = (payload.reason, payload.output_tokens)
                if len(fins) == 6:
                    done.set()
        return sink

    for rid, prompt, n, ignore in _requests():      # queued before start: the same arrival order
        e.submit(rid, prompt, n, ignore, sink_for(rid))
    e.start()
    try:
        assert done.wait(60)
    finally:
        e.stop()
    return out, fins, model.from_device


def test_tokens_handed_out_one_iteration_later_end_requests_as_the_scheduler_does(sdpa_run):
    ref_out, ref_fins, _, _ = sdpa_run
    # exact lengths: each request ends at its max_new_tokens
    assert {rid: f for rid, f in ref_fins.items()} == {rid: ("length", n) for rid, _, n, _ in _requests()}
    for overlap in (True, False):
        out, fins, from_device = _engine_run(None, overlap)
        assert (out, fins) == (ref_out, ref_fins)
        assert (from_device > 0) == overlap
    # EOS: an id that request r1 (which does not ignore EOS) samples as its 2nd token
    eos = ref_out["r1"][1]
    ref_eos = _reference(_model("sdpa"), eos)
    assert ref_eos[1]["r1"] == ("stop", 2)
    for overlap in (True, False):
        out, fins, _ = _engine_run(eos, overlap)
        assert (out, fins) == ref_eos[:2]


def test_shape_defaults_per_device_and_flag_checks():
    from tracestory.cli import main
    from tracestory.serve import ServeOptions, resolve_shape

    assert resolve_shape(ServeOptions(), "cpu") == ("tiny", 2, "sdpa")
    assert resolve_shape(ServeOptions(), "cuda") == ("llama-3-8b", 32, "flex")
    assert resolve_shape(ServeOptions(preset="tiny"), "cuda:1") == ("tiny", 2, "flex")
    assert resolve_shape(ServeOptions(layers=4, attention_backend="sdpa"), "cuda") == ("llama-3-8b", 4, "sdpa")
    for argv in (["serve", "--max-model-len", "0"], ["serve", "--layers", "0"]):
        assert main(argv) == 2
    with pytest.raises(SystemExit) as e:
        main(["serve", "--attention-backend", "matmul"])
    assert e.value.code == 2


def test_the_engine_writes_the_stacks_of_its_slow_host_steps(tmp_path, monkeypatch, sdpa_run):
    """TRACESTORY_STALL_STACKS_MS at 0.001 ms: every launch and hand-out outlasts it, so each one
    the watcher (which polls) catches is named in the file under the engine thread's stack; the
    tokens are those of the plain run."""
    from tracestory.serve import stackwatch

    monkeypatch.setenv(stackwatch.ENV, "0.001")
    monkeypatch.setenv(stackwatch.DIR_ENV, str(tmp_path))
    ref_out, ref_fins, _, _ = sdpa_run
    out, fins, _ = _engine_run(None, True)
    assert (out, fins) == (ref_out, ref_fins)
    text = (tmp_path / "stall_stacks.rank0.txt").read_text()
    steps = [line for line in text.splitlines() if line.startswith("^ ")]
    assert steps and all(line.startswith(("^ schedule and launch of the next iteration: ", "^ hand-out of iteration "))
                         for line in steps)
    assert text.count("Thread tracestory-engine (the watched step):") == len(steps) and "engine.py" in text
