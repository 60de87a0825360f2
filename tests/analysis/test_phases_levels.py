"""Which level of ranges the phases are, and which numbered families are steps: layer stacks,
restarting numbers, low coverage and the training structure (forward / backward / optimizer).

Hand-built traces with the expected phases written down, and the real 2021 ResNet-50 training
trace (V100) with its step markers taken away, checked against a plain JSON reading."""

from __future__ import annotations

import dataclasses
import gzip
import json

import numpy as np
import pytest
from conftest import TEST_DATA

from tracestory.analysis.phases import phases
from tracestory.ingest import load_inputs
from tracestory.trace import CPU_SIDE, StringPool, TraceMeta, build_trace, make_table

RESNET = TEST_DATA / "field" / "pytorch_kineto__v100_resnet50_tb_plugin_sample.pt.trace.json.gz"


def _trace(ranges, kernels, ops=()):
    """ranges: (name, start, end) on thread 1; kernels: (name, launch start) each running
    [launch + 10, launch + 20); ops: (name, start, end, tid)."""
    pool = StringPool()
    n = len(kernels)
    corr = list(range(1, n + 1))
    tables = {
        "kernels": make_table("kernels", name=pool.encode([k[0] for k in kernels]),
                              start_ns=[k[1] + 10 for k in kernels], end_ns=[k[1] + 20 for k in kernels],
                              correlation=corr, device=[0] * n, stream=[7] * n),
        "api": make_table("api", name=pool.encode(["cudaLaunchKernel"] * n), start_ns=[k[1] for k in kernels],
                          end_ns=[k[1] + 2 for k in kernels], correlation=corr, tid=[1] * n, pid=[1] * n),
    }
    if ranges:
        tables["ranges"] = make_table("ranges", name=pool.encode([r[0] for r in ranges]),
                                      start_ns=[r[1] for r in ranges], end_ns=[r[2] for r in ranges],
                                      side=[CPU_SIDE] * len(ranges), tid=[1] * len(ranges), pid=[1] * len(ranges),
                                      depth=[-1] * len(ranges))
    if ops:
        tables["ops"] = make_table("ops", name=pool.encode([o[0] for o in ops]), start_ns=[o[1] for o in ops],
                                   end_ns=[o[2] for o in ops], tid=[o[3] for o in ops], pid=[1] * len(ops))
    return build_trace(TraceMeta(source_path="hand.sqlite", source_format="nsys-sqlite"), pool, **tables)


def _layers(names, t0=0, kernels=("qkv", "attn", "mlp")):
    """Ranges named ``names`` one after the other, 100 ns each, each launching ``kernels``."""
    ranges, ks = [], []
    for i, name in enumerate(names):
        s = t0 + 100 * i
        ranges.append((name, s, s + 90))
        ks += [(k, s + 1 + 20 * j) for j, k in enumerate(kernels)]
    return ranges, ks


def test_layers_under_one_pass_are_not_steps():
    # One "forward" [0, 400) around layer_0..layer_3 (same kernels each): the layers hold all the
    # work, but they are a stack of layers, so the lone pass stays the phase.
    ranges, ks = _layers([f"layer_{i}" for i in range(4)])
    ph = phases(_trace([("forward", 0, 400)] + ranges, ks))
    assert [p.name for p in ph.phases] == ["forward"]
    assert ph.phases[0].kernel_count == 12
    assert ph.families == ()
    assert ph.reason.startswith("forward kept: the repeated ranges inside it (layer*) are not steps")
    assert {s.name for s in ph.subphases} == {f"layer_{i}" for i in range(4)}


@pytest.mark.parametrize("name", ["layer_{}", "model.decoder.layers.{}", "transformer.h.{}", "blocks.{}",
                                  "TransformerBlock{}"])
def test_layer_index_names_are_no_steps_at_the_top(name):
    # No wrapper: the layers are the phases (nothing else cuts the trace), but no trend or
    # outliers are told about them, and not_steps says why.
    ranges, ks = _layers([name.format(i) for i in range(4)])
    ph = phases(_trace(ranges, ks))
    assert len(ph.phases) == 4 and ph.families == () and ph.outliers == ()
    ((fam, why),) = ph.not_steps
    assert fam == ph.phases[0].family and "layers" in why


def test_numbers_that_restart_are_not_steps():
    # unit_0..unit_2 twice (an engine call per pass, its units numbered inside it)
    ranges, ks = _layers([f"unit_{i}" for i in (0, 1, 2, 0, 1, 2)])
    ph = phases(_trace(ranges, ks))
    assert ph.families == ()
    assert ph.not_steps == (("unit", "its numbers restart: it is nested in a repeated range that is the step"),)


def test_numbers_against_time_are_not_steps():
    ranges, ks = _layers([f"it_{i}" for i in (2, 0, 1)])
    assert phases(_trace(ranges, ks)).not_steps == (("it", "its numbers do not grow with time"),)


def test_a_decode_loop_stays_steps():
    ranges, ks = _layers([f"decode_{i}" for i in range(4)])
    ph = phases(_trace([("generate", 0, 400)] + ranges, ks))
    assert [p.name for p in ph.phases] == [f"decode_{i}" for i in range(4)]
    assert [f.family for f in ph.families] == ["decode"] and ph.not_steps == ()
    assert ph.reason == "the repeated ranges under generate, holding at least 90% of its GPU ops (100% of the kernel time)"


