"""GPU time per CPU op and per nn.Module, checked against sums computed straight from the JSON.

The expected values are built here in plain Python from ``json.load`` of the trace: GPU events
(kernel, gpu_memcpy, gpu_memset) are matched to their launch call (cuda_runtime / cuda_driver)
by the ``correlation`` arg; a launch belongs to the cpu_op events of the same pid and tid whose
``[ts, ts + dur)`` contains the launch's ts; the leaf op is the shortest of them, the top-level
op the longest. No interval nesting, sorting or searchsorted: a scan of every op per launch.
Times are converted to integer ns as ``round(us * 1000)``, the unit the library reports in.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest
from conftest import H100_BERT, H200_LLAMA

from tracestory.analysis.operators import operators
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.kineto_modules import load_module_ranges

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _ns(us: float) -> int:
    return int(round(us * 1000.0))


def _events(path):
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _interval(e):
    start = _ns(e["ts"])
    return start, start + _ns(e.get("dur", 0))


def _plain_links(events):
    """(gpu event, its launch event or None) for every GPU event."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    return [(e, launches.get(e["args"].get("correlation"))) for e in events if e.get("cat") in GPU_CATS]


def _enclosing(launch, candidates):
    t = _ns(launch["ts"])
    out = []
    for c in candidates:
        s, e = _interval(c)
        if c["pid"] == launch["pid"] and c["tid"] == launch["tid"] and s <= t < e:
            out.append(c)
    return out


def _key(op):
    a = op.get("args", {})
    dims, types = a.get("Input Dims"), a.get("Input type")
    return (op["name"], None if dims is None else json.dumps(dims), None if types is None else json.dumps(types))


def _expected_per_op(path):
    """{(name, dims, types): [gpu_ns, gpu_op_count, kernel_count, op instances, launches]} for
    the leaf and the top-level ops, and the ns of unattributed / outside GPU events."""
    events = _events(path)
    ops = [e for e in events if e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#")]
    leaf = defaultdict(lambda: [0, 0, 0, set(), set(), defaultdict(int)])
    top = defaultdict(lambda: [0, 0, 0, set(), set(), defaultdict(int)])
    unattributed = outside = 0
    for gpu, launch in _plain_links(events):
        d = _ns(gpu["dur"])
        if launch is None:
            unattributed += d
            continue
        chain = _enclosing(launch, ops)
        if not chain:
            outside += d
            continue
        dur = [_interval(c)[1] - _interval(c)[0] for c in chain]
        for table, op in ((leaf, chain[dur.index(min(dur))]), (top, chain[dur.index(max(dur))])):
            row = table[_key(op)]
            row[0] += d
            row[1] += 1
            row[2] += gpu["cat"] == "kernel"
            row[3].add(id(op))
            row[4].add(id(launch))
            row[5][gpu["name"]] += d
    return leaf, top, unattributed, outside


def _as_dict(stats):
    def dims(text):
        return None if text is None else json.dumps(json.loads(text))

    return {(s.name, dims(s.input_dims), dims(s.input_types)): [s.gpu_ns, s.gpu_op_count, s.kernel_count, s.calls,
                                                               s.launches] for s in stats}


@pytest.mark.parametrize("path", [H100_BERT, H200_LLAMA], ids=["h100_bert", "h200_llama"])
def test_gpu_time_per_leaf_and_top_level_op_matches_the_json(path):
    leaf, top, unattributed, outside = _expected_per_op(path)
    result = operators(load_kineto(path))
    for name, expected, got in (("leaf", leaf, result.leaf), ("top", top, result.top_level)):
        want = {k: [v[0], v[1], v[2], len(v[3]), len(v[4])] for k, v in expected.items()}
        assert _as_dict(got) == want, name
        # top kernels: the (up to) 3 largest GPU op names of the group by summed time
        for s in got:
            per_name = expected[(s.name, *[None if x is None else json.dumps(json.loads(x))
                                           for x in (s.input_dims, s.input_types)])][5]
            assert [t for _, t in s.top_kernels] == sorted(per_name.values(), reverse=True)[:3]
            assert all(per_name[n] == t for n, t in s.top_kernels)
    assert result.unattributed_ns == unattributed
    assert result.outside_ops_ns == outside
    # every GPU op is somewhere: the op rows plus the two remainders are the whole GPU time
    events = _events(path)
    total = sum(_ns(e["dur"]) for e in events if e.get("cat") in GPU_CATS)
    assert result.total_gpu_ns == total
    for stats in (result.leaf, result.top_level):
        assert sum(s.gpu_ns for s in stats) + result.unattributed_ns + result.outside_ops_ns == total
        assert sum(s.share for s in stats) == pytest.approx((total - unattributed - outside) / total)


def test_h200_llama_decode_gemms_are_aten_mm_under_aten_linear_with_their_shapes():
    """A hand reading of the H200 trace: every decode-step GEMM is ``aten::mm`` inside
    ``aten::linear`` with input dims ``[[1, 4096], [4096, 14336]]`` (gate/up projections of 2
    layers x 16 steps x 2 = 64 calls); checked against the JSON sum of those kernels."""
    events = _events(H200_LLAMA)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    mm = [e for e in ops if e["name"] == "aten::mm" and e["args"].get("Input Dims") == [[1, 4096], [4096, 14336]]]
    assert len(mm) == 64
    launches = [e for e in events if e.get("cat") in LAUNCH_CATS]
    corr = {l["args"]["correlation"] for m in mm for l in _enclosing_launches(m, launches)}
    want = sum(_ns(e["dur"]) for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] in corr)
    result = operators(load_kineto(H200_LLAMA))
    (row,) = [s for s in result.leaf if s.name == "aten::mm" and s.input_dims == "[[1, 4096], [4096, 14336]]"]
    assert (row.calls, row.gpu_ns, row.input_types) == (64, want, '["c10::BFloat16", "c10::BFloat16"]')
    assert row.top_kernels[0][0].startswith("nvjet_sm90_")
    assert result.shapes_recorded
    (top,) = [s for s in result.top_level if s.name == "aten::linear" and s.input_dims == "[[1, 1, 4096], [14336, 4096], []]"]
    assert top.gpu_ns == want


