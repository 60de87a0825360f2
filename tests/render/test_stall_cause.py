"""Stalls with the event log's GC and GPU time: a hand-written log whose sentences are written
down here from the numbers put in (not computed by the code under test), the same log without
those keys (an older engine's) telling no cause, and the fixtures of older runs untouched.

The log: eight decode iterations tiling [0, 223 ms]; 4 ms each except iteration 3 (60 ms),
5 (80 ms) and 6 (55 ms). Median 4 ms (sorted: 4 4 4 4 4 55 60 80); the stall limit is
max(10 x 4 ms, 50 ms) = 50 ms, so all three are stalls: 15x, 20x and 14x (13.75) the median.
Iteration 3 starts at 12 ms (T=0.01 s), 5 at 76 ms (T=0.08 s), 6 at 156 ms (T=0.16 s)."""

from __future__ import annotations

import gzip
import json

from tracestory.analysis.batching import analyze_batching, read_scheduler_log
from tracestory.render.batch_story import batch_json, render_batch_story

MS = 1_000_000
DUR = [4, 4, 4, 60, 4, 80, 55, 4]
# iteration -> (gc_ns, gc_passes, gc_generation or None, gpu_ns or None)
GC_GPU = {3: (50 * MS, 1, 2, 3_100_000), 5: (0, 0, None, 78 * MS), 6: (1_500_000, 2, 1, None)}

EXPECTED = [
    "- Iteration 3 at T=0.01 s: 60.0 ms (15x the median) — GPU 3.10 ms of 60.0 ms; Python GC held the process "
    "50.0 ms (a full collection); 0 requests arrived during it",
    "- Iteration 5 at T=0.08 s: 80.0 ms (20x the median) — GPU 78.0 ms of 80.0 ms; no Python GC ran in it; "
    "0 requests arrived during it",
    "- Iteration 6 at T=0.16 s: 55.0 ms (14x the median) — Python GC held the process 1.50 ms "
    "(2 collections, up to generation 1); 0 requests arrived during it",
]
OLD = [
    "- Iteration 3 at T=0.01 s: 60.0 ms (15x the median); 0 requests arrived during it",
    "- Iteration 5 at T=0.08 s: 80.0 ms (20x the median); 0 requests arrived during it",
    "- Iteration 6 at T=0.16 s: 55.0 ms (14x the median); 0 requests arrived during it",
]


def _write(path, with_keys: bool):
    lines = [
        {"type": "meta", "version": 1, "engine": "hand", "block_size": 16, "num_blocks": 64},
        {"type": "arrival", "t_ns": 0, "request_id": "r1", "prompt_tokens": 8, "max_new_tokens": 8},
    ]
    t = 0
    for i, d in enumerate(DUR):
        it = {
            "type": "iteration",
            "iter": i,
            "t_start_ns": t,
            "t_end_ns": t + d * MS,
            "members": [{"request_id": "r1", "phase": "decode", "tokens": 1, "context": 9 + i}],
            "decisions": [],
            "kv": {"allocated": 0, "freed": 0, "in_use": 1, "total": 64},
        }
        if with_keys:
            gc_ns, passes, gen, gpu = GC_GPU.get(i, (0, 0, None, None))
            it.update(gc_ns=gc_ns, gc_passes=passes)
            if gen is not None:
                it["gc_generation"] = gen
            if gpu is not None:
                it["gpu_ns"] = gpu
        lines.append(it)
        t += d * MS
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_stalls_carry_gc_and_gpu_time(tmp_path):
    r = analyze_batching(read_scheduler_log(_write(tmp_path / "new.sched.jsonl.gz", True)))
    assert [(s.iter, s.gc_ns, s.gc_passes, s.gc_generation, s.gpu_ns) for s in r.stalls] == [
        (3, 50 * MS, 1, 2, 3_100_000),
        (5, 0, 0, None, 78 * MS),
        (6, 1_500_000, 2, 1, None),
    ]
    text = render_batch_story(r)
    for line in EXPECTED:
        assert line in text.splitlines(), line
    j = batch_json(r)
    assert j["per_iteration"]["gc_ns"] == [0, 0, 0, 50 * MS, 0, 0, 1_500_000, 0]
    assert j["per_iteration"]["gpu_ns"] == [None, None, None, 3_100_000, None, 78 * MS, None, None]
    assert j["stalls"][0]["gc_generation"] == 2


def test_a_log_without_the_keys_tells_no_cause(tmp_path):
    r = analyze_batching(read_scheduler_log(_write(tmp_path / "old.sched.jsonl.gz", False)))
    assert [s.iter for s in r.stalls] == [3, 5, 6]
    assert all(s.gc_ns is None and s.gpu_ns is None for s in r.stalls)
    text = render_batch_story(r)
    for line in OLD:
        assert line in text.splitlines(), line
    assert "Python GC" not in text and "GPU " not in text
    j = batch_json(r)
    assert "gc_ns" not in j["per_iteration"] and "gpu_ns" not in j["per_iteration"]


def test_the_cpu_fixture_story_is_unchanged():
    """tests/data/tp_serve_cpu predates the keys: its stall line is main's, word for word (read
    from main's report before this change)."""
    from conftest import TEST_DATA

    log = TEST_DATA / "tp_serve_cpu" / "torch" / "serve.sched.jsonl"
    text = render_batch_story(analyze_batching(read_scheduler_log(log)))
    assert (
        "- Iteration 5 at T=0.05 s: 1.05 s (106x the median); 5 requests arrived during it; their TTFT p50 257 ms"
    ) in text.splitlines()
