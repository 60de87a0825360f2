"""nn.Module call ranges read from Kineto python_function events."""

from __future__ import annotations

import gzip
import json

from conftest import H100_BERT

from tracestory.ingest.kineto_modules import load_module_ranges, module_ranges_from_bytes


def test_every_module_event_of_the_bert_trace_is_read():
    with gzip.open(H100_BERT, "rt") as f:
        events = json.load(f)["traceEvents"]
    want = sorted((round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000), e["tid"], e["name"])
                  for e in events if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: "))
    t = load_module_ranges(H100_BERT)
    got = sorted(zip(t["start_ns"].tolist(), t["end_ns"].tolist(), t["tid"].tolist(), t["name"].tolist()))
    assert got == want and len(got) == 84


def test_module_names_elsewhere_and_odd_layouts():
    """Args before the name, a quoted module name inside another event's args, a metadata
    event, and a module event with a string pid/tid."""
    doc = {"traceEvents": [
        {"ph": "X", "cat": "python_function", "args": {"Python id": 3}, "name": "nn.Module: Linear_0",
         "pid": 1, "tid": 2, "ts": 1.5, "dur": 2.25},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 2.0, "dur": 0.5,
         "args": {"note": "called from \"nn.Module: Linear_0\""}},
        {"ph": "i", "cat": "python_function", "name": "nn.Module: Instant_0", "pid": 1, "tid": 2, "ts": 3.0},
        {"ph": "X", "cat": "python_function", "name": "nn.Module: Block_1", "pid": "7", "tid": "thread 9",
         "ts": 10.0, "dur": 1.0},
    ]}
    t = module_ranges_from_bytes(bytearray(json.dumps(doc).encode()))
    assert list(zip(t["name"].tolist(), t["start_ns"].tolist(), t["end_ns"].tolist(), t["pid"].tolist(),
                    t["tid"].tolist())) == [("nn.Module: Linear_0", 1500, 3750, 1, 2),
                                            ("nn.Module: Block_1", 10000, 11000, 7, 9)]