def _training_trace(optimizer_as_ranges: bool):
    # Two iterations: forward kernels f1..f8 at 0..700 (launches 10, 100, ..., 710), backward on
    # thread 2 ("autograd::engine::evaluate_function: MmBackward0" ops at [800, 1000)) launching
    # b1, b2, and "Optimizer.step#SGD.step" [1000, 1100) launching one kernel "sgd".
    # Second iteration: the same shifted by 2000.
    ks, opt, bwd = [], [], []
    for it in range(2):
        t = 2000 * it
        ks += [(f"f{j}", t + 10 + 100 * j) for j in range(8)]
        ks += [("b1", t + 810), ("b2", t + 900), ("sgd", t + 1010)]
        opt.append(("Optimizer.step#SGD.step", t + 1000, t + 1100))
        bwd.append(("autograd::engine::evaluate_function: MmBackward0", t + 800, t + 1000, 2))
    ranges = opt if optimizer_as_ranges else []
    ops = bwd + ([] if optimizer_as_ranges else [(n, s, e, 1) for n, s, e in opt])
    return _trace(ranges, ks, ops)


@pytest.mark.parametrize("optimizer_as_ranges", [True, False])
def test_training_structure_over_low_coverage_optimizer_ranges(optimizer_as_ranges):
    ph = phases(_training_trace(optimizer_as_ranges))
    # The optimizer ranges hold 2 of 22 kernels (all 10 ns): 9% < 50%.
    assert ph.source == "training"
    assert [(p.name, p.start_ns, p.end_ns, p.kernel_count) for p in ph.phases] == [
        ("forward#0", 10, 800, 8), ("backward#0", 800, 1000, 2), ("optimizer#0", 1000, 1100, 1),
        ("forward#1", 1100, 2800, 8), ("backward#1", 2800, 3000, 2), ("optimizer#1", 3000, 3100, 1)]
    assert ph.coverage == 1.0
    if optimizer_as_ranges:
        assert "the annotated ranges (Optimizer.step#SGD.step) hold 9% of the kernel time, under 50%" in ph.reason


def test_low_coverage_without_training_gives_one_phase():
    # Two ranges holding 1 of 10 kernels, no optimizer step, no autograd op.
    ks = [(f"k{i}", 100 * i) for i in range(10)]
    ph = phases(_trace([("setup", 0, 50), ("setup", 5000, 5050)], ks))
    assert ph.source == "none" and [p.name for p in ph.phases] == ["whole trace"]
    assert ph.reason == ("one phase: the annotated ranges (setup) hold 10% of the kernel time, under 50%: not "
                         "the step structure, and no training loop to cut it by")


def _json_events(path):
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def test_resnet_training_without_step_markers():
    # The 2021 ResNet-50 trace with its ProfilerStep#N ops taken away: forward / backward /
    # optimizer per iteration. Expected from the JSON: optimizer#i = the i-th
    # "Optimizer.step#SGD.step" op; backward#i starts at the first op named *Backward or
    # torch::autograd::AccumulateGrad after the previous optimizer step; kernels per phase =
    # kernels whose Runtime call (by correlation) starts inside it.
    tr = load_inputs([RESNET]).traces[0]
    names = np.array([tr.name(int(c)) for c in tr.ops["name"]], dtype=object)
    keep = np.flatnonzero([not n.startswith("ProfilerStep#") for n in names])
    ph = phases(dataclasses.replace(tr, ops=tr.ops.take(keep)))
    assert ph.source == "training"

    ev = [e for e in _json_events(RESNET) if e.get("ph") == "X"]

    def us(x):  # Kineto 2021 writes integer epoch microseconds
        return int(x) * 1000

    def near(a, b):  # the loader reads them as float64 (256 ns apart at 1.6e18 ns): within 1 us
        return abs(a - b) < 1000

    opt = sorted((us(e["ts"]), us(e["ts"] + e["dur"])) for e in ev if e["name"] == "Optimizer.step#SGD.step")
    bwd = sorted(us(e["ts"]) for e in ev if e.get("cat") == "Operator"
                 and (e["name"].endswith("Backward") or e["name"] == "torch::autograd::AccumulateGrad"))
    assert len(opt) == 6
    got = {p.name: p for p in ph.phases}
    prev = None
    for i, (o0, o1) in enumerate(opt):
        assert near(got[f"optimizer#{i}"].start_ns, o0) and near(got[f"optimizer#{i}"].end_ns, o1)
        first_bwd = min(b for b in bwd if (prev is None or b >= prev) and b < o0)
        assert near(got[f"backward#{i}"].start_ns, first_bwd)
        assert got[f"forward#{i}"].end_ns == got[f"backward#{i}"].start_ns
        prev = o1
    runtime = {e["args"]["correlation"]: us(e["ts"]) for e in ev if e.get("cat") == "Runtime" and "correlation" in e.get("args", {})}
    launches = sorted(runtime[e["args"]["correlation"]] for e in ev if e.get("cat") == "Kernel"
                      and e["args"].get("correlation") in runtime)
    for p in ph.phases:
        assert p.kernel_count == sum(p.start_ns <= t < p.end_ns for t in launches), p.name
    assert {f.family for f in ph.families} == {"forward", "backward", "optimizer"}