def _enclosing_launches(op, launches):
    s, e = _interval(op)
    return [l for l in launches if l["tid"] == op["tid"] and s <= _ns(l["ts"]) < e]


def _expected_per_module(path):
    """{path: [inclusive gpu_ns, self gpu_ns, calls]} from the nn.Module python_function events:
    a module call's path is the names of the module calls of its thread that contain its start,
    outermost (longest) first; a launch counts for every module call containing it (inclusive)
    and for the shortest one (self)."""
    events = _events(path)
    mods = [e for e in events if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]

    def contains(outer, t):
        s, e = _interval(outer)
        return s <= t < e

    def path_of(m):
        t = _ns(m["ts"])
        chain = [o for o in mods if o["tid"] == m["tid"] and o["pid"] == m["pid"] and contains(o, t)]
        chain.sort(key=lambda o: -(_interval(o)[1] - _interval(o)[0]))
        return "/".join(o["name"][len("nn.Module: "):] for o in chain)

    paths = {id(m): path_of(m) for m in mods}
    out = defaultdict(lambda: [0, 0, 0])
    for m in mods:
        out[paths[id(m)]][2] += 1
    for gpu, launch in _plain_links(events):
        if launch is None:
            continue
        chain = _enclosing(launch, mods)
        for m in chain:
            out[paths[id(m)]][0] += _ns(gpu["dur"])
        if chain:
            inner = min(chain, key=lambda m: _interval(m)[1] - _interval(m)[0])
            out[paths[id(inner)]][1] += _ns(gpu["dur"])
    return dict(out)


def test_gpu_time_per_module_matches_the_json():
    result = operators(load_kineto(H100_BERT), load_module_ranges(H100_BERT))
    want = _expected_per_module(H100_BERT)
    got = {m.path: [m.gpu_ns, m.self_gpu_ns, m.calls] for m in result.modules}
    assert got == want
    assert result.module_source == "python_function"
    # the outermost module holds every GPU op of this inference step (hand reading: one
    # BertLMHeadModel_0 call spans the whole forward)
    assert result.modules[0].path == "BertLMHeadModel_0"
    assert result.modules[0].gpu_ns == result.total_gpu_ns
    depth_of = {m.path: m.depth for m in result.modules}
    assert all(depth_of[p] == p.count("/") for p in depth_of)


