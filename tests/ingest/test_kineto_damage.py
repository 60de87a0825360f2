"""Damaged Kineto traces: refused in one line naming the file (exit 2), or loaded with the damage
stated in ``TraceMeta.warnings`` and the numbers of what was kept.

Every damaged file is made here, at test time, from the A100 NCCL fixture (40,573 events, 2,700
kernels). Expected numbers come from a plain ``json``/``gzip`` read of the same events, with the
damage applied by hand: never from tracestory.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import zlib

import pytest

from conftest import A100_NCCL, REPO
from tracestory.cli import main
from tracestory.errors import TraceFormatError
from tracestory.ingest import kineto_text
from tracestory.ingest.kineto import load_kineto


@pytest.fixture(scope="module")
def source():
    return json.load(gzip.open(A100_NCCL))


def ns(x):
    return round(x * 1000)


def write(tmp_path, doc, name="damaged.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def damaged(source, change, pick=lambda i: True):
    """A deep copy of the trace with ``change(event)`` applied to the kernels ``pick`` selects
    (by their kernel index); returns (doc, changed kernel events, untouched kernel events)."""
    doc = json.loads(json.dumps(source))
    changed, kept = [], []
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    for i, e in enumerate(kernels):
        if pick(i):
            changed.append(dict(e))
            change(e)
        else:
            kept.append(e)
    return doc, changed, kept


def analyze(path, tmp_path, capsys):
    """(exit code, stderr lines, the analyze JSON of the first trace or None)."""
    out = tmp_path / "out.json"
    code = main(["analyze", str(path), "--json", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err, json.loads(out.read_text())["traces"][0] if code == 0 else None


def assert_refused(code, err, path, words):
    assert code == 2
    assert len(err) == 1, err
    assert str(path) in err[0] and words in err[0], err[0]


def test_kernels_without_ph_are_ignored_and_counted(source, tmp_path, capsys):
    doc, changed, _ = damaged(source, lambda e: e.pop("ph"))
    p = write(tmp_path, doc)
    code, err, out = analyze(p, tmp_path, capsys)
    assert code == 0 and out["gpu"]["kernel_count"] == 0
    memops = [e for e in source["traceEvents"] if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    assert out["gpu"]["memop_count"] == len(memops) == 1074
    assert load_kineto(p).meta.warnings == (f"{len(changed):,} 'kernel' events without ph 'X' ignored",)
    assert len(changed) == 2700


@pytest.mark.parametrize("ph", ["Q", "f", "s", "i", "M"])
def test_kernels_of_another_phase_are_ignored_and_counted(source, tmp_path, capsys, ph):
    # an unknown letter sends the chunk to the slow path; flows ("s", "f") are decoded with their
    # cat only; instants and metadata keep every field: each way, the kernel is counted, not kept
    doc, changed, kept = damaged(source, lambda e: e.update(ph=ph), pick=lambda i: i % 3 == 0)
    p = write(tmp_path, doc)
    code, err, out = analyze(p, tmp_path, capsys)
    assert code == 0 and out["gpu"]["kernel_count"] == len(kept) == 1800
    assert load_kineto(p).meta.warnings == (f"{len(changed):,} 'kernel' events without ph 'X' ignored",)
    assert sum(ns(e["dur"]) for e in kept) == out["gpu"]["kernel_time_ns"]


def test_kernels_without_cat_are_ignored_and_counted(source, tmp_path, capsys):
    doc, changed, _ = damaged(source, lambda e: e.pop("cat"), pick=lambda i: i % 3 == 0)
    p = write(tmp_path, doc)
    code, err, out = analyze(p, tmp_path, capsys)
    assert code == 0 and out["gpu"]["kernel_count"] == 2700 - len(changed) == 1800
    assert load_kineto(p).meta.warnings == ("900 complete events (ph 'X') without a 'cat' ignored",)


def test_numeric_names_are_read_as_text(source, tmp_path, capsys):
    doc, changed, kept = damaged(source, lambda e: e.__setitem__("name", 7), pick=lambda i: i % 2 == 0)
    p = write(tmp_path, doc)
    code, err, out = analyze(p, tmp_path, capsys)
    assert code == 0
    assert out["gpu"]["kernel_count"] == 2700
    assert out["gpu"]["kernel_time_ns"] == sum(ns(e["dur"]) for e in changed + kept)
    trace = load_kineto(p)
    assert sum(1 for c in trace.kernels["name"] if trace.name(c) == "7") == len(changed) == 1350
    assert trace.meta.warnings == ("1,350 events with a number as 'name' (read as its text)",)
    assert len(trace.collectives) == 21  # the chunk took the slow path: collective args still kept


def test_non_numeric_ts_drops_those_events(source, tmp_path, capsys):
    rng = random.Random(17)
    hit = set(rng.sample(range(2700), 100))
    doc, changed, kept = damaged(source, lambda e: e.__setitem__("ts", "abc"), pick=hit.__contains__)
    p = write(tmp_path, doc)
    code, err, out = analyze(p, tmp_path, capsys)
    assert code == 0
    assert out["gpu"]["kernel_count"] == len(kept) == 2600
    assert out["gpu"]["kernel_time_ns"] == sum(ns(e["dur"]) for e in kept)
    assert load_kineto(p).meta.warnings == ("100 events dropped: 'ts' is not a number",)


@pytest.mark.parametrize("dur", [1e300, -5.0, 1e16])
def test_impossible_durations_drop_those_events(source, tmp_path, capsys, dur):
    doc, changed, kept = damaged(source, lambda e: e.__setitem__("dur", dur), pick=lambda i: i % 100 == 0)
    p = write(tmp_path, doc)
    code, err, out = analyze(p, tmp_path, capsys)
    assert code == 0
    assert out["gpu"]["kernel_count"] == len(kept) == 2673
    assert out["gpu"]["kernel_time_ns"] == sum(ns(e["dur"]) for e in kept) > 0
    assert load_kineto(p).meta.warnings == ("27 'kernel' events dropped: 'dur' negative or over 2**62 ns",)


def test_undamaged_fixture_has_no_warnings():
    assert load_kineto(A100_NCCL).meta.warnings == ()


@pytest.mark.parametrize("where", ["args", "top"])
def test_deep_nesting_is_refused(source, tmp_path, capsys, where):
    deep = "[" * 100_000 + "]" * 100_000
    text = json.dumps(source)
    if where == "args":
        text = text.replace('"args": {', '"args": {"nested": ' + deep + ", ", 1)
    else:
        text = '{"nested": ' + deep + ", " + text[1:]
    p = tmp_path / "deep.json"
    p.write_text(text)
    code, err, _ = analyze(p, tmp_path, capsys)
    assert_refused(code, err, p, "nested")


@pytest.mark.parametrize("fraction", [0.1])
def test_truncated_files_are_refused(tmp_path, capsys, fraction):
    """A cut before any GPU event is refused in one line; later cuts are read up to the cut
    (tests/ingest/test_kineto_truncated.py)."""
    plain = gzip.decompress(A100_NCCL.read_bytes())
    p = tmp_path / "cut.json"
    p.write_bytes(plain[: int(len(plain) * fraction)])
    code, err, _ = analyze(p, tmp_path, capsys)
    assert_refused(code, err, p, "truncated")
    packed = A100_NCCL.read_bytes()
    g = tmp_path / "cut.json.gz"
    g.write_bytes(packed[: int(len(packed) * fraction)])
    code, err, _ = analyze(g, tmp_path, capsys)
    assert_refused(code, err, g, "truncated")


@pytest.mark.parametrize("seed", range(6))
def test_flipped_bytes_in_gzip_data_are_refused(tmp_path, capsys, seed):
    """A changed byte in the deflate data fails the stream or its CRC-32: never silent."""
    data = bytearray(A100_NCCL.read_bytes())
    rng = random.Random(seed)
    for _ in range(3):
        data[rng.randrange(10, len(data) - 8)] ^= 1 << rng.randrange(8)
    p = tmp_path / "flipped.json.gz"
    p.write_bytes(bytes(data))
    code, err, _ = analyze(p, tmp_path, capsys)
    assert_refused(code, err, p, "gzip")


@pytest.mark.parametrize("seed", range(8))
def test_flipped_bytes_in_json_give_an_answer_or_one_line(tmp_path, capsys, seed):
    """A random byte of the JSON text replaced: either one error line naming the file, or a
    load whose kernels are at most those of the file (a flip can break an event, never invent
    one). With these seeds both outcomes occur."""
    data = bytearray(gzip.decompress(A100_NCCL.read_bytes()))
    rng = random.Random(seed)
    data[rng.randrange(len(data))] = rng.randrange(32, 127)
    p = tmp_path / "flipped.json"
    p.write_bytes(bytes(data))
    code, err, out = analyze(p, tmp_path, capsys)
    if code == 2:
        assert len(err) == 1 and str(p) in err[0], err
    else:
        assert code == 0 and out["gpu"]["kernel_count"] <= 2700


def test_special_files_are_refused_before_reading(tmp_path):
    """The Kineto reader itself (the CLI sniffs a file's type before it gets there)."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    with pytest.raises(TraceFormatError) as e:
        load_kineto(fifo)
    assert str(fifo) in str(e.value) and "regular file" in str(e.value) and "\n" not in str(e.value)


def test_decompressed_size_limit_from_the_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(kineto_text.MAX_DECOMPRESSED_ENV, "1M")
    code, err, _ = analyze(A100_NCCL, tmp_path, capsys)
    assert_refused(code, err, A100_NCCL, kineto_text.MAX_DECOMPRESSED_ENV)
    assert "1,048,576 bytes" in err[0]


def test_default_limit_is_generous_and_scales():
    assert kineto_text.max_decompressed(1 << 20, env={}) == 64 << 30
    assert kineto_text.max_decompressed(1 << 30, env={}) == 100 << 30
    assert kineto_text.max_decompressed(0, env={kineto_text.MAX_DECOMPRESSED_ENV: "2.5G"}) == int(2.5 * (1 << 30))


def _bomb(path, head: bytes, filler: bytes, total: int):
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = filler * ((1 << 20) // len(filler))
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(total // len(block)):
            f.write(c.compress(block))
        f.write(c.flush())


@pytest.mark.parametrize("head, filler, words", [
    (b"", b"\0", "not JSON"),  # zeros: refused at the first inflated piece
    (b'{"traceName": "', b"a", "traceEvents array within the first"),  # one endless string before the events
    (b'{"traceEvents": [{"ph": "X", "name": "', b"a", "without an event boundary"),  # one endless event
])
def test_gzip_bombs_stop_early_and_small(tmp_path, head, filler, words):
    """A few hundred KB of gzip that inflates to 96 MiB: one line, and the process stays far
    below the inflated size (the text is streamed; the limits on one part are 64 MiB)."""
    p = tmp_path / "bomb.json.gz"
    _bomb(p, head, filler, 96 << 20)
    assert p.stat().st_size < 1 << 20
    # VmHWM, not ru_maxrss: a forked child's ru_maxrss starts at the parent's (pytest's) RSS.
    code = ("import re, sys\nfrom tracestory.cli import main\nrc = main(['analyze', sys.argv[1]])\n"
            "hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "print(int(hwm) >> 10, file=sys.stderr)\nsys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, cwd=REPO, timeout=120)
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 2 and str(p) in lines[0] and words in lines[0], lines
    assert int(lines[1]) < 400, f"peak RSS {lines[1]} MiB"


def test_values_of_an_odd_type_keep_the_rest_of_their_chunk():
    """The MI300X field trace writes "bytes": "1" (text) on HIP runtime calls, so its events go
    through the per-event path. The shapes of its ops must survive that path (they were lost
    once, which emptied its roofline estimate)."""
    path = REPO / "tests" / "data" / "field" / "AMD-AGI_TraceLens__mi300x_hf_qwen1.5-0.5b_chat.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    assert any(isinstance(e.get("args", {}).get("bytes"), str) for e in events)
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    want = sorted(json.dumps(e["args"]["Input Dims"], separators=(",", ":")) for e in ops if "Input Dims" in e["args"])
    trace = load_kineto(path)
    got = sorted(json.dumps(json.loads(d), separators=(",", ":")) for d in trace.ops["input_dims"] if d)
    assert len(want) == len(ops) > 4000 and got == want
