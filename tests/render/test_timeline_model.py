"""The interactive timeline's model and data block, checked against the trace files themselves.

Second sources: the Kineto JSON read here with ``json`` (GPU ops per stream, their durations,
the NCCL kernels), the findings' own evidence (the idle time a finding counts), and for the
page's script its SHA-256 recomputed with ``hashlib``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from collections import defaultdict

import numpy as np
import pytest

from conftest import A100_NCCL, H200_LLAMA
from tracestory.analysis.results import analyze_inputs
from tracestory.ingest import load_inputs
from tracestory.render.html import write_html
from tracestory.render.timeline_data import DENSITY_BINS, build_timeline
from tracestory.render.timeline_page import timeline_json, timeline_section

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _gpu_events(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS]


@pytest.fixture(scope="module")
def h200():
    return analyze_inputs(load_inputs([H200_LLAMA]))


@pytest.fixture(scope="module")
def a100():
    return analyze_inputs(load_inputs([A100_NCCL]))


def _lane(m, label):
    k = [ln.label for ln in m.lanes].index(label)
    sel = m.lane_of == k
    return m.start_ns[sel], m.end_ns_[sel], m.name[sel]


@pytest.mark.parametrize("which", ["h200", "a100"])
def test_stream_lanes_hold_every_gpu_op_of_the_file(which, request):
    results = request.getfixturevalue(which)
    path = H200_LLAMA if which == "h200" else A100_NCCL
    count, dur_ns = defaultdict(int), defaultdict(int)
    for e in _gpu_events(path):
        key = f"GPU {e['args']['device']} stream {e['args']['stream']}"
        count[key] += 1
        dur_ns[key] += round(e["dur"] * 1000)
    m = build_timeline(results)
    streams = [ln.label for ln in m.lanes if ln.kind == "stream"]
    assert sorted(streams) == sorted(count)
    for label in streams:
        s, e, _ = _lane(m, label)
        assert s.size == count[label]
        assert int((e - s).sum()) == pytest.approx(dur_ns[label], abs=s.size)  # 1 ns of rounding per op
        assert np.all(np.diff(s) >= 0)  # sorted by start within the lane
    assert m.dropped == 0 and m.density is None


def test_collectives_lane_holds_the_nccl_kernels(a100):
    nccl = sorted(round(e["dur"] * 1000) for e in _gpu_events(A100_NCCL) if e["name"].startswith("nccl"))
    m = build_timeline(a100)
    s, e, _ = _lane(m, "collectives")
    assert len(nccl) == 21 and sorted((e - s).tolist()) == pytest.approx(nccl, abs=1)


def test_data_block_round_trips(a100):
    m = build_timeline(a100)
    data = json.loads(timeline_json(m))
    assert data["unit"] == "us" and data["t0_ns"] == m.t0_ns
    spans = data["spans"]
    assert len(spans["d"]) == m.start_ns.size
    for k, lane in enumerate(data["lanes"]):
        off, n = lane["off"], lane["n"]
        starts = np.cumsum(spans["s"][off: off + n])  # delta-coded within the lane, in us
        sel = m.lane_of == k
        assert lane["label"] == m.lanes[k].label and n == sel.sum()
        assert starts == pytest.approx((m.start_ns[sel] - m.t0_ns) / 1000, abs=1e-3 * max(n, 1) ** 0.5)
        assert spans["d"][off: off + n] == pytest.approx((m.end_ns_[sel] - m.start_ns[sel]) / 1000, abs=5e-4)
    assert "<" not in timeline_json(m)


def test_cap_keeps_the_longest_spans_and_shades_all_of_them(h200):
    m = build_timeline(h200, max_spans=300)
    assert m.total_spans == 1797 and m.start_ns.size == 300 and m.dropped == 1497
    # Lanes of 17 (steps), 866 (idle) and 914 (stream) spans: the steps whole, the others 141 and
    # 142 of their longest (the smaller lane first: (300 - 17) // 2 = 141, then the rest).
    whole = build_timeline(h200)
    dropped_max = 0
    for k, want in zip(range(3), (17, 141, 142)):
        kept = np.sort((m.end_ns_ - m.start_ns)[m.lane_of == k])[::-1]
        every = np.sort((whole.end_ns_ - whole.start_ns)[whole.lane_of == k])[::-1]
        assert kept.size == want and np.array_equal(kept, every[:want])
        dropped_max = max(dropped_max, int(every[want:].max(initial=0)))
    assert m.dropped_max_ns == dropped_max > 0
    # The shading of the stream lane covers the busy time of every op of the file, dropped or not.
    k = [ln.label for ln in m.lanes].index("GPU 0 stream 7")
    busy_us = sum(e["dur"] for e in _gpu_events(H200_LLAMA))
    bin_us = (m.end_ns - m.t0_ns) / 1000 / DENSITY_BINS
    assert m.density.shape == (len(m.lanes), DENSITY_BINS)
    assert m.density[k].sum() * bin_us == pytest.approx(busy_us, rel=1e-6)
    page = timeline_section(m).html
    assert "embeds 300 of 1797 spans, the longest of each lane: 1497 spans of at most" in page
    assert len(json.loads(timeline_json(m))["density"]["lanes"][k]) == DENSITY_BINS


def test_finding_links_point_at_the_spans_they_are_about(h200):
    m = build_timeline(h200)
    links = {f.rule: f for f in m.findings}
    findings = {f.rule: f for f in h200.runs[0].findings}
    events = _gpu_events(H200_LLAMA)
    # The idle gaps: their total is the finding's evidence, and no GPU op of the file runs inside one.
    idle = links["gpu_idle"]
    ev = {e.label: e.value for e in findings["gpu_idle"].evidence}
    assert len(idle.windows_ns) == ev["idle gaps of 1 ms or more (longest 50)"] == 15
    assert sum(b - a for a, b in idle.windows_ns) == ev["idle time in them"]
    starts = np.array([e["ts"] * 1000 for e in events])
    ends = starts + np.array([e["dur"] * 1000 for e in events])
    for a, b in idle.windows_ns:
        assert not np.any((starts < b - 1) & (ends > a + 1)), (a, b)
    # The dominant category's top kernel: highlighted, the view spans its first to last run.
    top = next(e.value for e in findings["dominant_category"].evidence if e.label == "top kernel")
    dom = links["dominant_category"]
    assert dom.names == (top,)
    runs = [(e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in events if e["name"] == top]
    assert dom.view_ns[0] == pytest.approx(min(r[0] for r in runs), abs=1)
    assert dom.view_ns[1] == pytest.approx(max(r[1] for r in runs), abs=1)
    # The first decode step: one window, inside that step's CPU range up to the next step's end.
    first = links["first_step"]
    assert len(first.windows_ns) == 1 and "decode_0" in findings["first_step"].title
    with gzip.open(H200_LLAMA, "rt") as f:
        steps = {e["name"]: (e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in json.load(f)["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") == "user_annotation"}
    (a, b), = first.windows_ns
    assert steps["decode_0"][0] <= a < b <= steps["decode_1"][1]
    # A finding about the run as a whole has no link and says why.
    assert links["eager_fusion"].view_ns is None and "as a whole" in links["eager_fusion"].why


def test_page_runs_only_its_own_hashed_script(h200, tmp_path):
    md = tmp_path / "r.md"
    md.write_text("# Report\n\n#### 1. [HIGH] " + h200.runs[0].findings[0].title + "\n\ntext\n")
    page = write_html(md, tmp_path / "r.html", results=h200).read_text()
    scripts = re.findall(r"<script>(.*?)</script>", page, re.DOTALL)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert csp == f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"
    assert not re.search(r"https?://|\bsrc=|<link", scripts[0] + page.split("<main>")[1].split("<script>")[0])
    # Without results the page stays script-free.
    assert "<script" not in write_html(md, tmp_path / "plain.html").read_text()


def test_timeline_follows_the_executive_summary_and_is_in_the_contents(h200, tmp_path):
    md = tmp_path / "r.md"
    md.write_text("# Report\n\n## Executive Summary\n\nsummary\n\n## Environment\n\nenv\n")
    page = write_html(md, tmp_path / "r.html", results=h200).read_text()
    at = {k: page.index(k) for k in ('id="executive-summary"', 'id="interactive-timeline"', 'id="environment"')}
    assert at['id="executive-summary"'] < at['id="interactive-timeline"'] < at['id="environment"']
    toc = re.findall(r'<li><a href="#([^"]+)">', page.split('<nav class="toc">')[1].split("</nav>")[0])
    assert toc == ["executive-summary", "interactive-timeline", "environment"]


def test_ranks_get_their_own_lanes_and_their_findings_only_their_lanes():
    folder = H200_LLAMA.parents[1] / "multigpu" / "tp2_even"
    results = analyze_inputs(load_inputs([folder]))
    m = build_timeline(results)
    data = json.loads(timeline_json(m))
    for rank in (0, 1):
        events = _gpu_events(folder / "torch" / f"rank{rank}.trace.json.gz")
        nccl = {e["name"] for e in events if e["name"].startswith("nccl")}
        s, _, _ = _lane(m, f"rank {rank} · collectives")
        assert s.size == sum(e["name"].startswith("nccl") for e in events) > 0
        own = {k for k, ln in enumerate(m.lanes) if ln.label.startswith(f"rank {rank} · ")}
        label = next(r.trace.label for r in results.runs if r.trace.meta.rank == rank)
        comm = next(i for i, f in enumerate(m.findings) if f.rule == "communication" and f.trace == label)
        assert set(m.findings[comm].names) == nccl
        assert set(data["findings"][comm]["lanes"]) == own
    # A multi-GPU finding about the collectives reaches the lanes of both ranks.
    straggler = next(f for f in data["findings"] if f["rule"] == "multigpu_straggler")
    assert set(straggler["lanes"]) == set(range(len(m.lanes)))
