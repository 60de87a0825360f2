"""GpuOps and IdleGaps (the GPU ops of a trace built once, for every renderer and exporter),
checked against a plain gzip + json reading of the H200 Llama Kineto trace: the ops, their
launch calls joined by correlation id, and the idle gaps between merged busy periods."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import H200_LLAMA

from tracestory.analysis import analyze
from tracestory.analysis.facts import facts_for
from tracestory.ingest import load_inputs

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _ns(us: float) -> int:
    return round(us * 1000)


@pytest.fixture(scope="module")
def raw():
    with gzip.open(H200_LLAMA, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    return gpu, launch


@pytest.fixture(scope="module")
def facts():
    return facts_for(analyze(load_inputs([H200_LLAMA]).traces[0]))


def test_every_gpu_op_once_with_its_launch(raw, facts):
    gpu, launch = raw
    g = facts.gpu_ops
    assert len(g) == len(gpu) and g.kernel_count == sum(e["cat"] == "kernel" for e in gpu)
    # (start, end, launch start) of every op, as a multiset, from the file and from GpuOps
    want = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]),
                   _ns(launch[e["args"]["correlation"]]["ts"]) if e["args"].get("correlation") in launch else -1)
                  for e in gpu)
    got = sorted(zip(g.start_ns.tolist(), g.end_ns.tolist(), g.launch_start_ns.tolist(), strict=True))
    assert got == want
    assert (g.launch_start_ns >= 0).sum() > 0.9 * len(g)
    # start order: non-decreasing starts
    assert (np.diff(g.start_ns[g.order]) >= 0).all()


def test_idle_gaps_between_merged_busy_periods(raw, facts):
    gpu, _ = raw
    spans = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in gpu)
    gaps, end = [], spans[0][1]
    for s, e in spans[1:]:
        if s > end:
            gaps.append((end, s))
        end = max(end, e)
    idle = facts.idle
    assert list(zip(idle.start_ns.tolist(), idle.end_ns.tolist(), strict=True)) == gaps
    g = facts.gpu_ops
    # the op after each gap starts at its end; the op before it ends at its start
    assert (g.start_ns[idle.after] == idle.end_ns).all() and (g.end_ns[idle.before] == idle.start_ns).all()
    assert ((idle.launch_wait_ns >= 0) & (idle.launch_wait_ns <= idle.end_ns - idle.start_ns)).all()
    # the causes the report tells are among these gaps
    assert {c.start_ns for c in facts.gaps} <= set(idle.start_ns.tolist())
