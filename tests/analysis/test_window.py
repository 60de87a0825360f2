"""Windows before analysis (analysis/window.py) on real fixtures; every expected value is read
from the file itself (plain JSON for Kineto, SQL for Nsight Systems), not from the code under test."""

from __future__ import annotations

import gzip
import json
import sqlite3
import statistics

import numpy as np
import pytest

from conftest import A100_NCCL, TEST_DATA
from tracestory.analysis.phases import phases
from tracestory.analysis.window import (WindowSpec, parse_steps, parse_window, restrict, steady_steps, steps,
                                        window_trace, window_traces)
from tracestory.errors import UsageError
from tracestory.ingest import load_inputs

TP2 = TEST_DATA / "multigpu" / "tp2_even" / "torch" / "rank0.trace.json.gz"
MEMORY = TEST_DATA / "memory" / "tiny_llama_memory" / "torch" / "rank0.trace.json.gz"
NSYS = TEST_DATA / "corpus" / "nsight" / "NVIDIA_Fuser__h200_test_matmul_cpp_nvtx.sqlite"
NO_STEPS = TEST_DATA / "compare" / "decode_default_a.trace.json.gz"
# the event categories the Kineto reader turns into rows (the profiler's own "Trace" span and
# "overhead" events are not rows, so they do not move the trace start)
ROW_CATS = {"cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "user_annotation",
            "gpu_user_annotation", "python_function"}


def ns(us) -> int:
    return round(us * 1000)


def plain(path):
    """Complete events of the row categories, with start/end in integer ns."""
    with gzip.open(path) as f:
        ev = json.load(f)["traceEvents"]
    out = [dict(e, s=ns(e["ts"]), e=ns(e["ts"]) + ns(e.get("dur", 0))) for e in ev
           if e.get("ph") == "X" and e.get("cat") in ROW_CATS]
    return out, ev


def trace(path):
    (t,) = load_inputs([path]).traces
    return t


def test_time_window_keeps_gpu_ops_by_start_and_cpu_rows_by_overlap():
    rows, _ = plain(TP2)
    t0 = min(r["s"] for r in rows)
    lo, hi = t0 + 2_000_000, t0 + 6_000_000
    out, tw = window_trace(trace(TP2), parse_window("2:6"))
    starts_in = lambda cat: sum(1 for r in rows if r["cat"] == cat and lo <= r["s"] < hi)
    overlaps = lambda cats: sum(1 for r in rows if r["cat"] in cats and r["s"] < hi and r["e"] > lo)
    assert len(out.kernels) == starts_in("kernel") == 34   # 34 read off the file once, by hand
    assert len(out.memops) == starts_in("gpu_memset")
    assert len(out.ops) == overlaps({"cpu_op", "python_function"})
    assert len(out.api) == overlaps({"cuda_runtime", "cuda_driver"})
    assert len(out.ranges) == overlaps({"user_annotation", "gpu_user_annotation"})
    assert (tw.trace_start_ns, tw.start_ns, tw.end_ns) == (t0, lo, hi)
    assert (tw.start_ms, tw.end_ms) == (2.0, 6.0)
    assert (tw.kernels_kept, tw.kernels_total) == (34, sum(r["cat"] == "kernel" for r in rows))
    # a kernel that starts inside and ends past the edge keeps its whole duration
    k = [r for r in rows if r["cat"] == "kernel" and lo <= r["s"] < hi]
    assert int(out.kernels.dur_ns.sum()) == sum(r["e"] - r["s"] for r in k)


def test_open_sides_are_the_trace_edges():
    rows, _ = plain(TP2)
    t0 = min(r["s"] for r in rows)
    out, _ = window_trace(trace(TP2), parse_window("10:"))
    assert len(out.kernels) == sum(1 for r in rows if r["cat"] == "kernel" and r["s"] >= t0 + 10_000_000)
    out, _ = window_trace(trace(TP2), parse_window(":1.5"))
    assert len(out.kernels) == sum(1 for r in rows if r["cat"] == "kernel" and r["s"] < t0 + 1_500_000)


