"""The Execution Story's model (analysis/story.py), checked against the demo trace read as plain
JSON: its phases are one `prefill` range and 16 `decode_N` ranges (user_annotation events)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from tracestory.analysis.results import analyze_inputs
from tracestory.analysis.story import FamilyStory, Loop, OpRun, PhaseStory
from tracestory.ingest import load_inputs

DEMO = Path(__file__).resolve().parents[2] / "src" / "tracestory" / "data" / "demo" / "llama2layer_eager_decode.trace.json.gz"


@pytest.fixture(scope="module")
def events():
    return json.loads(gzip.open(DEMO).read())["traceEvents"]


@pytest.fixture(scope="module")
def story():
    return analyze_inputs(load_inputs([DEMO])).runs[0].story


def _ranges(events, pred):
    return [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "user_annotation" and pred(e["name"])]


def _rows(events, ranges) -> tuple[int, int]:
    """M of aten::mm (first input) / aten::addmm (second input) started inside the ranges."""
    rows = []
    for e in events:
        if e.get("name") not in ("aten::mm", "aten::addmm") or not any(lo <= e["ts"] < hi for lo, hi in ranges):
            continue
        dims = e["args"]["Input Dims"]
        a = dims[1] if e["name"] == "aten::addmm" else dims[0]
        rows.append(int(np.prod(a[:-1])))
    return min(rows), max(rows)


def test_prefill_then_one_decode_family(story, events):
    assert story.source != "none" and story.phase_count == 17
    first, fam = story.blocks
    assert isinstance(first, PhaseStory) and first.name == "prefill"
    assert isinstance(fam, FamilyStory) and fam.family == "decode"
    assert [s.name for s in fam.steps] == [f"decode_{i}" for i in range(16)]
    # the representative is the median-time step (upper median of 16)
    times = sorted(fam.steps, key=lambda s: s.time_ns)
    assert fam.representative.name == times[8].name


def test_how_decode_differs_reads_the_gemm_shapes(story, events):
    d = story.summary.differs
    assert d.first == "prefill" and d.family == "decode"
    assert d.gemm_rows_first == _rows(events, _ranges(events, lambda n: n == "prefill"))
    assert d.gemm_rows_family == _rows(events, _ranges(events, lambda n: n.startswith("decode_")))
    assert d.family_is_gemv == (d.gemm_rows_family[1] <= 16)


def test_every_gpu_op_of_a_phase_is_in_its_segments(story):
    """The folded segments account for every op the phase holds (a loop's body counts x its repetitions)."""
    for ph in [b if isinstance(b, PhaseStory) else b.representative for b in story.blocks]:
        n = 0
        for s in ph.segments:
            if isinstance(s, OpRun):
                n += sum(g.count for g in s.groups)
            elif isinstance(s, Loop):
                assert sum(g.count for g in s.body) == s.period
                n += s.period * s.count
        assert n == ph.ops
