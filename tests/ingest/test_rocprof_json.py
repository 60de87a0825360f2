"""The rocprof (v1) JSON reader against a plain json/gzip reading of the same real file.

The file is ROCm/rocm-blogs' ``--hip-trace`` output of a torch add on an MI210
(tests/data/corpus/kineto_public/PROVENANCE.md). The second source here groups its complete events
by the ``process_name`` metadata, the way the format is documented in the reader's docstring, and
reads ``args.BeginNs``/``EndNs`` and the calls' argument text itself.
"""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest
from conftest import H200_LLAMA, TEST_DATA

from tracestory.analysis.links import launch_index
from tracestory.analysis.producer import detect_producer
from tracestory.cli import main
from tracestory.errors import TraceFormatError
from tracestory.ingest import load_file, sniff
from tracestory.ingest.rocprof_json import load_rocprof_json
from tracestory.trace import MEMOP_KINDS

ROCPROF = TEST_DATA / "corpus" / "kineto_public" / "rocm-blogs__mi210_rocprof_hip_trace_torch_add.json.gz"


def _plain():
    """(document, {process name: [its complete events]}) read with json + gzip only."""
    doc = json.loads(gzip.decompress(ROCPROF.read_bytes()))
    names = {str(e["pid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    by_proc: dict[str, list] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            by_proc.setdefault(names[str(e["pid"])], []).append(e)
    return doc, by_proc


def _gpu_events(by_proc):
    return [e for name, evs in by_proc.items() if re.fullmatch(r"GPU\d+", name) for e in evs]


@pytest.fixture(scope="module")
def trace():
    kind, traces = load_file(ROCPROF)
    assert kind == "traces" and len(traces) == 1
    return traces[0]


def test_sniffed_as_rocprof_and_kineto_stays_kineto():
    assert sniff(ROCPROF) == "rocprof-json"
    assert sniff(H200_LLAMA) == "kineto"


def test_kernels_equal_a_plain_reading(trace):
    _, by_proc = _plain()
    gpu = _gpu_events(by_proc)
    assert trace.meta.source_format == "rocprof-json"
    assert len(trace.kernels) == len(gpu)
    assert sorted(trace.names(trace.kernels["name"]).tolist()) == sorted(e["name"] for e in gpu)
    total = sum(int(e["args"]["EndNs"]) - int(e["args"]["BeginNs"]) for e in gpu)
    assert int(trace.kernels.dur_ns.sum()) == total
    assert sorted(trace.kernels["start_ns"].tolist()) == sorted(int(e["args"]["BeginNs"]) for e in gpu)
    # the device is the n of the GPU<n> process the kernel sits in (GPU2 here, as args.dev-id says)
    assert trace.kernels["device"].tolist() == [int(e["args"]["dev-id"]) for e in gpu]


def test_copies_equal_a_plain_reading(trace):
    _, by_proc = _plain()
    copies = sorted(by_proc["COPY"], key=lambda e: int(e["args"]["BeginNs"]))
    assert len(trace.memops) == len(copies)
    assert trace.memops["start_ns"].tolist() == [int(e["args"]["BeginNs"]) for e in copies]
    assert trace.memops["end_ns"].tolist() == [int(e["args"]["EndNs"]) for e in copies]
    # each copy is linked to its hipMemcpyWithStream call: bytes and direction come from the call's
    # own text, "sizeBytes(N) ... kind(K)", here read in call order (calls and copies are in the same order)
    calls = sorted((e for e in by_proc["CPU HIP API"] if e["name"].startswith("hipMemcpy")),
                   key=lambda e: int(e["args"]["BeginNs"]))
    assert len(calls) == len(copies)
    size = [int(re.search(r"sizeBytes\((\d+)\)", e["args"]["args"]).group(1)) for e in calls]
    hip_kind = {1: "memcpy_htod", 2: "memcpy_dtoh"}
    kinds = [hip_kind[int(re.search(r"kind\((\d+)\)", e["args"]["args"]).group(1))] for e in calls]
    assert trace.memops["bytes"].tolist() == size
    assert [MEMOP_KINDS[k] for k in trace.memops["kind"]] == kinds
    # the copy names agree with the direction the call asked for
    assert [n.split()[1] for n in trace.names(trace.memops["name"])] == [
        "HtoD" if k == "memcpy_htod" else "DtoH" for k in kinds]


def test_api_calls_and_their_links(trace):
    _, by_proc = _plain()
    hip = by_proc["CPU HIP API"]
    assert len(trace.api) == len(hip)
    assert sorted(trace.names(trace.api["name"]).tolist()) == sorted(e["name"] for e in hip)
    assert set(trace.api["tid"].tolist()) == {int(e["args"]["tid"]) for e in hip}
    # every GPU op of this file has a flow from its call: the kernel's is the hipLaunchKernel
    row = launch_index(trace, trace.kernels)
    assert row.tolist() != [-1] and trace.name(int(trace.api["name"][row[0]])) == "hipLaunchKernel"
    launch = next(e for e in hip if e["name"] == "hipLaunchKernel")
    assert int(trace.api["start_ns"][row[0]]) == int(launch["args"]["BeginNs"])
    assert (launch_index(trace, trace.memops) >= 0).all()
    # grid and block of the kernel from the launch's text: numBlocks({z(1) y(1) x(1}) dimBlocks(... x(256})
    assert (int(trace.kernels["grid_x"][0]), int(trace.kernels["block_x"][0])) == (1, 256)


def test_producer_says_rocm(trace):
    _, by_proc = _plain()
    # the second source: every call of the CPU HIP API process is a HIP runtime call
    assert all(e["name"].lstrip("_").startswith("hip") for e in by_proc["CPU HIP API"])
    assert detect_producer(trace).platform == "ROCm"


def test_devices_from_rocminfo(trace):
    doc, _ = _plain()
    other = doc["otherData"]
    gpu_agents = sorted(int(k.split(".")[0][5:]) for k in other
                         if k.endswith(".DeviceType") and other[k] == "GPU")
    # the file's only GPU events sit in GPU2: rocminfo's third GPU agent
    third = f"Agent{gpu_agents[2]}"
    assert [d.id for d in trace.meta.devices] == [2]
    dev = trace.meta.devices[0]
    assert other[f"{third}.MarketingName"] in dev.name and other[f"{third}.Name"] in dev.name
    assert dev.sm_count == int(other[f"{third}.ComputeUnit"])
    assert trace.meta.warnings == ()


def test_report_exits_0_and_names_the_platform(tmp_path, capsys):
    out = tmp_path / "r.md"
    assert main(["report", str(ROCPROF), "-o", str(out)]) == 0
    text = out.read_text()
    assert "ROCm" in text and "MI210" in text
    assert "ProfilerActivity.CUDA" not in text


# --------------------------------------------------------------------------- damaged or other input
def _write(tmp_path, doc, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_dropped_events_are_stated(tmp_path):
    doc, _ = _plain()
    events = doc["traceEvents"]
    gpu_pids = {str(e["pid"]) for e in events if e.get("ph") == "M" and str(e.get("args", {}).get("name", "")).startswith("GPU")}
    copy_events = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("Copy")]
    del copy_events[0]["args"]["BeginNs"]                       # one copy without its exact start
    events.append({"args": {"name": "CPU HSA API"}, "ph": "M", "pid": 3, "name": "process_name"})
    events.append({"ph": "X", "name": "hsa_queue_create", "pid": "3", "tid": "517", "ts": "1", "dur": "1",
                   "args": {"BeginNs": "1000", "EndNs": "2000"}})
    t = load_rocprof_json(_write(tmp_path, doc))
    assert len(t.memops) == len(copy_events) - 1
    assert len(t.kernels) == sum(1 for e in events if e.get("ph") == "X" and str(e["pid"]) in gpu_pids)
    assert any("1 'COPY' events without a usable args.BeginNs/EndNs" in w for w in t.meta.warnings)
    assert any("1 complete events of process 'CPU HSA API' not read" in w for w in t.meta.warnings)


def test_no_gpu_activity_is_refused_in_one_line(tmp_path):
    doc, _ = _plain()
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not (e.get("ph") == "X" and str(e["pid"]) != "2")]
    p = _write(tmp_path, doc)
    with pytest.raises(TraceFormatError) as e:
        load_file(p)
    msg = str(e.value)
    assert "\n" not in msg and "none on the GPU" in msg and "rocprof" in msg
    assert "ProfilerActivity" not in msg


def test_a_json_that_is_neither_keeps_the_kineto_refusal(tmp_path, capsys):
    p = _write(tmp_path, {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1,
                                           "pid": 1, "tid": 1}]})
    assert sniff(p) == "kineto"
    assert main(["report", str(p), "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected GPU activity" in err[0]


def test_invalid_json_is_one_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"traceEvents":[{"args":{"name":"CPU HIP API"},"ph":"M","pid":2,')
    assert sniff(p) == "rocprof-json"
    with pytest.raises(TraceFormatError) as e:
        load_file(p)
    assert "invalid JSON" in str(e.value) and "\n" not in str(e.value)


def test_flow_links_survive_a_shuffled_event_order(tmp_path, trace):
    doc, _ = _plain()
    rng = np.random.default_rng(1)
    order = rng.permutation(len(doc["traceEvents"]))
    doc["traceEvents"] = [doc["traceEvents"][i] for i in order]
    t = load_rocprof_json(_write(tmp_path, doc))
    assert t.memops["bytes"].tolist() == trace.memops["bytes"].tolist()
    assert (launch_index(t, t.kernels) >= 0).all()


def test_a_rank_source_too():
    from tracestory.ingest.ranks import load_source, rank_sources

    (source,) = rank_sources([ROCPROF])
    assert source.kind == "rocprof-json"
    (t,) = load_source(source)
    assert t.meta.source_format == "rocprof-json" and len(t.kernels) == len(_gpu_events(_plain()[1]))
