"""Perfetto / Chrome-trace export: every expected number comes from the input files themselves
(plain gzip + json over the Kineto fixtures, sqlite3 over the Nsight Systems fixture)."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from collections import Counter, defaultdict
from itertools import pairwise

import pytest

from conftest import A100_NCCL, H200_LLAMA, NSYS_2022
from tracestory.analysis import analyze
from tracestory.analysis.facts import facts_for
from tracestory.cli import main as cli_main
from tracestory.errors import UsageError
from tracestory.export.perfetto import PerfettoExport, export_perfetto
from tracestory.ingest import load_inputs

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATS = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")


def _raw(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _ns(us: float) -> int:
    return round(us * 1000)


def _export(path, tmp_path, name="out.json.gz"):
    runs = [facts_for(analyze(t)) for t in load_inputs([path]).traces]
    result = export_perfetto(runs, tmp_path / name)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(tmp_path / name, "rt") as f:
        doc = json.load(f)
    return result, doc


def _tracks(doc) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def _slices_by_track(doc) -> dict[str, list[dict]]:
    """X events per track name, overlap tracks folded into their base track."""
    names = _tracks(doc)
    out = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            out[re.sub(r" \(overlap \d+\)$", "", names[(e["pid"], e["tid"])])].append(e)
    return out


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    return _export(H200_LLAMA, tmp_path_factory.mktemp("h200"))


@pytest.fixture(scope="module")
def a100(tmp_path_factory):
    return _export(A100_NCCL, tmp_path_factory.mktemp("a100"), name="out.json")


@pytest.mark.parametrize("which", ["h200", "a100"])
def test_stream_tracks_hold_every_gpu_op(which, request):
    path = {"h200": H200_LLAMA, "a100": A100_NCCL}[which]
    _, doc = request.getfixturevalue(which)
    want_n, want_us = Counter(), Counter()
    for e in _raw(path):
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            key = f"GPU {e['args']['device']} stream {e['args']['stream']}"
            want_n[key] += 1
            want_us[key] += e["dur"]
    got = {k: v for k, v in _slices_by_track(doc).items() if k.startswith("GPU ") and " stream " in k}
    assert set(got) == set(want_n)
    for key, events in got.items():
        assert len(events) == want_n[key], key
        # ns rounding of each event's start and end: at most 1 ns per event.
        assert sum(e["dur"] for e in events) == pytest.approx(want_us[key], abs=1e-3 * len(events)), key
    if which == "a100":
        assert set(got) == {"GPU 0 stream 7", "GPU 0 stream 40"}


def test_gpu_slices_carry_their_category(h200):
    _, doc = h200
    gpu = [e for k, v in _slices_by_track(doc).items() if " stream " in k for e in v]
    assert gpu and all(e["cat"] == e["args"]["category"] for e in gpu)
    for e in gpu:
        if "nvjet" in e["name"] or "splitKreduce" in e["name"]:  # cuBLAS GEMMs and their split-K reductions
            assert e["cat"] == "gemm", e["name"]
        elif e["name"].startswith("Memcpy"):
            assert e["cat"] == "memcpy"
        elif e["name"].startswith("Memset"):
            assert e["cat"] == "memset"
    cats = Counter(e["cat"] for e in gpu)
    assert {"gemm", "attention", "elementwise", "memcpy"} <= set(cats)


def test_phases_are_the_fixtures_annotations(h200):
    _, doc = h200
    raw = sorted((e["name"], _ns(e["ts"]), _ns(e["ts"]) + round(e["dur"] * 1000)) for e in _raw(H200_LLAMA)
                 if e.get("ph") == "X" and e.get("cat") == "user_annotation")
    assert [r[0] for r in raw].count("prefill") == 1 and len(raw) == 17
    tracks = _slices_by_track(doc)
    got = sorted((e["name"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in tracks["Phases (user_annotation)"])
    assert [g[0] for g in got] == [r[0] for r in raw]
    for (_, s0, e0), (_, s1, e1) in zip(got, raw):
        assert abs(s0 - s1) <= 1 and abs(e0 - e1) <= 2
    # Every phase launched GPU work here, so each has a GPU span too.
    assert sorted(e["name"] for e in tracks["Phases (GPU span)"]) == [r[0] for r in raw]
    assert all(e["args"]["family"] in ("prefill", "decode") for e in tracks["Phases (GPU span)"])


def test_idle_gaps_sum_to_window_minus_busy(h200):
    _, doc = h200
    ivs = sorted((_ns(e["ts"]), _ns(e["ts"] + e["dur"])) for e in _raw(H200_LLAMA)
                 if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    busy, cur_s, cur_e = 0, *ivs[0]
    for s, e in ivs[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    idle = (max(e for _, e in ivs) - ivs[0][0]) - busy
    gaps = _slices_by_track(doc)["GPU idle gaps"]
    assert abs(sum(_ns(g["dur"]) for g in gaps) - idle) <= 2 * len(gaps)
    for g in gaps:
        a = g["args"]
        assert a["launch_wait_ns"] + a["other_ns"] == a["dur_ns"] and a["cause"]
    # The long decode gaps are explained by the CPU op the host was in; check it against the raw
    # events: a cpu_op of that name overlaps each such gap.
    named = [g for g in gaps if g["name"].startswith("idle: CPU in ")]
    assert named
    cpu_ops = [e for e in _raw(H200_LLAMA) if e.get("cat") == "cpu_op"]
    for g in named:
        op = g["name"].removeprefix("idle: CPU in ")
        assert any(e["name"] == op and e["ts"] < g["ts"] + g["dur"] and e["ts"] + e["dur"] > g["ts"]
                   for e in cpu_ops), op


def test_cpu_threads_hold_every_cpu_event(a100):
    _, doc = a100
    want = Counter()
    for e in _raw(A100_NCCL):
        if e.get("ph") == "X" and e.get("cat") in CPU_CATS:
            want[f"CPU thread {e['tid']}"] += 1
    got = {k: len(v) for k, v in _slices_by_track(doc).items() if k.startswith("CPU thread")}
    assert got == dict(want)


@pytest.mark.parametrize("which,path", [("h200", H200_LLAMA), ("a100", A100_NCCL)])
def test_flows_pair_launch_calls_with_gpu_ops(which, path, request):
    result, doc = request.getfixturevalue(which)
    raw = _raw(path)
    launch_corr = {e["args"]["correlation"] for e in raw
                   if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}
    linked = sum(1 for e in raw if e.get("ph") == "X" and e.get("cat") in GPU_CATS
                 and e["args"].get("correlation") in launch_corr)
    flows = defaultdict(dict)
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            assert e["ph"] not in flows[e["id"]], "an id used twice"
            flows[e["id"]][e["ph"]] = e
    assert len(flows) == linked == result.flow_count
    assert all(set(f) == {"s", "f"} for f in flows.values())
    # Each end sits where a slice of the right kind is: the start on a launch call's start, the
    # end on a GPU op's start, on the tracks named in the events.
    names = _tracks(doc)
    starts = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            starts[(e["pid"], e["tid"], e["cat"])].add(e["ts"])
    for f in flows.values():
        s, t = f["s"], f["f"]
        assert names[(s["pid"], s["tid"])].startswith("CPU thread")
        assert any(s["ts"] in starts[(s["pid"], s["tid"], c)] for c in ("cuda_runtime", "cuda_driver"))
        assert names[(t["pid"], t["tid"])].startswith("GPU ") and t["bp"] == "e"
        assert any(t["ts"] in v for (p, tid, _), v in starts.items() if (p, tid) == (t["pid"], t["tid"]))


@pytest.mark.parametrize("which", ["h200", "a100"])
def test_every_track_nests(which, request):
    """The viewers stack a track's slices; a partial overlap on one track would be misdrawn."""
    _, doc = request.getfixturevalue(which)
    per = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            s = _ns(e["ts"])
            per[(e["pid"], e["tid"])].append((s, s + _ns(e["dur"])))
    for track, ivs in per.items():
        stack = []
        for s, e in sorted(ivs, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1], (track, s, e)
            stack.append(e)