def test_window_on_nsys_matches_sql():
    con = sqlite3.connect(NSYS)
    t0 = min(con.execute(f"SELECT min(start) FROM {t}").fetchone()[0] for t in
             ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"))
    lo, hi = t0 + 600_000_000, t0 + 640_000_000
    expect = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start >= ? AND start < ?",
                         (lo, hi)).fetchone()[0]
    memsets = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE start >= ? AND start < ?",
                          (lo, hi)).fetchone()[0]
    (t,) = load_inputs([NSYS]).traces
    out, tw = window_trace(t, parse_window("600:640"))
    assert len(out.kernels) == expect == 14   # 14 counted by hand in the sorted start list
    assert len(out.memops) == memsets
    assert tw.trace_start_ns == t0
    # two processes of one report (here: the file's trace cut in two at 620 ms) count from the
    # file's first event, not the second from its own (which is at 620 ms or later)
    cut = t0 + 620_000_000
    first, second = restrict(t, t0, cut), restrict(t, cut, t0 + 10**12)
    outs, sel = window_traces([first, second], parse_window("600:640"))
    assert [w.trace_start_ns for w in sel.traces] == [t0, t0]
    assert int(second.kernels["start_ns"].min()) >= cut
    assert sum(len(o.kernels) for o in outs) == expect


def test_memory_samples_inside_the_window():
    _, ev = plain(MEMORY)
    mem = [ns(e["ts"]) for e in ev if e.get("ph") == "i" and e.get("name") == "[memory]"]
    t = trace(MEMORY)
    rows = [ns(e["ts"]) for e in ev if e.get("ph") == "X" and e.get("cat") in ROW_CATS] + mem
    t0 = min(rows)
    mid = (statistics.median(mem) - t0) / 1e6
    out, _ = window_trace(t, parse_window(f"0:{mid:.6f}"))
    hi = t0 + round(mid * 1e6)
    assert len(mem) == len(t.memory) == 64
    assert len(out.memory) == sum(1 for m in mem if t0 <= m < hi)
    assert 0 < len(out.memory) < 64


def test_steps_window_is_the_steps_cpu_span_and_their_gpu_ops():
    rows, _ = plain(TP2)
    step = {r["name"]: r for r in rows if r["cat"] == "user_annotation" and r["name"].startswith("ProfilerStep#")}
    s5, s6 = step["ProfilerStep#5"], step["ProfilerStep#6"]
    # the GPU ops launched in steps 5 and 6: runtime calls starting inside a step, by correlation
    launches = {r["args"]["correlation"] for r in rows if r["cat"] in ("cuda_runtime", "cuda_driver")
                and any(s["s"] <= r["s"] < s["e"] for s in (s5, s6))}
    gpu = [r for r in rows if r["cat"] in ("kernel", "gpu_memset") and r["args"].get("correlation") in launches]
    g_lo, g_hi = min(r["s"] for r in gpu), max(r["e"] for r in gpu)
    out, tw = window_trace(trace(TP2), parse_steps("5:6"))
    assert (tw.start_ns, tw.end_ns, tw.gpu_start_ns, tw.gpu_end_ns) == (s5["s"], s6["e"], g_lo, g_hi)
    assert len(out.kernels) == sum(1 for r in rows if r["cat"] == "kernel" and g_lo <= r["s"] < g_hi) == 52
    assert tw.steps_kept == ("ProfilerStep#5", "ProfilerStep#6") and tw.steps_dropped == ()
    # the windowed trace's own phases are the two steps, no neighbour
    assert [p.name for p in phases(out).phases] == ["ProfilerStep#5", "ProfilerStep#6"]


def _step_times(path):
    """ProfilerStep name -> (time as a device-synced caller sees it, GPU ops launched), from JSON."""
    rows, _ = plain(path)
    st = sorted((r for r in rows if r["cat"] == "user_annotation" and r["name"].startswith("ProfilerStep#")),
                key=lambda r: r["s"])
    out = {}
    for s in st:
        corr = {r["args"]["correlation"] for r in rows if r["cat"] in ("cuda_runtime", "cuda_driver")
                and s["s"] <= r["s"] < s["e"]}
        gpu = [r for r in rows if r["cat"] in ("kernel", "gpu_memset", "gpu_memcpy")
               and r["args"].get("correlation") in corr]
        out[s["name"]] = (max([s["e"]] + [r["e"] for r in gpu]) - s["s"], len(gpu))
    return out


def test_steady_state_drops_the_first_step_and_a_slow_second_one():
    times = _step_times(TP2)
    names = list(times)
    assert names == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"]
    rest = [times[n][0] for n in names[1:]]
    med = statistics.median(rest)
    assert times["ProfilerStep#5"][0] >= 1.5 * med > times["ProfilerStep#6"][0]   # the JSON says #5 is slow
    _, tw = window_trace(trace(TP2), WindowSpec("steady-state"))
    assert tw.steps_kept == ("ProfilerStep#6", "ProfilerStep#7")
    assert [n for n, _ in tw.steps_dropped] == ["ProfilerStep#4", "ProfilerStep#5"]
    assert f"{times['ProfilerStep#5'][0] / med:.2f}x" in tw.steps_dropped[1][1]