def test_trace_without_module_events_has_no_modules():
    assert len(load_module_ranges(H200_LLAMA)) == 0
    result = operators(load_kineto(H200_LLAMA))
    assert result.modules == () and result.module_source == "none" and result.module_gpu_ns == 0


def _built_trace(ops=(), ranges=(), launches=(), kernels=()):
    """A trace from hand-written rows: ops (name, start, end, tid, dims), ranges (name, start,
    end, tid), launches (correlation, start, tid), kernels (name, correlation, start, end)."""
    from tracestory.trace import CPU_SIDE, StringPool, TraceMeta, build_trace, make_table

    pool = StringPool()
    tables = {}
    if ops:
        tables["ops"] = make_table("ops", name=[pool.code(o[0]) for o in ops], start_ns=[o[1] for o in ops],
                                   end_ns=[o[2] for o in ops], pid=[1] * len(ops), tid=[o[3] for o in ops],
                                   input_dims=[o[4].encode() for o in ops], input_types=[b'["float"]'] * len(ops))
    if ranges:
        tables["ranges"] = make_table("ranges", name=[pool.code(r[0]) for r in ranges], start_ns=[r[1] for r in ranges],
                                      end_ns=[r[2] for r in ranges], pid=[1] * len(ranges), tid=[r[3] for r in ranges],
                                      side=[CPU_SIDE] * len(ranges))
    tables["api"] = make_table("api", name=[pool.code("cudaLaunchKernel")] * len(launches),
                               correlation=[a[0] for a in launches], start_ns=[a[1] for a in launches],
                               end_ns=[a[1] + 1 for a in launches], pid=[1] * len(launches), tid=[a[2] for a in launches])
    tables["kernels"] = make_table("kernels", name=[pool.code(k[0]) for k in kernels], correlation=[k[1] for k in kernels],
                                   start_ns=[k[2] for k in kernels], end_ns=[k[3] for k in kernels])
    return build_trace(TraceMeta(source_path="built", source_format="kineto"), pool, **tables)


def test_hand_built_nesting_threads_step_markers_fallback_and_remainders():
    """Thread 1: ProfilerStep#0 [0, 1000) holds aten::linear [100, 400) holding aten::mm
    [150, 300); a sibling aten::mm [500, 600) with other dims; a launch at 700 inside only the
    annotation 'sampler' [650, 800). Thread 2: aten::add [100, 200). Kernels (ns): k1 10 (mm in
    linear), k2 20 (second mm), k3 40 (annotation), k4 80 (launched on thread 3, no op), k5 160
    (correlation 99 has no launch), k6 320 (aten::add on thread 2, launched at 150)."""
    trace = _built_trace(
        ops=[("ProfilerStep#0", 0, 1000, 1, "[]"), ("aten::linear", 100, 400, 1, "[[2, 4]]"),
             ("aten::mm", 150, 300, 1, "[[2, 4], [4, 8]]"), ("aten::mm", 500, 600, 1, "[[8, 8], [8, 8]]"),
             ("aten::add", 100, 200, 2, "[[3]]")],
        ranges=[("ProfilerStep#0", 0, 1000, 1), ("sampler", 650, 800, 1)],
        launches=[(1, 200, 1), (2, 550, 1), (3, 700, 1), (4, 200, 3), (6, 150, 2)],
        kernels=[("k1", 1, 1000, 1010), ("k2", 2, 1100, 1120), ("k3", 3, 1200, 1240), ("k4", 4, 1300, 1380),
                 ("k5", 99, 1400, 1560), ("k6", 6, 1600, 1920)],
    )
    r = operators(trace)
    total = 10 + 20 + 40 + 80 + 160 + 320
    assert (r.total_gpu_ns, r.unattributed_ns, r.unattributed_count, r.outside_ops_ns, r.outside_ops_count) == \
        (total, 160, 1, 80, 1)
    leaf = {(s.name, s.input_dims): (s.gpu_ns, s.kind, s.top_kernels) for s in r.leaf}
    assert leaf == {
        ("aten::add", "[[3]]"): (320, "op", (("k6", 320),)),
        ("sampler", None): (40, "annotation", (("k3", 40),)),
        ("aten::mm", "[[8, 8], [8, 8]]"): (20, "op", (("k2", 20),)),
        ("aten::mm", "[[2, 4], [4, 8]]"): (10, "op", (("k1", 10),)),
    }
    top = [(s.name, s.input_dims, s.gpu_ns) for s in r.top_level]
    assert top == [("aten::add", "[[3]]", 320), ("sampler", None, 40), ("aten::mm", "[[8, 8], [8, 8]]", 20),
                   ("aten::linear", "[[2, 4]]", 10)]
    assert r.leaf[0].share == pytest.approx(320 / total)


