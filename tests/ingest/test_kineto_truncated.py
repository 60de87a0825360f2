"""Truncated Kineto traces (a JSON file cut mid-file, a gzip stream cut mid-stream): the events
before the cut are read and the trace is reported as partial.

The cut files are made here from the bundled fixtures at several offsets. The expected events
come from a second source: a plain ``json`` parse of the prefix, element by element
(``json.JSONDecoder.raw_decode``) up to the last complete event, and ``zlib`` for what a cut
gzip stream inflates to. Never from tracestory.
"""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest

from conftest import A100_NCCL, H100_BERT, H200_LLAMA, KINETO_FIXTURES
from tracestory.cli import main
from tracestory.errors import TraceFormatError
from tracestory.ingest.kineto import load_kineto

FRACTIONS = (0.3, 0.6, 0.8, 0.9, 0.97, 0.999)


def prefix_events(text: bytes) -> tuple[list[dict], bool]:
    """The complete events of ``traceEvents`` in a prefix of the JSON text, and whether the
    array closed within it (plain json, element by element)."""
    s = text.decode("utf-8", "ignore")
    start = s.find('"traceEvents"')
    if start < 0:
        return [], False
    i = s.index("[", start) + 1
    dec = json.JSONDecoder()
    out = []
    while True:
        while i < len(s) and s[i] in " \t\r\n,":
            i += 1
        if i >= len(s):
            return out, False
        if s[i] == "]":
            return out, True
        try:
            obj, i = dec.raw_decode(s, i)
        except json.JSONDecodeError:
            return out, False
        out.append(obj)


