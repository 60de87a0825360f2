"""The batch story: a hand-written scheduler log whose expected numbers are worked out by hand
here, a hand-built trace for the iteration join, bad input with file:line errors, and a log
recorded by running the reference server (checked against plain JSON sums of the file)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import H200_LLAMA

from tracestory.analysis.batching import (
    analyze_batching,
    is_scheduler_log,
    read_scheduler_log,
)
from tracestory.errors import TraceFormatError, TracestoryError
from tracestory.render.batch_story import batch_json, render_batch_story

A, BP, BD = 1_000_000, 10_000, 100_000     # the log's iteration times follow a + bp*P + bd*D exactly
T0 = 10_000


def P(rid, n, chunked=False):
    return {"request_id": rid, "phase": "prefill", "tokens": n, "context": n, "chunked": chunked}


def D(rid):
    return {"request_id": rid, "phase": "decode", "tokens": 1, "context": 100}


# (members, decisions, kv allocated, kv freed, kv in use, memory allocated bytes or None)
ITERS = [
    ([P("r1", 256, True)], [("r1", "admit", "64 blocks free >= 16 needed"),
                            ("r1", "chunk", "prompt 300 > token budget left 256")], 16, 0, 16, 4 << 30),
    ([P("r1", 44), P("r2", 100)], [("r2", "admit", "48 blocks free >= 7 needed")], 10, 0, 26, 5 << 30),
    ([D("r1"), D("r2")], [("r4", "wait", "needs 40 blocks, 12 free")], 0, 0, 26, None),
    ([D("r1"), D("r2"), P("r3", 64)], [("r3", "admit", "38 blocks free >= 4 needed")], 4, 0, 30, 6 << 30),
    ([D("r1"), D("r2"), D("r3")], [], 0, 0, 30, None),
    ([D("r1"), D("r2"), D("r3")], [], 0, 0, 30, None),
    ([D("r1"), D("r2"), D("r3")], [], 1, 0, 31, None),
    ([D("r1"), D("r2"), D("r3")], [("r4", "wait", "needs 40 blocks, 33 free")], 0, 0, 31, None),
    ([D("r1"), D("r2"), D("r3")], [], 0, 0, 31, None),
    ([D("r1"), D("r2")], [("r3", "preempt", "KV cache full; youngest request")], 0, 4, 27, None),
    ([D("r1"), D("r2")], [("r2", "finish", "length: 3 of max 3 new tokens; 7 blocks freed")], 0, 7, 20, None),
    ([D("r1")], [("r1", "finish", "length: 12 of max 12 new tokens; 20 blocks freed")], 0, 20, 0, 1 << 30),
    ([P("r3", 70)], [("r3", "admit", "64 blocks free >= 5 needed"), ("r3", "finish", "cancelled")], 5, 5, 0, None),
]


def durations():
    out = []
    for members, *_ in ITERS:
        p = sum(m["tokens"] for m in members if m["phase"] == "prefill")
        d = sum(1 for m in members if m["phase"] == "decode")
        out.append(A + BP * p + BD * d)
    return out


def ends():
    return list(T0 + np.cumsum(durations()))


def write_log(path):
    e = ends()
    starts = [T0] + e[:-1]
    lines = [{"type": "meta", "version": 1, "engine": "hand", "model": "llama tiny", "device": "cpu",
              "block_size": 16, "num_blocks": 64, "max_batch_tokens": 256, "max_num_seqs": 4, "t0_unix_ns": 1},
             {"type": "arrival", "t_ns": 0, "request_id": "r1", "prompt_tokens": 300, "max_new_tokens": 12},
             {"type": "arrival", "t_ns": 5_000, "request_id": "r2", "prompt_tokens": 100, "max_new_tokens": 3},
             {"type": "arrival", "t_ns": 2_000_000, "request_id": "r3", "prompt_tokens": 64, "max_new_tokens": 9}]
    for k, (members, decisions, alloc, freed, in_use, mem) in enumerate(ITERS):
        it = {"type": "iteration", "iter": k, "t_start_ns": int(starts[k]), "t_end_ns": int(e[k]), "members": members,
              "decisions": [{"request_id": r, "action": a, "reason": why} for r, a, why in decisions],
              "kv": {"allocated": alloc, "freed": freed, "in_use": in_use, "total": 64}, "future_key": [1, 2]}
        if mem is not None:
            it["memory"] = {"allocated_bytes": mem, "reserved_bytes": 8 << 30}
        lines.append(it)
    lines += [{"type": "first_token", "t_ns": int(e[1]), "request_id": "r1"},
              {"type": "first_token", "t_ns": int(e[1]), "request_id": "r2"},
              {"type": "first_token", "t_ns": int(e[3]), "request_id": "r3"},
              {"type": "finish", "t_ns": int(e[10]), "request_id": "r2", "reason": "length", "prompt_tokens": 100,
               "output_tokens": 3},
              {"type": "finish", "t_ns": int(e[11]), "request_id": "r1", "reason": "length", "output_tokens": 12},
              {"type": "finish", "t_ns": int(e[12]), "request_id": "r3", "reason": "cancelled", "error": "shutdown"},
              {"type": "something_new", "t_ns": 3}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def hand_log(tmp_path):
    return write_log(tmp_path / "sched.jsonl")


def test_hand_log_numbers(hand_log):
    r = analyze_batching(read_scheduler_log(hand_log))
    e = ends()
    assert len(r.log.iterations) == 13 and len(r.log.arrivals) == 3
    # exact data: the fit gives back a, bp, bd with R^2 = 1
    assert r.fit.a_ns == pytest.approx(A, rel=1e-9)
    assert r.fit.b_prefill_ns_per_token == pytest.approx(BP, rel=1e-9)
    assert r.fit.b_decode_ns_per_seq == pytest.approx(BD, rel=1e-9)
    assert r.fit.r_squared == pytest.approx(1.0) and r.fit.n == 13
    # kinds: 0, 1, 12 prefill-only; 3 mixed; the other 9 decode-only
    assert r.kinds == {"prefill-only": 3, "mixed": 1, "decode-only": 9}
    # KV: allocated 16+10+4+1+5, freed 4+7+20+5; peak 31, first reached at the end of iteration 6
    assert (r.kv_allocated_total, r.kv_freed_total, r.kv_peak_in_use, r.kv_peak_t_ns) == (36, 36, 31, e[6])
    assert [(p.iter, p.request_id) for p in r.preemptions] == [(9, "r3")]
    assert (r.chunked_requests, r.chunks) == (1, 1)
    times = {q.request_id: q for q in r.requests}
    assert times["r1"].ttft_ns == e[1] - 0 and times["r1"].e2e_ns == e[11]
    assert times["r2"].ttft_ns == e[1] - 5_000 and times["r2"].e2e_ns == e[10] - 5_000
    assert times["r3"].ttft_ns == e[3] - 2_000_000 and times["r3"].finish_reason == "cancelled"
    assert r.finish_reasons == {"length": 2, "cancelled": 1}
    # TTFTs e1, e1-5000, e3-2e6 -> median is the middle one
    assert r.ttft.p50_ns == sorted([e[1], e[1] - 5_000, e[3] - 2_000_000])[1]


def test_story_text(hand_log):
    text = render_batch_story(analyze_batching(read_scheduler_log(hand_log)))
    assert "Iteration 0: Batch = {r1}" in text
    assert "├── Chunk: r1: prompt 300 > token budget left 256" in text
    # folded by hand from ITERS: iteration 0 (first) and 9 (preemption) are rows of their own; 1-8 have 2-3
    # sequences (3 <= 1.25 * 2 + 1) and 10-12 have 1-2: one row each. Row 1-8: prefill 44 + 100 + 64 = 208
    # tokens, admits r2 and r3, waits at 2 and 7, times 2.44 (it 1: 1 ms + 144 x 10 us), 1.20, 1.84 and five
    # 1.30 ms -> median 1.30 ms, max 2.44 ms; 31 blocks after iteration 8; it starts 3.56 ms after iteration 0
    assert "| 1-8 | 0.00 | 6 decode, 1 mixed, 1 prefill | 2-3 | 208 | 2 / 0 | 2 | 1.30 ms (2.44 ms) | 31 |  |" in text
    assert "| 9 | 0.02 | 1 decode | 2 | 0 | 0 / 0 | 0 | 1.20 ms | 27 | **preemption**: r3" in text
    assert "Iteration 4:" not in text and "Iteration 9: Batch = {r1, r2}" in text
    assert "Preempt: r3: KV cache full; youngest request" in text
    assert "- Preemptions: 1" in text and "- Peak in use: 31 of 64 (48.4%)" in text
    assert "iteration time = 1.00 ms + 10.0 us x prefill tokens + 100 us x decode seqs** (R² = 1.000)" in text
    assert "peak 6.00 GiB" in text
    fenced, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            fenced.append(line)
    assert fenced and max(len(x) for x in fenced) <= 100


def test_batch_json(hand_log):
    doc = batch_json(analyze_batching(read_scheduler_log(hand_log)))
    json.dumps(doc)
    assert doc["per_iteration"]["prefill_tokens"] == [256, 144, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 70]
    assert doc["per_iteration"]["decode_seqs"] == [0, 0, 2, 2, 3, 3, 3, 3, 3, 2, 2, 1, 0]
    assert doc["kv"] == {"allocated_total": 36, "freed_total": 36, "peak_in_use": 31, "peak_t_ns": ends()[6], "total": 64}
    assert doc["preemptions"] == [{"iter": 9, "t_ns": ends()[9], "request_id": "r3",
                                   "reason": "KV cache full; youngest request"}]


def test_fit_one_regressor_by_hand(tmp_path):
    # decode-only iterations: the prefill column is constant (0) and left out
    d, y = [1, 2, 3, 4], [1_000_000, 1_200_000, 1_100_000, 1_500_000]
    lines = [{"type": "meta", "version": 1}]
    t = 0
    for k, (n, dur) in enumerate(zip(d, y)):
        lines.append({"type": "iteration", "iter": k, "t_start_ns": t, "t_end_ns": t + dur,
                      "members": [D(f"r{j}") for j in range(n)]})
        t += dur
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    fit = analyze_batching(read_scheduler_log(tmp_path / "l.jsonl")).fit
    # simple regression by hand: mean d 2.5, mean y 1.2e6; Sxy = (-1.5)(-0.2e6) + (-0.5)(0) + 0.5(-0.1e6) + 1.5(0.3e6)
    sxy = 0.3e6 + 0 - 0.05e6 + 0.45e6
    sxx = 2.25 + 0.25 + 0.25 + 2.25
    b = sxy / sxx                                      # 140000
    a = 1.2e6 - b * 2.5                                # 850000
    res = [yy - (a + b * dd) for dd, yy in zip(d, y)]
    r2 = 1 - sum(x * x for x in res) / sum((yy - 1.2e6) ** 2 for yy in y)
    assert fit.b_prefill_ns_per_token is None
    assert (fit.a_ns, fit.b_decode_ns_per_seq, fit.r_squared) == pytest.approx((a, b, r2))


@pytest.mark.parametrize("body, line, expected", [
    ('{"type": "meta", "version": 1}\n{"type": "arrival", "t_ns": 1, "request_id": "a"}\n{nope\n', 3, "JSON"),
    ('{"type": "arrival", "t_ns": 1, "request_id": "a"}\n', 1, "meta"),
    ('{"type": "meta", "version": 1}\n\n{"type": "iteration", "iter": 1, "t_start_ns": 0}\n', 3, "t_end_ns"),
    (('{"type": "meta", "version": 1}\n{"type": "iteration", "iter": 1, "t_start_ns": 0, "t_end_ns": 5, '
      '"members": [{"request_id": "a", "phase": "warmup", "tokens": 1}]}\n'), 2, "phase"),
    ('{"type": "meta", "version": 1}\n[1, 2]\n', 2, "JSON object"),
])
def test_bad_lines_name_file_and_line(tmp_path, body, line, expected):
    p = tmp_path / "bad.jsonl"
    p.write_text(body)
    with pytest.raises(TraceFormatError) as err:
        read_scheduler_log(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}:{line}: expected") and expected in msg and "\n" not in msg
    assert isinstance(err.value, TracestoryError)   # the CLI turns it into one line and exit code 2


def test_sniff_rule(hand_log, tmp_path):
    gz = tmp_path / "sched.jsonl.gz"
    gz.write_bytes(gzip.compress(hand_log.read_bytes()))
    assert is_scheduler_log(hand_log) and is_scheduler_log(gz)
    assert len(read_scheduler_log(gz).iterations) == 13
    assert not is_scheduler_log(H200_LLAMA)            # a Kineto trace
    (tmp_path / "x.jsonl").write_text('{"type": "arrival", "t_ns": 1}\n')
    assert not is_scheduler_log(tmp_path / "x.jsonl")


# ------------------------------------------------------------------ the trace join


def hand_trace(side):
    from tracestory.trace import (
        CPU_SIDE,
        GPU_SIDE,
        StringPool,
        TraceMeta,
        build_trace,
        make_table,
    )

    pool = StringPool()
    it0, it1, gemm, attn, launch = (pool.code(s) for s in
                                    ("iteration 0", "iteration 1", "gemm", "attn_decode", "cudaLaunchKernel"))
    if side == "cpu":
        ranges = make_table("ranges", start_ns=[100, 300], end_ns=[200, 400], name=[it0, it1], side=[CPU_SIDE] * 2,
                            tid=[1, 1], pid=[9, 9])
    else:  # GPU-side annotation ranges cover the kernels themselves
        ranges = make_table("ranges", start_ns=[140, 345], end_ns=[265, 425], name=[it0, it1], side=[GPU_SIDE] * 2)
    api = make_table("api", start_ns=[110, 120, 310, 320, 500], end_ns=[115, 125, 315, 325, 505], name=[launch] * 5,
                     correlation=[1, 2, 3, 4, 5], tid=[1] * 5, pid=[9] * 5)
    kernels = make_table("kernels", start_ns=[150, 240, 350, 390, 600], end_ns=[250, 260, 380, 420, 700],
                         name=[gemm, gemm, attn, gemm, gemm], correlation=[1, 2, 3, 4, 5], device=[0] * 5,
                         stream=[7] * 5)
    return build_trace(TraceMeta("hand.json", "kineto"), pool, ranges=ranges, api=api, kernels=kernels)


@pytest.mark.parametrize("side", ["cpu", "gpu"])
def test_trace_join_by_iteration_number(tmp_path, side):
    lines = [{"type": "meta", "version": 1},
             {"type": "iteration", "iter": 0, "t_start_ns": 0, "t_end_ns": 10, "members": [P("a", 100)]},
             {"type": "iteration", "iter": 1, "t_start_ns": 10, "t_end_ns": 20, "members": [D("a")]}]
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    j = analyze_batching(read_scheduler_log(tmp_path / "l.jsonl"), hand_trace(side)).trace
    assert j.side == side and j.iterations == (0, 1)
    # iteration 0: gemm [150,250) and [240,260) -> union 110; iteration 1: [350,380) + [390,420) -> 60.
    # The kernel launched at 500 / starting at 600 is in no iteration.
    assert j.gpu_busy_ns == (110, 60)
    pre = {k.name: (k.total_ns, k.count) for k in j.top_kernels["prefill-heavy"]}
    dec = {k.name: (k.total_ns, k.count, k.fraction) for k in j.top_kernels["decode-only"]}
    assert pre == {"gemm": (120, 2)}
    assert dec == {"attn_decode": (30, 1, 0.5), "gemm": (30, 1, 0.5)}
    text = render_batch_story(analyze_batching(read_scheduler_log(tmp_path / "l.jsonl"), hand_trace(side)))
    assert "Top kernels of decode-only iterations (1 iterations)" in text


# ------------------------------------------------------------------ a recorded log


def test_story_of_a_recorded_reference_server_run(tmp_path):
    from tracestory.loadgen import LoadConfig, run_load

    log = tmp_path / "sched.jsonl"
    srv = subprocess.Popen([sys.executable, "-m", "tracestory.cli", "serve", "--preset", "tiny", "--device", "cpu",
                            "--port", "0", "--event-log", str(log), "--max-batch-tokens", "64", "--num-blocks", "24"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        line = srv.stdout.readline().decode()
        assert "listening on" in line, line
        url = line.split("listening on", 1)[1].strip()
        # 6 requests of 40-90 prompt tokens, 4 in flight: prompts exceed the 64-token budget
        # (chunked prefill) and 24 blocks of 16 tokens cannot hold 4 of them (waits/preemptions).
        res = run_load(LoadConfig(url=url, model="tiny", concurrency=4, num_requests=6, prompt_len_min=40,
                                  prompt_len_max=90, max_new_tokens=12, ignore_eos=True, timeout_s=60))
    finally:
        os.killpg(srv.pid, signal.SIGINT)
        srv.wait(30)
    assert all(r.ok for r in res.records)
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    its = [x for x in rows if x["type"] == "iteration"]
    r = analyze_batching(read_scheduler_log(log))
    assert len(r.log.iterations) == len(its) and len(r.requests) == 6
    assert r.kv_allocated_total == sum(x["kv"]["allocated"] for x in its)
    assert r.kv_peak_in_use == max(x["kv"]["in_use"] for x in its) <= 24
    assert r.chunks == sum(1 for x in its for m in x["members"] if m["phase"] == "prefill" and m.get("chunked"))
    assert r.chunks > 0
    assert len(r.preemptions) == sum(1 for x in its for d in x["decisions"] if d["action"] == "preempt")
    assert r.finish_reasons == {"length": 6}
    assert sorted(q.output_tokens for q in r.requests) == [12] * 6
    text = render_batch_story(r)
    assert "## Execution Story: Continuous Batching" in text and "Chunk: " in text


def test_real_h200_serving_log_counts_match_plain_json():
    """The scheduler log of the H200 serving run (benchmarks/results/h200/s2, tracestory serve
    llama-3-8b x4 layers under tracestory load at 4, 12 and 28 QPS): counts and token sums from
    a plain gzip+json pass over the file."""
    import gzip
    import json as _json

    from conftest import REPO
    from tracestory.analysis.batching import analyze_batching, read_scheduler_log
    from tracestory.render.batch_story import render_batch_story

    path = REPO / "benchmarks" / "results" / "h200" / "s2" / "serve_sched.jsonl.gz"
    lines = [_json.loads(x) for x in gzip.open(path, "rt") if x.strip()]
    its = [x for x in lines if x["type"] == "iteration"]
    arrivals = {x["request_id"] for x in lines if x["type"] == "arrival"}
    prefill = sum(m["tokens"] for it in its for m in it["members"] if m["phase"] == "prefill")
    decode_only = sum(1 for it in its if it["members"] and all(m["phase"] == "decode" for m in it["members"]))
    r = analyze_batching(read_scheduler_log(path))
    assert sum(r.kinds.values()) == len(its)
    assert r.kinds["decode-only"] == decode_only
    assert len(r.requests) == len(arrivals)
    assert sum(i.prefill_tokens for i in r.log.iterations) == prefill
    text = render_batch_story(r)
    assert all(len(line) <= 100 for line in text.split("```text")[1].split("```")[0].splitlines())


def test_profiler_start_or_stop_is_not_an_engine_stall(tmp_path):
    """An iteration whose line carries ``profiler_ns`` (the torch profiler's start or stop held its launch) is
    no stall for that part: the same log with one iteration lengthened by 50 ms is a stall without the key
    and none with ``profiler_ns`` = those 50 ms (the median iteration here is 1.3 ms, the stall bar 13 ms)."""
    path = write_log(tmp_path / "sched.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    it = next(x for x in lines if x.get("type") == "iteration" and x["iter"] == 5)
    extra = 50_000_000
    for x in lines:   # every later event moves 50 ms later
        if x.get("type") == "iteration" and x["iter"] >= 5:
            x["t_end_ns"] += extra
            if x["iter"] > 5:
                x["t_start_ns"] += extra
        elif x.get("type") in ("first_token", "finish") and x["t_ns"] >= it["t_start_ns"]:
            x["t_ns"] += extra
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    stalls = analyze_batching(read_scheduler_log(path)).stalls
    assert [s.iter for s in stalls] == [5]
    it["profiler_ns"] = extra
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert analyze_batching(read_scheduler_log(path)).stalls == ()
