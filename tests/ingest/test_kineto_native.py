"""The compiled Kineto scanner (``ingest/_kineto_scan.c``, :mod:`tracestory.ingest.kineto_native`).

Its contract: a chunk it reads gives the very tables msgspec's typed decode gives, and a chunk it
cannot read exactly comes back ``None`` (msgspec reads it). The second source for every
expectation here is the msgspec path itself (``TRACESTORY_KINETO_NATIVE=0``), which the rest of
tests/ingest checks against plain ``json`` reads, plus CPython's ``float()`` for the numbers.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, assert_same_trace
from tracestory.errors import TraceFormatError
from tracestory.ingest import kineto, kineto_native
from tracestory.ingest.kineto import load_kineto


def scanner():
    return kineto_native.Scanner(kineto._CAT_KIND, kineto._NATIVE_PHASES, "stf")


def scan(events: list | bytes):
    text = events if isinstance(events, bytes) else json.dumps(events).encode()
    return scanner()(memoryview(bytearray(text)))


def load(path, native: bool, monkeypatch):
    monkeypatch.setenv("TRACESTORY_KINETO_NATIVE", "1" if native else "0")
    try:
        return load_kineto(path, require_gpu=False)
    except TraceFormatError as e:
        return str(e)


def test_the_scanner_is_built_where_a_compiler_is():
    """setup.py builds it as optional: a failed build must not pass unnoticed where it can build."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if shutil.which(cc) is None or not headers.exists():
        pytest.fail(f"no C compiler ({cc}) or Python headers here: the scanner cannot be checked")
    assert kineto_native._kineto_scan is not None, "pip install -e . did not build ingest/_kineto_scan.c"
    assert kineto_native.enabled()


def kineto_files():
    return sorted(p for p in (REPO / "tests" / "data").rglob("*") if p.name.endswith((".json", ".json.gz")))


def test_every_trace_in_the_repository_reads_the_same_both_ways(monkeypatch):
    """Every JSON file under tests/data (Kineto traces from many torch versions and vendors, and the
    other JSON files, which both paths refuse alike), read by both paths."""
    counts = {"native": 0, "msgspec": 0}
    real = kineto_native.Scanner.__call__

    def counted(self, text):
        chunk = real(self, text)
        counts["native" if chunk is not None else "msgspec"] += 1
        return chunk

    monkeypatch.setattr(kineto_native.Scanner, "__call__", counted)
    files = kineto_files()
    assert len(files) > 90
    for path in files:
        assert_same_trace(load(path, True, monkeypatch), load(path, False, monkeypatch))
    # most chunks take the compiled path; the AMD traces' string-typed args are msgspec's (lenient)
    assert counts["native"] > 3 * counts["msgspec"] > 0, counts


BASE = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000.5, "dur": 2.25,
        "args": {"device": 0, "stream": 7, "correlation": 11, "External id": 3, "grid": [4, 1, 1],
                 "block": [128, 1, 1], "registers per thread": 32, "shared memory": 0}}


def trace_with(events: list) -> dict:
    return {"traceEvents": [dict(BASE), *events, dict(BASE, ts=2000.0)]}