def inflated(cut_gzip: bytes) -> bytes:
    """What a cut gzip stream inflates to (zlib, up to where the data stops)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    return d.decompress(cut_gzip)


def ns(us: float) -> int:
    return int(np.rint(us * 1000))


def gpu(e: dict) -> bool:
    return e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")


def check_partial(path, text: bytes, gzip_cut: bool):
    """Load ``path`` (its JSON text: ``text``) and compare with the plain parse of the prefix."""
    events, closed = prefix_events(text)
    if not events or not any(gpu(e) for e in events):
        with pytest.raises(TraceFormatError) as err:
            load_kineto(path)
        assert "truncated" in str(err.value) and "\n" not in str(err.value)
        return None
    t = load_kineto(path)
    cut = t.meta.extra["truncated"]
    assert cut["events_read"] == len(events)
    assert cut["at_byte"] == len(text)
    assert cut["gzip_stream_cut"] is gzip_cut
    assert cut["after_events"] is closed
    first = t.meta.warnings[0]
    if closed:
        assert first.startswith(f"truncated at byte {len(text):,}") and f"all {len(events):,} events read" in first
    else:
        assert first.startswith(f"truncated at byte {len(text):,}")
        assert f": {len(events):,} events read; what is after the cut is missing" in first
    # every kernel before the cut is kept, with its time
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(t.kernels) == len(kernels)
    assert int((t.kernels["end_ns"] - t.kernels["start_ns"]).sum()) == sum(
        ns(e["dur"]) for e in kernels)
    if not closed:
        # the report tells the trace up to the last GPU op read: later CPU-side events and the
        # ranges (steps) the cut ends early are dropped
        through = max(ns(e["ts"]) for e in events if gpu(e))
        assert cut["complete_through_ns"] == through
        runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
        assert len(t.api) == sum(ns(e["ts"]) <= through for e in runtime)
        assert int(t.ranges["end_ns"].max(initial=0)) <= through
        steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                 and e.get("cat") == "user_annotation" and ns(e["ts"]) + ns(e["dur"]) <= through]
        names = [t.name(int(c)) for c in t.ranges["name"]]
        assert sum(n.startswith("ProfilerStep#") for n in names) == len(steps)
    return t


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("fixture", KINETO_FIXTURES, ids=lambda p: p.name.split(".")[0])
def test_cut_json_reads_the_events_before_the_cut(tmp_path, fixture, fraction):
    plain = gzip.decompress(fixture.read_bytes())
    text = plain[: int(len(plain) * fraction)]
    p = tmp_path / "cut.json"
    p.write_bytes(text)
    check_partial(p, text, gzip_cut=False)


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("fixture", KINETO_FIXTURES, ids=lambda p: p.name.split(".")[0])
def test_cut_gzip_reads_the_events_before_the_cut(tmp_path, fixture, fraction):
    packed = gzip.compress(gzip.decompress(fixture.read_bytes()), mtime=0)  # one member, as written
    cut = packed[: int(len(packed) * fraction)]
    p = tmp_path / "cut.json.gz"
    p.write_bytes(cut)
    check_partial(p, inflated(cut), gzip_cut=True)


def test_some_cuts_are_read_and_some_refused():
    """The offsets above cover both outcomes (kept honest: a change of fixtures that made every
    cut refused would otherwise test nothing)."""
    outcomes = set()
    for fixture in KINETO_FIXTURES:
        plain = gzip.decompress(fixture.read_bytes())
        for f in FRACTIONS:
            events, _ = prefix_events(plain[: int(len(plain) * f)])
            outcomes.add(any(gpu(e) for e in events))
    assert outcomes == {True, False}


def test_a_cut_after_the_events_loses_no_event(tmp_path):
    plain = gzip.decompress(H100_BERT.read_bytes())
    text = plain[:-20]      # inside the keys after traceEvents
    p = tmp_path / "tail.json"
    p.write_bytes(text)
    t = check_partial(p, text, gzip_cut=False)
    assert t.meta.extra["truncated"]["after_events"] is True
    assert t.meta.extra["truncated"]["events_read"] == len(json.loads(plain)["traceEvents"])


def test_a_gzip_stream_without_its_footer_loses_no_event(tmp_path):
    packed = gzip.compress(gzip.decompress(A100_NCCL.read_bytes()), mtime=0)
    p = tmp_path / "nofooter.json.gz"
    p.write_bytes(packed[:-4])        # the length field of the trailer is missing
    t = load_kineto(p)
    cut = t.meta.extra["truncated"]
    assert cut["gzip_stream_cut"] and cut["after_events"]
    assert cut["events_read"] == len(json.loads(gzip.decompress(packed))["traceEvents"])


@pytest.mark.parametrize("where", ["before the array", "inside the first event"])
def test_a_file_with_no_complete_event_is_refused_in_one_line(tmp_path, capsys, where):
    plain = gzip.decompress(H200_LLAMA.read_bytes())
    at = plain.index(b'"traceEvents"')
    text = plain[:at] if where == "before the array" else plain[: plain.index(b"{", at) + 20]
    assert prefix_events(text)[0] == []
    p = tmp_path / "cut.json"
    p.write_bytes(text)
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(p) in err


def test_cli_states_the_cut_on_the_terminal_in_the_json_and_in_limitations(tmp_path, capsys):
    plain = gzip.decompress(H200_LLAMA.read_bytes())
    text = plain[: int(len(plain) * 0.85)]
    events, _ = prefix_events(text)
    p = tmp_path / "cut.json"
    p.write_bytes(text)
    out, md = tmp_path / "a.json", tmp_path / "r.md"
    assert main(["report", str(p), "-o", str(md), "--json", str(out)]) == 0
    said = f"truncated at byte {len(text):,}: {len(events):,} events read; what is after the cut is missing"
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and said in err[0] and str(p) in err[0]
    doc = json.loads(out.read_text())
    src = doc["traces"][0]["source"]
    assert src["extra"]["truncated"]["events_read"] == len(events)
    assert any(said in w for w in src["warnings"])
    report = md.read_text()
    limitations = report[report.index("**Limitations**"):report.index("## Environment")]
    assert said in limitations
    # no step ends after the cut: the step the cut fell into is not told as a (short) step
    through = src["extra"]["truncated"]["complete_through_ns"]
    decode_steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("decode_")]
    whole = [e for e in decode_steps if ns(e["ts"]) + ns(e["dur"]) <= through]
    assert 0 < len(whole) < len(decode_steps)   # this cut falls inside the decode loop
    assert f"decode x{len(whole)} steps (decode_0 .. decode_{len(whole) - 1})" in report
    assert f"decode_{len(whole)} " not in report  # the step cut short is not told as a step


def test_module_table_of_a_cut_gzip_holds_only_the_calls_before_the_cut(tmp_path):
    """GPU time per nn.Module on a cut gzip file: the module calls that end before the cut
    (their count from the plain parse of the inflated prefix), none told as 0 ns past the cut."""
    import tracestory

    packed = gzip.compress(gzip.decompress(H100_BERT.read_bytes()), mtime=0)
    cut = packed[: int(len(packed) * 0.95)]
    p = tmp_path / "cut.json.gz"
    p.write_bytes(cut)
    events, _ = prefix_events(inflated(cut))
    through = max(ns(e["ts"]) for e in events if gpu(e))
    calls = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("nn.Module: ")]
    before = [e for e in calls if ns(e["ts"]) + ns(e["dur"]) <= through]
    assert 0 < len(before) < len(calls)
    mods = tracestory.analyze(str(p)).runs[0].operators(modules=True).modules
    assert sum(m.calls for m in mods) == len(before)
