"""Memory over time (analyze.memory), its ASCII chart and PNG (report.memory), the memory rule.

Expected numbers come from a trace BUILT in this file from the documented Kineto ``[memory]``
instant-event format (FORMATS.md: ph "i", name "[memory]", args Total Allocated / Total
Reserved / Bytes / Device Id / Device Type) with every value worked out by hand below, from
plain ``json`` reads of the real H200 Kineto fixture, and from a direct ``sqlite3`` query of the
public Nsight Systems 2022 fixture.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from functools import lru_cache

import numpy as np
import pytest
from conftest import A100_NCCL, H200_LLAMA, NSYS_2022

from tracestory.analysis import analyze
from tracestory.analysis.claims import derive_findings
from tracestory.analysis.facts import facts_for
from tracestory.analysis.memory import binned, memory_timeline
from tracestory.ingest import load_inputs
from tracestory.ingest.kineto import load_kineto
from tracestory.render.memory import ALLOC, RESERVED, memory_section, plot_memory, render_memory_ascii

GIB = 1 << 30


# --------------------------------------------------------------------- a built trace


def _mem(ts_us, alloc, res, delta, device=0, dev_type=1):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
            "ts": ts_us, "args": {"Total Allocated": alloc, "Total Reserved": res, "Bytes": delta,
                                  "Device Id": device, "Device Type": dev_type, "Addr": 1}}


def _built(tmp_path, total_mem=8 * GIB):
    """One step range, an aten::mm with a nested aten::empty, one kernel, five GPU samples and
    one host sample. Times in us (Kineto's unit)."""
    x = lambda cat, name, ts, dur, **args: {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1,
                                            "ts": ts, "dur": dur, "args": args}
    events = [
        x("user_annotation", "step_a", 100.0, 100.0),
        x("cpu_op", "aten::empty", 120.0, 10.0),
        x("cpu_op", "aten::mm", 140.0, 30.0),
        x("cpu_op", "aten::empty", 150.0, 5.0),
        x("cuda_runtime", "cudaLaunchKernel", 141.0, 3.0, correlation=1),
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 145.0, "dur": 20.0,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
        _mem(110.0, 1 * GIB, 2 * GIB, 1 * GIB),
        _mem(121.0, 3 * GIB // 2, 2 * GIB, GIB // 2),
        _mem(130.0, 1000, 0, 1000, device=-1, dev_type=0),   # host tensor: not a GPU sample
        _mem(152.0, 3 * GIB, 5 * GIB, 3 * GIB // 2),           # the peak, inside the nested empty
        _mem(160.0, 1 * GIB, 5 * GIB, -2 * GIB),
        _mem(190.0, GIB // 2, 5 * GIB, -(GIB // 2)),
    ]
    doc = {"traceEvents": events,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": total_mem}]}
    p = tmp_path / "built.json"
    p.write_text(json.dumps(doc))
    return analyze(load_kineto(p))


def test_built_trace_peaks_and_fragmentation(tmp_path):
    a = _built(tmp_path)
    mt = memory_timeline(a.trace, a.phases)
    assert mt.has_reserved and mt.host_sample_count == 1
    (d,) = mt.devices
    assert (d.device, d.sample_count, d.alloc_count, d.free_count) == (0, 5, 3, 2)
    assert d.peak_allocated_bytes == 3 * GIB and d.peak_allocated_ts_ns == 152_000
    assert d.peak_reserved_bytes == 5 * GIB and d.peak_reserved_ts_ns == 152_000   # first time at 5 GiB
    assert d.reserved_at_peak_bytes == 5 * GIB
    assert d.fragmentation_at_peak == pytest.approx(5 / 3)
    # time-weighted mean of reserved/allocated, weights = time to the next sample (us):
    # 2/1 * 11 + 2/1.5 * 31 + 5/3 * 8 + 5/1 * 30 (+ 10 * 0 for the last sample), over 80
    assert d.fragmentation_mean == pytest.approx((2 * 11 + 2 / 1.5 * 31 + 5 / 3 * 8 + 5 * 30) / 80)
    # reserved - allocated: 1, 0.5, 2, 4, 4.5 GiB -> largest at the last sample
    assert d.max_unused_reserved_bytes == 9 * GIB // 2 and d.max_unused_reserved_ts_ns == 190_000
    assert (d.first_allocated_bytes, d.last_allocated_bytes) == (GIB, GIB // 2)
    assert d.total_memory_bytes == 8 * GIB and d.peak_allocated_share == pytest.approx(3 / 8)
    p = d.at_peak
    # at 152 us: aten::mm (140-170) encloses aten::empty (150-155): the innermost is empty
    assert (p.cpu_op, p.cpu_op_start_ns, p.cpu_op_dur_ns) == ("aten::empty", 150_000, 5_000)
    assert p.cpu_range == "step_a" and p.phase == "step_a"
    assert p.kernel_active == "gemm_kernel" and p.kernel_next is None


def test_memory_rule_fragmentation_and_full_device(tmp_path):
    (f,) = [f for f in derive_findings(facts_for(_built(tmp_path))) if f.rule == "memory"]
    ev = {e.label: e.value for e in f.evidence}
    # peak reserved 5 GiB >= 1.5 x 3 GiB allocated and 2 GiB >= 1 GiB more; 5/8 of the device
    assert f.severity == "medium"
    assert f.title == "Caching allocator holds 1.7x the peak allocated memory"
    assert ev["peak allocated"] == 3 * GIB and ev["peak reserved"] == 5 * GIB
    assert ev["CPU op at the peak"] == "aten::empty" and ev["kernel running at the peak"] == "gemm_kernel"
    assert ev["allocations"] == 3 and ev["frees"] == 2
    assert ev["peak at, from the first sample"] == 152_000 - 110_000
    # a device of 3.2 GiB: the 3 GiB peak is 93.75% of it -> high
    (sub := tmp_path / "small").mkdir()
    (f,) = [f for f in derive_findings(facts_for(_built(sub, total_mem=int(3.2 * GIB)))) if f.rule == "memory"]
    assert f.severity == "high"
    assert {e.label: e.value for e in f.evidence}["peak allocated share of device memory"] == pytest.approx(3 / 3.2)


def test_binned_takes_the_carried_value_and_the_samples_in_each_bin():
    # samples 5 @0, 1 @10, 7 @20 on [0, 20] in 4 bins [0,5) [5,10) [10,15) [15,20]:
    # 5 (sample), 5 (carried), 1 (sample), 7 (carried 1, the last sample 7 goes to the last bin)
    out = binned(np.array([0, 10, 20]), np.array([5, 1, 7]), 0, 20, 4)
    assert out.tolist() == [5, 5, 1, 7]


def test_ascii_chart_of_the_built_trace(tmp_path):
    a = _built(tmp_path)
    (d,) = memory_timeline(a.trace, a.phases).devices
    lines = render_memory_ascii(d)
    assert all(len(x) <= 100 for x in lines)
    assert lines[0] == "GPU 0 memory over time (GiB)"   # 0.5 GiB min < half of 5 GiB: axis from 0
    assert any(x.startswith("legend: █ allocated  ░ reserved") for x in lines)
    assert "peak allocated 3.00 GiB at +42.0 us: phase step_a, CPU op aten::empty, GPU running gemm_kernel" in lines
    rows = lines[1:11]                      # the 10 chart rows, top first
    marker = next(x for x in lines if x.lstrip().startswith("^ peak allocated"))
    col = marker.index("^")
    column = [r[col] if col < len(r) else " " for r in rows]
    # axis top = 5 GiB * 1.05; row r is filled when the value >= top * (9.5 - r) / 10:
    # 5 GiB reserved fills rows 0..9, 3 GiB allocated fills rows 4..9 (3 >= 5.25 * 5.5 / 10)
    assert column == [RESERVED] * 4 + [ALLOC] * 6
    # the caret's column maps back to the peak time within one column of the 80 us span
    n = max(len(r) for r in rows) - 10
    assert abs((col - 10) / n * 80 - 42) <= 80 / n + 1e-9


# --------------------------------------------------------------------- real fixtures


@lru_cache(maxsize=None)
def _h200_events():
    return json.load(gzip.open(H200_LLAMA))["traceEvents"]


def test_h200_memory_matches_the_raw_events():
    ev = _h200_events()
    gpu = [e for e in ev if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]
    host = [e for e in ev if e.get("name") == "[memory]" and e["args"].get("Device Type") != 1]
    peak_e = max(gpu, key=lambda e: (e["args"]["Total Allocated"], -e["ts"]))   # first at the max
    a = analyze(load_kineto(H200_LLAMA))
    mt = memory_timeline(a.trace, a.phases)
    (d,) = mt.devices
    assert d.sample_count == len(gpu) and mt.host_sample_count == len(host)
    assert d.alloc_count == sum(1 for e in gpu if e["args"]["Bytes"] > 0)
    assert d.free_count == sum(1 for e in gpu if e["args"]["Bytes"] < 0)
    assert d.peak_allocated_bytes == peak_e["args"]["Total Allocated"]
    assert d.peak_allocated_ts_ns == round(peak_e["ts"] * 1000)
    assert d.peak_reserved_bytes == max(e["args"]["Total Reserved"] for e in gpu)
    t = peak_e["ts"]
    # innermost CPU op open at the peak: the latest-starting cpu_op enclosing it
    ops = [e for e in ev if e.get("cat") == "cpu_op" and e["ts"] <= t < e["ts"] + e["dur"]]
    inner = max(ops, key=lambda e: (e["ts"], -e["dur"]))
    assert d.at_peak.cpu_op == inner["name"]
    kernels = [e["name"] for e in ev if e.get("cat") == "kernel" and e["ts"] <= t < e["ts"] + e["dur"]]
    assert d.at_peak.kernel_active == (kernels[0] if kernels else None)
    ranges = [e for e in ev if e.get("cat") == "user_annotation" and e["ts"] <= t < e["ts"] + e["dur"]]
    assert d.at_peak.phase == max(ranges, key=lambda e: e["ts"])["name"] == "prefill"


def test_nsys_memory_matches_sqlite():
    con = sqlite3.connect(NSYS_2022)
    rows = con.execute("SELECT start, bytes, memoryOperationType FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                       "WHERE memKind IN (2, 3, 5) ORDER BY start").fetchall()
    host = con.execute("SELECT COUNT(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind NOT IN (2, 3, 5)").fetchone()[0]
    con.close()
    level, peak, peak_ts = 0, -1, None
    for start, nbytes, op in rows:
        level += -nbytes if op == 1 else nbytes
        if level > peak:
            peak, peak_ts = level, start
    (trace,) = load_inputs([NSYS_2022]).traces
    mt = memory_timeline(trace)
    assert not mt.has_reserved and mt.host_sample_count == host
    (d,) = mt.devices
    assert d.sample_count == len(rows)
    assert (d.peak_allocated_bytes, d.peak_allocated_ts_ns) == (peak, peak_ts)
    assert d.alloc_count == sum(1 for r in rows if r[2] == 0)
    assert d.peak_reserved_bytes is None and d.fragmentation_at_peak is None
    lines = render_memory_ascii(d)
    assert all(len(x) <= 100 for x in lines) and RESERVED not in "".join(lines[1:11])


def test_no_memory_samples_is_none_and_says_so():
    a = analyze(load_kineto(A100_NCCL))
    assert memory_timeline(a.trace, a.phases) is None
    assert not [f for f in derive_findings(facts_for(a)) if f.rule == "memory"]
    assert memory_section(None)[0].startswith("Memory usage over time: n/a")


def test_plot_memory_png(tmp_path):
    a = analyze(load_kineto(H200_LLAMA))
    for path in (plot_memory(memory_timeline(a.trace, a.phases), tmp_path / "m.png"),):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert plot_memory(None, tmp_path / "none.png") is None