def test_nvtx_ranges_are_the_ops_when_the_trace_has_no_cpu_ops():
    """Nsight Systems: no ops table; NVTX push/pop ranges 'forward' [0, 100) > 'attn' [10, 50)."""
    trace = _built_trace(ranges=[("forward", 0, 100, 7), ("attn", 10, 50, 7)],
                         launches=[(1, 20, 7), (2, 60, 7)],
                         kernels=[("flash", 1, 200, 230), ("gemm", 2, 300, 305)])
    r = operators(trace)
    assert r.op_source == "nvtx"
    assert [(s.name, s.kind, s.gpu_ns) for s in r.leaf] == [("attn", "nvtx", 30), ("forward", "nvtx", 5)]
    assert [(s.name, s.gpu_ns, s.calls, s.launches) for s in r.top_level] == [("forward", 35, 1, 2)]


def test_a_launch_after_an_overlapping_sibling_goes_to_the_op_that_contains_it():
    """Ops that overlap instead of nesting (A [0, 100), B [50, 150), C [0, 300) enclosing both):
    a launch at 120 lies in B and C, not A."""
    trace = _built_trace(ops=[("C", 0, 300, 1, "[]"), ("A", 0, 100, 1, "[]"), ("B", 50, 150, 1, "[]")],
                         launches=[(1, 120, 1), (2, 200, 1)],
                         kernels=[("k", 1, 400, 410), ("k", 2, 500, 503)])
    r = operators(trace)
    assert {s.name: s.gpu_ns for s in r.leaf} == {"B": 10, "C": 3}


def test_gpu_time_per_nvtx_range_matches_sql_on_a_real_nsys_export():
    """Nsight Systems 2022.1 export with NVTX push/pop ranges and no CPU ops: the NVTX ranges are
    the ops. Expected values from SQL rows and a plain scan: GPU activity -> runtime call of the
    same correlationId -> push/pop ranges (eventType 59) of the call's thread containing its start;
    leaf the shortest, top level the longest."""
    import sqlite3

    from conftest import NSYS_2022

    from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

    with sqlite3.connect(NSYS_2022) as db:
        gpu = db.execute("SELECT correlationId, end - start FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                         "SELECT correlationId, end - start FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
                         "SELECT correlationId, end - start FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
        calls = {c: (s, tid) for c, s, tid in db.execute(
            "SELECT correlationId, start, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
        ranges = db.execute("SELECT text, start, end, globalTid FROM NVTX_EVENTS WHERE eventType = 59").fetchall()
    leaf, top = defaultdict(int), defaultdict(int)
    unattributed = outside = 0
    for corr, d in gpu:
        if corr not in calls:
            unattributed += d
            continue
        t, tid = calls[corr]
        chain = [r for r in ranges if r[3] == tid and r[1] <= t < r[2]]
        if not chain:
            outside += d
            continue
        leaf[min(chain, key=lambda r: r[2] - r[1])[0]] += d
        top[max(chain, key=lambda r: r[2] - r[1])[0]] += d
    (trace,) = load_nsys_sqlite(NSYS_2022)
    result = operators(trace)
    assert result.op_source == "nvtx"
    assert (result.unattributed_ns, result.outside_ops_ns) == (unattributed, outside)
    assert {s.name: s.gpu_ns for s in result.leaf} == dict(leaf)
    assert {s.name: s.gpu_ns for s in result.top_level} == dict(top)
    assert (len(result.leaf), len(result.top_level)) == (len(leaf), len(top))
    assert dict(leaf) != dict(top)  # the ranges nest: leaf and top level differ
    assert len(gpu) == 12 + 30 + 17 and result.gpu_op_count == len(gpu)
