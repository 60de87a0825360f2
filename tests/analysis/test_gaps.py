"""Tests of analysis.gaps: what the launching host thread did while the GPU waited.

Tiny hand-built traces with the expected cause worked out by hand in the comments, and the real
ResNet-50 (V100, 2021) and H200 Llama traces checked against a plain JSON reading."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import H200_LLAMA, TEST_DATA

from tracestory.analysis import findings
from tracestory.analysis.gaps import GapCause, gap_causes
from tracestory.ingest import load_inputs
from tracestory.trace import CPU_SIDE, StringPool, TraceMeta, build_trace, make_table

RESNET = TEST_DATA / "field" / "pytorch_kineto__v100_resnet50_tb_plugin_sample.pt.trace.json.gz"
DATALOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _trace(gpu, cpu_ops=(), ranges=()):
    """gpu: (name, gpu start, gpu end, launch start, launch end, launch tid, is_memop);
    cpu_ops: (name, start, end, tid); ranges (CPU side): (name, start, end, tid)."""
    pool = StringPool()
    tables, api = {}, []
    for kind, memop in (("kernels", False), ("memops", True)):
        rows = [g for g in gpu if g[6] == memop]
        if not rows:
            continue
        corr = list(range(len(api) + 1, len(api) + 1 + len(rows)))
        api += [(c, g[3], g[4], g[5]) for c, g in zip(corr, rows)]
        tables[kind] = make_table(kind, name=pool.encode([g[0] for g in rows]), start_ns=[g[1] for g in rows],
                                  end_ns=[g[2] for g in rows], correlation=corr, device=[0] * len(rows),
                                  stream=[7] * len(rows))
    tables["api"] = make_table("api", correlation=[a[0] for a in api], start_ns=[a[1] for a in api],
                               end_ns=[a[2] for a in api], tid=[a[3] for a in api], pid=[10] * len(api),
                               name=pool.encode(["cudaLaunchKernel"] * len(api)))
    if cpu_ops:
        tables["ops"] = make_table("ops", name=pool.encode([o[0] for o in cpu_ops]), start_ns=[o[1] for o in cpu_ops],
                                   end_ns=[o[2] for o in cpu_ops], tid=[o[3] for o in cpu_ops], pid=[10] * len(cpu_ops))
    if ranges:
        tables["ranges"] = make_table("ranges", name=pool.encode([r[0] for r in ranges]),
                                      start_ns=[r[1] for r in ranges], end_ns=[r[2] for r in ranges],
                                      side=[CPU_SIDE] * len(ranges), tid=[r[3] for r in ranges],
                                      pid=[10] * len(ranges), depth=[-1] * len(ranges))
    return build_trace(TraceMeta(source_path="hand.json", source_format="kineto"), pool, **tables)


def _dataloader_step(as_ops: bool):
    # ProfilerStep#1 [0, 10000) on thread 1; inside it the DataLoader [100, 5100), then aten::to
    # [5200, 5400) holding the copy's launch call [5250, 5300). GPU: k0 [50, 90), the copy
    # [5350, 5500), k1 [5600, 6000) launched at [5450, 5460). ``as_ops``: the step marker and the
    # DataLoader are CPU ops (Kineto before 2022, category "Operator"), else user_annotation ranges.
    gpu = [("k0", 50, 90, 10, 20, 1, False), ("Memcpy HtoD", 5350, 5500, 5250, 5300, 1, True),
           ("k1", 5600, 6000, 5450, 5460, 1, False)]
    ops = [("aten::to", 5200, 5400, 1), ("aten::copy_", 5210, 5390, 1)]
    marks = [("ProfilerStep#1", 0, 10000, 1), (DATALOADER, 100, 5100, 1)]
    return _trace(gpu, ops + marks, ()) if as_ops else _trace(gpu, ops, marks)


@pytest.mark.parametrize("as_ops", [False, True])
def test_dataloader_named_not_the_step(as_ops):
    # Gap [90, 5350) = 5260 ns. Host window [90, min(5350, launch end 5300)) = 5210 ns.
    # ProfilerStep#1 encloses the whole step: a container. The DataLoader covers [100, 5100):
    # 5000 >= 5210 / 2. Within: the innermost interval enclosing the launch [5250, 5300) and
    # lasting >= 5260 // 2: aten::copy_ (180) and aten::to (200) are too short: ProfilerStep#1
    # (the op the earlier model named as the cause when the marker was an op).
    (g,) = gap_causes(_dataloader_step(as_ops), min_ns=1000)
    assert g == GapCause(start_ns=90, dur_ns=5260, launch_wait_ns=5210, after="Memcpy HtoD", op_name=DATALOADER,
                         op_dur_ns=5000, op_overlap_ns=5000, within="ProfilerStep#1", within_dur_ns=10000,
                         step="ProfilerStep#1")


def test_reexported_from_findings():
    assert findings.gap_causes is gap_causes and findings.GapCause is GapCause


def test_innermost_of_a_chain_that_covers_half():
    # Gap [100, 1100); launch of k1 at [1040, 1050): window [100, 1050) = 950.
    # Chain on thread 1: step [0, 2000) (container, a range), conv2d [90, 1060) overlap 950,
    # cudnn_convolution [120, 1055) overlap 930, aten::empty [130, 400) overlap 270 < 475.
    # Innermost covering half: cudnn_convolution.
    gpu = [("k0", 10, 100, 1, 5, 1, False), ("k1", 1100, 1200, 1040, 1050, 1, False)]
    ops = [("aten::conv2d", 90, 1060, 1), ("aten::cudnn_convolution", 120, 1055, 1), ("aten::empty", 130, 400, 1)]
    (g,) = gap_causes(_trace(gpu, ops, [("step_0", 0, 2000, 1)]), min_ns=500)
    assert (g.op_name, g.op_overlap_ns, g.op_dur_ns) == ("aten::cudnn_convolution", 930, 935)
    # within: innermost enclosing [1040, 1050) lasting >= 500: cudnn_convolution again
    assert (g.within, g.within_dur_ns, g.launch_wait_ns) == ("aten::cudnn_convolution", 935, 950)


def test_many_short_ops_give_no_single_cause():
    # Window [100, 1050) = 950; four disjoint ops of 200 each: none covers 475. The range
    # "step_0" [0, 2000) is the step: a container.
    gpu = [("k0", 10, 100, 1, 5, 1, False), ("k1", 1100, 1200, 1040, 1050, 1, False)]
    ops = [(f"aten::op{i}", 100 + 220 * i, 300 + 220 * i, 1) for i in range(4)]
    (g,) = gap_causes(_trace(gpu, ops, [("step_0", 0, 2000, 1)]), min_ns=500)
    assert g.op_name is None and g.op_overlap_ns is None and g.step == "step_0"


def test_other_threads_and_submitted_ops_are_not_causes():
    # The op after the gap is launched by thread 2; a long op on thread 1 overlaps the gap
    # but is not the launching thread's. Thread 2 sat in "backward_op" [150, 990): 840 of the
    # window [100, 1000).
    gpu = [("k0", 10, 100, 1, 5, 1, False), ("k1", 1100, 1200, 990, 1000, 2, False)]
    ops = [("main_thread_op", 50, 1500, 1), ("backward_op", 150, 990, 2)]
    (g,) = gap_causes(_trace(gpu, ops), min_ns=500)
    assert (g.op_name, g.op_overlap_ns) == ("backward_op", 840)
    # Launch call ended (at 80) before the gap began (at 100): the op was already submitted.
    gpu = [("k0", 10, 100, 1, 5, 1, False), ("k1", 1100, 1200, 70, 80, 1, False)]
    (g,) = gap_causes(_trace(gpu, [("aten::op", 60, 2000, 1)]), min_ns=500)
    assert g.op_name is None and g.launch_wait_ns == 0


def test_gap_between_steps_is_measured_against_the_whole_trace():
    # Steps step_0 [0, 200) and step_1 [1500, 3000) (same family, two of them); the gap
    # [100, 1600) starts inside step_0, so step_0 is the step; "data" [210, 1400) on thread 1
    # covers 1190 of the window [100, 1510).
    gpu = [("k0", 10, 100, 1, 5, 1, False), ("k1", 1600, 1700, 1500, 1510, 1, False)]
    ranges = [("step_0", 0, 200, 1), ("step_1", 1500, 3000, 1), ("data", 210, 1400, 1)]
    (g,) = gap_causes(_trace(gpu, (), ranges), min_ns=500)
    assert (g.op_name, g.op_overlap_ns, g.step) == ("data", 1190, "step_0")


def _events(path):
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _plain_gaps(events):
    """Idle gaps of the merged GPU ops, and each gap's next op's launch (ts, end, tid), read
    from the JSON: kernels/memcpy/memset by category, runtime calls by correlation."""
    gpu_cats = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
    ops = sorted((e["ts"], e["ts"] + e["dur"], e) for e in events if e.get("ph") == "X" and e.get("cat") in gpu_cats)
    rt = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "Runtime")
          and "correlation" in e.get("args", {})}
    out, hi = [], None
    for s, e, ev in ops:
        if hi is not None and s > hi:
            out.append((hi, s, rt.get(ev["args"].get("correlation"))))
        hi = e if hi is None else max(hi, e)
    return out


def test_resnet_2021_causes_agree_with_the_json():
    # For each gap of >= 300 us: CPU ops ("Operator"/"cpu_op") of the launching thread that
    # overlap the host window and cover half of it, leaving out the ProfilerStep ops (each
    # encloses its whole step); the cause must be the shortest of them, None when there is none.
    events = _events(RESNET)
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("Operator", "cpu_op")]
    tr = load_inputs([RESNET]).traces[0]
    causes = {c.start_ns: c for c in gap_causes(tr, min_ns=300_000)}
    plain = [(a, b, launch) for a, b, launch in _plain_gaps(events) if b - a >= 300]
    assert len(plain) == len(causes) == 14
    named = 0
    for a, b, launch in plain:
        c = next(c for s, c in causes.items() if abs(s / 1000 - a) < 0.01)
        w1 = min(b, launch["ts"] + launch["dur"])
        cover = [(e["dur"], e["name"]) for e in cpu if e["tid"] == launch["tid"] and not e["name"].startswith("ProfilerStep#")
                 and min(e["ts"] + e["dur"], w1) - max(e["ts"], a) >= 0.5 * (w1 - a)]
        expected = min(cover)[1] if cover else None
        assert c.op_name == expected, (a, cover)
        named += expected is not None
    assert named == 10
    # the longest gap (2.62 ms) is spent in the autograd thread's AccumulateGrad, not "inside a step"
    top = max(causes.values(), key=lambda c: c.dur_ns)
    assert top.op_name == "torch::autograd::AccumulateGrad" and top.step == "ProfilerStep#8"


def test_h200_decode_gaps_are_cudnn_plan_building():
    # Every >= 1 ms gap of the Llama decode trace: the host sat in aten::_cudnn_attention_forward
    # (15 gaps, the existing cpu_stall test reads them from the JSON).
    causes = gap_causes(load_inputs([H200_LLAMA]).traces[0])
    assert len(causes) == 15
    assert {c.op_name for c in causes} == {"aten::_cudnn_attention_forward"}
    assert all(c.op_overlap_ns >= 0.5 * c.launch_wait_ns for c in causes)
    assert {c.step.rsplit("_", 1)[0] for c in causes} == {"decode"}


@pytest.mark.parametrize("n_gaps", [2000])
def test_many_gaps_many_ops(n_gaps):
    # n gaps of 1000 ns; in each, a 600-ns op on the launching thread: every gap names its op.
    gpu, ops = [], []
    for i in range(n_gaps + 1):
        t = i * 2000
        gpu.append((f"k{i}", t, t + 1000, t - 10, t - 5, 1, False))
        if i < n_gaps:
            ops.append((f"op{i % 7}", t + 1100, t + 1700, 1))
    causes = gap_causes(_trace(gpu, ops), min_ns=500, limit=n_gaps)
    assert len(causes) == n_gaps
    assert all(c.op_name == f"op{(c.start_ns // 2000) % 7}" and c.op_overlap_ns == 600 for c in causes)
