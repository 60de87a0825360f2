"""GEMM rows (M) read once per call: expected values from a plain JSON reading of the traces."""

import gzip
import math
import json
from collections import Counter
from pathlib import Path

from tracestory.analysis.gemm_rows import gemm_rows
from tracestory.ingest.kineto import load_kineto

DATA = Path(__file__).resolve().parents[1] / "data"


def _cpu_ops(path: Path, names: set[str]) -> list[dict]:
    events = json.load(gzip.open(path))["traceEvents"]
    return [e for e in events if e.get("cat") == "cpu_op" and e.get("name") in names]


def test_nested_linear_matmul_mm_counts_once_with_the_linear_rows():
    # each aten::linear calls aten::matmul, which calls aten::mm: 28 calls, not 84
    path = DATA / "compare" / "decode_default_a.trace.json.gz"
    linears = _cpu_ops(path, {"aten::linear"})
    expected = Counter(math.prod(e["args"]["Input Dims"][0][:-1]) for e in linears)  # (1, 1, K): M = 1
    idx, rows = gemm_rows(load_kineto(path))
    assert len(linears) == 28 and rows.size == 28
    assert Counter(rows.tolist()) == expected == Counter({1: 28})


def test_addmm_rows_come_from_its_second_input_not_the_bias():
    # torch.compile lowers linear layers to bare aten::addmm(bias, input, weight)
    path = DATA / "corpus" / "h100" / "bert_infer_compile.pt.trace.json.gz"
    addmm = _cpu_ops(path, {"aten::addmm"})
    expected = Counter(e["args"]["Input Dims"][1][0] for e in addmm)  # 2-D inputs: M = dim 0
    idx, rows = gemm_rows(load_kineto(path))
    assert Counter(rows.tolist()) == expected
    assert expected == Counter({2048: 72, 16: 2})


def _op(name: str, ts: int, dur: int, dims: list) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"Input Dims": dims}}


def test_a_linear_without_a_recorded_input_shape_leaves_its_addmm_counted(tmp_path):
    # as torch.compile'd traces record some aten::linear calls: an empty first input ([]) and the
    # nested aten::addmm(bias, input, weight) carrying the shape
    events = [
        _op("aten::linear", 0, 10, [[], [256, 256], [256]]),
        _op("aten::addmm", 2, 6, [[256], [512, 256], [256, 256], [], []]),  # counted: M 512
        _op("aten::linear", 20, 10, [[4, 7, 256], [128, 256], [128]]),  # counted: M 28
        _op("aten::addmm", 22, 6, [[128], [28, 256], [256, 128], [], []]),  # nested: not counted
        _op("aten::mm", 40, 5, [[3, 2], [2, 128]]),  # on its own: M 3
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 3, "dur": 2, "args": {}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_kineto(path)
    idx, rows = gemm_rows(trace)
    names = [trace.name(int(c)) for c in trace.ops["name"][idx]]
    assert sorted(zip(names, rows.tolist(), strict=True)) == [("aten::addmm", 512), ("aten::linear", 28), ("aten::mm", 3)]