# Events the scanner reads itself: both paths must agree.
READ = {
    "escaped name": {**BASE, "name": "a\\\"b\\u00b5\\n\u00e9"},
    "string tid": {**BASE, "cat": "cpu_op", "tid": "stream 7 (x-12)"},
    "string tid without digits": {**BASE, "cat": "cpu_op", "tid": "main"},
    "negative string pid": {**BASE, "cat": "cuda_runtime", "pid": "pid -42"},
    "int ts": {**BASE, "ts": 1234567},
    "16-digit ts": {**BASE, "ts": 4458676522709.059},
    "17-digit ts": {**BASE, "ts": 1700000000123456.7},
    "exponent dur": {**BASE, "dur": 1.5e-3},
    "negative zero dur": {**BASE, "dur": -0.0},
    "no dur": {k: v for k, v in BASE.items() if k != "dur"},
    "no ts": {k: v for k, v in BASE.items() if k != "ts"},
    "negative dur": {**BASE, "dur": -5.0},
    "args null": {**BASE, "args": None},
    "args empty": {**BASE, "args": {}},
    "grid null": {**BASE, "args": {**BASE["args"], "grid": None}},
    "unknown keys everywhere": {**BASE, "zz": [1, {"a": [True, False, None]}], "args": {**BASE["args"], "q": "x"}},
    "flow of a known category": {"ph": "f", "cat": "kernel", "id": 1, "ts": "not read"},
    "flow with keys before ph": {"cat": "ac2g", "name": "ac2g", "pid": 1, "ts": 3.0, "ph": "s", "id": 2},
    "known-category flow with keys before ph": {"cat": "cpu_op", "name": "x", "pid": 1, "ts": 3.0,
                                                "args": {"Input Dims": [[1]]}, "ph": "t"},
    "instant": {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1500.0,
                "args": {"Total Allocated": 1 << 30, "Total Reserved": 2 << 30, "Bytes": -512, "Device Id": 0,
                         "Device Type": 1}},
    "metadata": {"ph": "M", "name": "process_name", "pid": 3, "tid": 0, "args": {"name": "python \\u00b5"}},
    "op with shapes": {**BASE, "cat": "cpu_op", "name": "aten::scaled_dot_product_attention",
                       "args": {"External id": 9, "Input Dims": [[1, 2], []], "Input type": ["float", ""],
                                "Concrete Inputs": ["", "", "", "", "0.", "True"], "flops": 12}},
    "2021 shapes": {**BASE, "cat": "Operator", "args": {"Input dims": [[3]]}},
    "collective": {**BASE, "name": "ncclKernel_AllReduce", "args": {
        **BASE["args"], "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
        "Group size": 2, "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "seq": 4}},
    "memcpy": {**BASE, "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
               "args": {"device": 0, "stream": 7, "bytes": 4096, "correlation": 12}},
    "range": {**BASE, "cat": "gpu_user_annotation", "name": "step", "args": {"External id": 1}},
    "unknown category": {**BASE, "cat": "python_function"},
    "no cat": {k: v for k, v in BASE.items() if k != "cat"},
}

# Events only msgspec reads (the scanner declines the chunk): both paths must still agree.
DECLINED = {
    "duplicate key": b'{"ph":"X","cat":"kernel","ts":1,"ts":2,"dur":1}',
    "duplicate arg": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"device":0,"device":1}}',
    "int arg as float": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"correlation":5.0}}',
    "int arg as text": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"correlation":"5"}}',
    "ts as text": b'{"ph":"X","cat":"kernel","ts":"1","dur":1}',
    "name a number": b'{"ph":"X","cat":"kernel","name":7,"ts":1,"dur":1}',
    "name null": b'{"ph":"X","cat":"kernel","name":null,"ts":1,"dur":1}',
    "no ph": b'{"cat":"kernel","ts":1,"dur":1}',
    "unknown ph": b'{"ph":"Q","cat":"kernel","ts":1,"dur":1}',
    "grid of two": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"grid":[1,2]}}',
    "grid beyond int32": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"grid":[4294967296,1,1]}}',
    "19-digit id": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"correlation":1234567890123456789}}',
    "id beyond int64": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"correlation":18446744073709551616}}',
    "number out of range": b'{"ph":"X","cat":"kernel","ts":1e400,"dur":1}',
    "escaped key": b'{"ph":"X","c\\u0061t":"kernel","ts":1,"dur":1}',
    "escaped cat": b'{"ph":"X","cat":"kern\\u0065l","ts":1,"dur":1}',
    "lone surrogate": b'{"ph":"X","cat":"kernel","name":"\\ud800","ts":1,"dur":1}',
    "bool pid": b'{"ph":"X","cat":"kernel","pid":true,"ts":1,"dur":1}',
    "args a list": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":[]}',
    "deep nesting": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"zz":' + b"[" * 70 + b"]" * 70 + b"}",
    "event not an object": b"[1, 2]",
    "invalid UTF-8": b'{"ph":"X","cat":"kernel","name":"\xff","ts":1,"dur":1}',
    "flow with a number name before ph": b'{"cat":"ac2g","name":5,"ph":"s","id":2}',
    "one name spelled two ways": b'{"ph":"X","cat":"kernel","name":"ab","ts":1,"dur":1}, '
                                 b'{"ph":"X","cat":"kernel","name":"a\\u0062","ts":2,"dur":1}',
    "collective name a number": b'{"ph":"X","cat":"kernel","ts":1,"dur":1,"args":{"Collective name":3}}',
}


def write_text(tmp_path, events_text: bytes) -> Path:
    base = json.dumps(BASE).encode()
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [' + base + b", " + events_text + b", " + base + b"]}")
    return path


@pytest.mark.parametrize("case", sorted(READ))
def test_events_the_scanner_reads_come_out_as_msgspec_reads_them(case, tmp_path, monkeypatch):
    events = trace_with([READ[case]])["traceEvents"]
    assert scan(events) is not None, "the scanner declined an event it is meant to read"
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert_same_trace(load(path, True, monkeypatch), load(path, False, monkeypatch))


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_events_the_scanner_declines_go_to_msgspec(case, tmp_path, monkeypatch):
    text = DECLINED[case]
    if case == "event not an object":
        path = tmp_path / "t.json"
        path.write_bytes(b'{"traceEvents": ' + text + b"}")
        assert scan(text) is None
    else:
        path = write_text(tmp_path, text)
        assert scan(b"[" + text + b"]") is None
    assert_same_trace(load(path, True, monkeypatch), load(path, False, monkeypatch))


def test_the_values_read_by_hand():
    """One event's columns against the values written in it."""
    ev = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 5, "tid": "stream 9", "ts": 4458676522709.059,
          "dur": 0.001, "args": {"device": 1, "stream": 9, "correlation": 77, "External id": 66,
                                 "grid": [2, 3, 4], "block": [32, 8, 1], "registers per thread": 40,
                                 "shared memory": 1024}}
    chunk = scan([ev, {"ph": "f", "cat": "ac2g", "id": 1}])
    assert chunk.event_count == 2 and chunk.n == 1  # the flow of an unknown category is counted, not a row
    rows = chunk.rows(np.array([0]))
    assert rows.floats("ts")[0] == 4458676522709.059 and rows.floats("dur")[0] == 0.001
    assert (rows.ints("pid")[0], rows.ints("tid")[0]) == (5, 9)
    assert [rows.ints(f)[0] for f in ("device", "stream", "correlation", "external_id", "registers",
                                      "shared_memory", "bytes")] == [1, 9, 77, 66, 40, 1024, -1]
    assert rows.dims("grid").tolist() == [[2, 3, 4]] and rows.dims("block").tolist() == [[32, 8, 1]]
    assert chunk.names[chunk.name[0]] == "gemm"