def test_overlapping_kernels_get_an_overlap_track(h200):
    """Hopper's cuBLAS split-K reductions start ~100 ns before their GEMM ends (same stream)."""
    _, doc = h200
    ivs = sorted((_ns(e["ts"]), _ns(e["ts"] + e["dur"])) for e in _raw(H200_LLAMA)
                 if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    partial = sum(1 for (s0, e0), (s1, e1) in pairwise(ivs) if s1 < e0 < e1)
    assert partial > 0
    assert "GPU 0 stream 7 (overlap 1)" in _tracks(doc).values()


def test_memory_counters_match_the_samples(h200):
    _, doc = h200
    raw = [e for e in _raw(H200_LLAMA) if e.get("name") == "[memory]"]
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    alloc = [e for e in counters if "allocated_bytes" in e["args"]]
    assert len(alloc) == len(raw)
    want = sorted(e["args"]["Total Allocated"] for e in raw)
    assert sorted(e["args"]["allocated_bytes"] for e in alloc) == want


def test_several_ranks_one_process_each(tmp_path):
    analyses = [analyze(t) for t in load_inputs([A100_NCCL, H200_LLAMA]).traces]
    result = export_perfetto([facts_for(a) for a in analyses], tmp_path / "two.json.gz")
    assert isinstance(result, PerfettoExport) and result.process_count == 2
    with gzip.open(tmp_path / "two.json.gz") as f:
        doc = json.load(f)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == sorted(a.trace.label for a in analyses)
    assert {e["pid"] for e in doc["traceEvents"]} == set(procs)
    ids = [e["id"] for e in doc["traceEvents"] if e["ph"] == "s"]
    assert len(ids) == len(set(ids)) == result.flow_count
    assert doc["otherData"]["sources"] == [str(A100_NCCL), str(H200_LLAMA)]


def test_nsys_streams_match_sqlite(tmp_path):
    _, doc = _export(NSYS_2022, tmp_path, name="nsys.json")
    con = sqlite3.connect(f"file:{NSYS_2022}?mode=ro", uri=True)
    want = Counter()
    dur = Counter()
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        for dev, stream, n, d in con.execute(
                f"SELECT deviceId, streamId, count(*), sum(end - start) FROM {table} GROUP BY deviceId, streamId"):
            want[f"GPU {dev} stream {stream}"] += n
            dur[f"GPU {dev} stream {stream}"] += d
    got = {k: v for k, v in _slices_by_track(doc).items() if " stream " in k}
    assert {k: len(v) for k, v in got.items()} == dict(want)
    assert {k: sum(_ns(e["dur"]) for e in v) for k, v in got.items()} == dict(dur)
    nvtx = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()[0]
    cpu = sum(len(v) for k, v in _slices_by_track(doc).items() if k.startswith("CPU thread"))
    runtime = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    assert cpu == nvtx + runtime


def test_plain_json_unless_gz(tmp_path, a100):
    result, _ = a100
    assert result.path.read_bytes()[:1] == b"{"
    analyses = [analyze(t) for t in load_inputs([H200_LLAMA]).traces]
    export_perfetto(facts_for(analyses[0]), tmp_path / "one.json.gz")  # one trace's facts are accepted too
    assert (tmp_path / "one.json.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_cli_export(tmp_path, capsys):
    out = tmp_path / "cli.json.gz"
    assert cli_main(["export", "perfetto", str(H200_LLAMA), "-o", str(out), "--taxonomy", "moe"]) == 0
    assert str(out) in capsys.readouterr().out
    with gzip.open(out) as f:
        doc = json.load(f)
    assert doc["otherData"]["taxonomy"] == "moe"
    cats = {e["args"]["category"] for e in doc["traceEvents"] if e["ph"] == "X" and "category" in e.get("args", {})}
    assert cats and cats <= {"expert_gemm", "attention_gemm", "gate_gemm", "routing_permute", "quant_dequant",
                             "norm", "allreduce", "other"}
    # Refuses to overwrite an input.
    assert cli_main(["export", "perfetto", str(out), "-o", str(out)]) == 2


def test_no_analyses_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        export_perfetto([], tmp_path / "x.json")
