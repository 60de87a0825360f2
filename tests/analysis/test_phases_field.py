"""Phases on field traces and hand-built loops: every expected number is read from the JSON in
plain Python here, or worked out by hand in the comments."""

from __future__ import annotations

import gzip
import json

from conftest import TEST_DATA

from tracestory.analysis.phases import phases
from tracestory.ingest import load_inputs
from tracestory.trace import CPU_SIDE, StringPool, TraceMeta, build_trace, make_table

RESNET = TEST_DATA / "field" / "pytorch_kineto__v100_resnet50_tb_plugin_sample.pt.trace.json.gz"
B200 = TEST_DATA / "field" / "AMD-AGI_TraceLens__b200_vllm_moe_mxfp4_prefill_rank0of8.json.gz"
MIXED = TEST_DATA / "graphs" / "mixed_graph_eager.trace.json.gz"


def _events(path):
    return json.load(gzip.open(path))["traceEvents"]


def test_2021_profiler_steps_in_operator_category():
    steps = sorted(e["name"] for e in _events(RESNET) if e.get("cat") == "Operator" and e["name"].startswith("ProfilerStep#"))
    p = phases(load_inputs([RESNET]).traces[0])
    assert p.source == "ProfilerStep" and sorted(x.name for x in p.phases) == steps and len(steps) == 6


def test_lone_outer_range_holding_the_step_is_kept():
    ev = _events(B200)
    outer = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("execute_context")]
    assert len(outer) == 1
    o = outer[0]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    held = sum(1 for e in gpu if o["ts"] <= launch_ts.get(e["args"].get("correlation"), -1) < o["ts"] + o["dur"])
    p = phases(load_inputs([B200]).traces[0])
    assert [x.name for x in p.phases] == [o["name"]]
    assert p.phases[0].kernel_count + p.phases[0].memop_count == held and p.unassigned_kernel_count == len(gpu) - held


def test_nested_ranges_become_subphases():
    ev = _events(MIXED)
    launches = {e["args"]["correlation"]: (e["ts"], e["tid"]) for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    expected = {}
    for name in ("decode_graph", "decode_eager"):
        rs = [e for e in ev if e.get("cat") == "user_annotation" and e["name"] == name]
        n = sum(1 for k in kernels for r in rs
                if (lt := launches.get(k["args"]["correlation"])) and lt[1] == r["tid"] and r["ts"] <= lt[0] < r["ts"] + r["dur"])
        expected[name] = (len(rs), n)
    subs = {s.name: (s.count, s.kernel_count) for s in phases(load_inputs([MIXED]).traces[0]).subphases}
    assert subs == expected and expected["decode_graph"][1] > 0 and expected["decode_eager"][1] > 0


def _numbered(kernel_names_per_range):
    """Ranges test11, test15, test20, ... one after another, each launching its kernels."""
    pool = StringPool()
    k_names, k_start, k_end, corr, a_start, ranges = [], [], [], [], [], []
    t, c = 0, 1
    for i, names in enumerate(kernel_names_per_range):
        r0 = t
        for n in names:
            k_names.append(n)
            a_start.append(t + 1)
            k_start.append(t + 10)
            k_end.append(t + 20)
            corr.append(c)
            c += 1
            t += 30
        ranges.append((f"test{11 + 4 * i}", r0, t))
        t += 100
    tables = {
        "kernels": make_table("kernels", name=pool.encode(k_names), start_ns=k_start, end_ns=k_end, correlation=corr,
                              device=[0] * len(corr), stream=[7] * len(corr)),
        "api": make_table("api", name=pool.encode(["cudaLaunchKernel"] * len(corr)), start_ns=a_start,
                          end_ns=[a + 5 for a in a_start], correlation=corr, tid=[1] * len(corr), pid=[1] * len(corr)),
        "ranges": make_table("ranges", name=pool.encode([r[0] for r in ranges]), start_ns=[r[1] for r in ranges],
                             end_ns=[r[2] for r in ranges], side=[CPU_SIDE] * len(ranges), tid=[1] * len(ranges),
                             pid=[1] * len(ranges), depth=[0] * len(ranges)),
    }
    return build_trace(TraceMeta(source_path="hand.sqlite", source_format="nsys-sqlite"), pool, **tables)


def test_numbered_names_are_steps_only_when_they_repeat_a_loop():
    # test11 / test15 / test19 launch different kernels: three tests, not three steps of a loop.
    assert phases(_numbered([["a"], ["b", "c"], ["d"]])).families == ()
    # The same kernels in the same order: a loop with a trend.
    fam = phases(_numbered([["a", "b"], ["a", "b"], ["a", "b"]])).families
    assert [(f.family, f.count) for f in fam] == [("test", 3)]