def test_steady_state_on_three_even_steps_drops_only_the_first():
    times = _step_times(A100_NCCL)
    rest = [t for t, _ in list(times.values())[1:]]
    assert all(t < 1.5 * statistics.median(rest) for t in rest)
    out, tw = window_trace(trace(A100_NCCL), WindowSpec("steady-state"))
    assert tw.steps_kept == tuple(list(times)[1:])
    assert tw.steps_dropped == ((next(iter(times)), "first step, warm-up"),)
    # collective records follow their kernels, renumbered to the kept rows
    assert 0 < len(out.collectives) < len(trace(A100_NCCL).collectives)
    ki = out.collectives["kernel_index"]
    assert (ki >= 0).all()
    assert (out.kernels["start_ns"][ki] == out.collectives["start_ns"]).all()


def test_steady_state_drops_a_last_step_the_window_cut():
    t = trace(TP2)
    rows, _ = plain(TP2)
    s7 = next(r for r in rows if r["name"] == "ProfilerStep#7")
    corr = {r["args"]["correlation"] for r in rows if r["cat"] in ("cuda_runtime", "cuda_driver")
            and s7["s"] <= r["s"] < s7["e"]}
    gpu7 = sorted(r["s"] for r in rows if r["cat"] in ("kernel", "gpu_memset") and r["args"].get("correlation") in corr)
    cut = gpu7[len(gpu7) // 2]            # the capture stops half-way through step 7's GPU work
    short = restrict(t, int(t.kernels["start_ns"].min()) - 1, cut)
    kept_ops = next(p for p in phases(short).phases if p.name == "ProfilerStep#7")
    assert kept_ops.kernel_count + kept_ops.memop_count == len(gpu7) // 2
    fam, all_steps = steps(short)[:2]
    kept, dropped = steady_steps(all_steps)
    assert fam == "ProfilerStep"
    assert [s.name for s, _ in dropped][-1] == "ProfilerStep#7"
    assert dropped[-1][1].startswith(f"cut by the trace end: {len(gpu7) // 2} GPU ops")
    assert "ProfilerStep#7" not in [s.name for s in kept]


def test_no_steps_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"decode_default_a.trace.json.gz: --steps 1:2 needs steps: .*no ProfilerStep"):
        window_trace(trace(NO_STEPS), parse_steps("1:2"))
    with pytest.raises(UsageError, match="--steady-state needs steps"):
        window_trace(trace(NO_STEPS), WindowSpec("steady-state"))


def test_steps_the_trace_does_not_have_are_refused():
    with pytest.raises(UsageError, match=r"expected step numbers of ProfilerStep, found steps 4\.\.7 \(4 steps\)"):
        window_trace(trace(TP2), parse_steps("10:12"))


def test_a_window_without_gpu_ops_is_refused():
    rows, _ = plain(TP2)
    t0 = min(r["s"] for r in rows)
    first_kernel_ms = (min(r["s"] for r in rows if r["cat"] == "kernel") - t0) / 1e6
    assert first_kernel_ms > 0.05
    with pytest.raises(UsageError, match="expected GPU ops inside the window 0.000..0.050 ms, found none"):
        window_trace(trace(TP2), parse_window("0:0.05"))


@pytest.mark.parametrize("text", ["", "5", "a:b", "6:5", "3:3", "1:2:3", "inf:"])
def test_bad_windows(text):
    with pytest.raises(UsageError, match="--window"):
        parse_window(text)


@pytest.mark.parametrize("text", ["", "a:b", "6:5", "-1:3", "1.5:2"])
def test_bad_steps(text):
    with pytest.raises(UsageError, match="--steps"):
        parse_steps(text)


def test_parse():
    assert parse_window(" 1.5 : 20 ") == WindowSpec("window", 1.5, 20.0)
    assert parse_window(":20").request == "--window :20"
    assert parse_steps("7") == WindowSpec("steps", first=7, last=7)
    assert parse_steps("5:9").request == "--steps 5:9"


def test_restrict_keeps_every_row_of_a_window_around_the_whole_trace():
    t = trace(TP2)
    lo = min(int(x["start_ns"].min()) for x in (t.kernels, t.api, t.ops, t.ranges, t.memops))
    hi = max(int(x["end_ns"].max()) for x in (t.kernels, t.api, t.ops, t.ranges, t.memops)) + 1
    out = restrict(t, lo, hi)
    for name in ("kernels", "memops", "api", "ops", "ranges", "collectives"):
        a, b = getattr(t, name), getattr(out, name)
        assert len(a) == len(b)
        assert all(np.array_equal(a[c], b[c], equal_nan=a[c].dtype.kind == "f")
                   for c in a.columns if a[c].dtype != object)