def test_numbers_round_as_cpython_rounds_them():
    """ts and dur from random decimal texts (the fast path and the slow one) against float()."""
    rng = random.Random(7)
    texts = []
    for _ in range(3000):
        whole = str(rng.randrange(0, 10 ** rng.randrange(1, 19)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randrange(0, 8)))
        text = whole + ("." + frac if frac else "")
        if rng.random() < 0.1:
            text += f"e{rng.randrange(-30, 30)}"
        texts.append(("-" if rng.random() < 0.2 else "") + text)
    texts += ["-0", "0", "-0.0", "0.000", "-0e0", "9007199254740993", "9007199254740993.5", "4458676522709.059"]
    body = ",".join(f'{{"ph":"X","cat":"kernel","ts":{t},"dur":{t}}}' for t in texts)
    chunk = scan(("[" + body + "]").encode())
    got = chunk.cols["ts"]
    # msgspec (the path this must match) reads an integer literal as an int first: "-0" is +0.0
    want = np.array([0.0 if t.lstrip("-").strip("0") == "" and "." not in t and "e" not in t else float(t)
                     for t in texts])
    assert np.array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("layout", [{"separators": (",", ":")}, {"indent": 2}, {"indent": "\t"}])
def test_every_layout_reads_the_same_both_ways(layout, tmp_path, monkeypatch):
    doc = json.load(gzip.open(REPO / "tests" / "data" / "public" / "kineto_h100_bert-small_1rank.json.gz"))
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, **layout))
    assert_same_trace(load(path, True, monkeypatch), load(path, False, monkeypatch))


def test_a_name_that_is_not_utf8_is_refused_in_one_line(tmp_path, monkeypatch):
    path = write_text(tmp_path, DECLINED["invalid UTF-8"])
    for native in (True, False):
        assert load(path, native, monkeypatch) == (f"{path}: expected JSON text in UTF-8, found a string that is "
                                                   "not UTF-8 in traceEvents (invalid start byte)")


def test_a_chunk_still_viewed_is_not_written_over_by_the_next_scan():
    """The scanner reuses its column buffers from call to call; one whose columns are still held
    must keep them (the next call writes elsewhere)."""
    sc = scanner()
    first = sc(memoryview(bytearray(json.dumps([dict(BASE, ts=1.0, name="a")] * 3).encode())))
    ts_before, names_before = first.cols["ts"].copy(), list(first.names)
    second = sc(memoryview(bytearray(json.dumps([dict(BASE, ts=9.0, name="b")] * 5000).encode())))
    assert first.cols["ts"].tolist() == ts_before.tolist() == [1.0, 1.0, 1.0] and first.names == names_before
    assert second.n == 5000 and set(second.cols["ts"].tolist()) == {9.0}
    del first
    third = sc(memoryview(bytearray(json.dumps([dict(BASE, ts=4.0)] * 2).encode())))
    assert second.cols["ts"][:2].tolist() == [9.0, 9.0]  # still held: untouched by the third call
    assert third.cols["ts"].tolist() == [4.0, 4.0]
    kineto_native.release()


def test_minus_zero_reads_as_msgspec_reads_it(tmp_path, monkeypatch):
    """An integer literal ``-0`` is the int 0 for msgspec (+0.0 as a float), ``-0.0`` stays -0.0."""
    ops = b'{"ph":"X","cat":"cpu_op","name":"a","ts":1,"dur":1,"args":{"flops":-0}}, ' \
          b'{"ph":"X","cat":"cpu_op","name":"b","ts":2,"dur":1,"args":{"flops":-0.0}}'
    path = write_text(tmp_path, ops)
    got = {native: load(path, native, monkeypatch).ops for native in (True, False)}
    for ops_table in got.values():
        assert np.signbit(ops_table["flops"]).tolist() == [False, True]