def _hand_trace(ranges, kernels):
    """ranges: (name, start, end) on thread 1; kernels: (name, launch start), each running
    [launch + 10, launch + 20)."""
    from tracestory.trace import CPU_SIDE, StringPool, TraceMeta, build_trace, make_table

    pool, n = StringPool(), len(kernels)
    corr = list(range(1, n + 1))
    return build_trace(
        TraceMeta(source_path="hand.sqlite", source_format="nsys-sqlite"), pool,
        kernels=make_table("kernels", name=pool.encode([k[0] for k in kernels]),
                           start_ns=[k[1] + 10 for k in kernels], end_ns=[k[1] + 20 for k in kernels],
                           correlation=corr, device=[0] * n, stream=[7] * n),
        api=make_table("api", name=pool.encode(["cudaLaunchKernel"] * n), start_ns=[k[1] for k in kernels],
                       end_ns=[k[1] + 2 for k in kernels], correlation=corr, tid=[1] * n, pid=[1] * n),
        ranges=make_table("ranges", name=pool.encode([r[0] for r in ranges]), start_ns=[r[1] for r in ranges],
                          end_ns=[r[2] for r in ranges], side=[CPU_SIDE] * len(ranges), tid=[1] * len(ranges),
                          pid=[1] * len(ranges), depth=[-1] * len(ranges)))


def test_steps_of_a_decode_loop():
    # generate [0, 800) around decode_0..decode_7, each [100 i, 100 i + 90) launching three
    # kernels at 100 i + 1, + 21, + 41 (running 10 ns after their launch)
    ranges = [("generate", 0, 800)] + [(f"decode_{i}", 100 * i, 100 * i + 90) for i in range(8)]
    ks = [(k, 100 * i + 1 + 20 * j) for i in range(8) for j, k in enumerate(("qkv", "attn", "mlp"))]
    out, tw = window_trace(_hand_trace(ranges, ks), parse_steps("2:4"))
    assert tw.family == "decode"
    assert tw.steps_kept == ("decode_2", "decode_3", "decode_4")
    assert (tw.start_ns, tw.end_ns, tw.gpu_start_ns, tw.gpu_end_ns) == (200, 490, 211, 461)
    assert out.kernels["start_ns"].tolist() == [211, 231, 251, 311, 331, 351, 411, 431, 451]
    assert [out.name(int(c)) for c in out.ranges["name"]] == ["generate", "decode_2", "decode_3", "decode_4"]
    _, tw = window_trace(_hand_trace(ranges, ks), WindowSpec("steady-state"))
    # 8 equal steps: only the first goes; the last launches as many GPU ops as the others
    assert tw.steps_kept == tuple(f"decode_{i}" for i in range(1, 8))


def test_steps_of_a_training_loop_without_step_markers():
    # The 2021 ResNet-50 trace with its ProfilerStep#N ops taken away: its phases are forward /
    # backward / optimizer (tests/analysis/test_phases_levels.py); step i is the three of them.
    # forward#i starts where optimizer#(i-1) ends: the window of steps 1..2 runs from the end of
    # the first "Optimizer.step#SGD.step" op to the end of the third (JSON, integer us).
    import dataclasses

    resnet = TEST_DATA / "field" / "pytorch_kineto__v100_resnet50_tb_plugin_sample.pt.trace.json.gz"
    tr = trace(resnet)
    names = [tr.name(int(c)) for c in tr.ops["name"]]
    tr = dataclasses.replace(tr, ops=tr.ops.take(np.flatnonzero([not n.startswith("ProfilerStep#") for n in names])))
    with gzip.open(resnet) as f:
        ev = json.load(f)["traceEvents"]
    opt = sorted((e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in ev
                 if e.get("ph") == "X" and e["name"] == "Optimizer.step#SGD.step")
    _, tw = window_trace(tr, parse_steps("1:2"))
    assert tw.family == "training iteration"
    assert tw.steps_kept == ("iteration 1 (forward#1, backward#1, optimizer#1)",
                             "iteration 2 (forward#2, backward#2, optimizer#2)")
    assert abs(tw.start_ns - opt[0][1]) < 1000 and abs(tw.end_ns - opt[2][1]) < 1000   # float64 reading: 1 us
