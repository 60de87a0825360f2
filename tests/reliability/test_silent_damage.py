"""Damage that used to pass silently: Kineto kernels without ``dur`` (read as 0 ns, then a
"launch-bound" verdict built on them) and the Kineto reader's damage classes, stated in the JSON
and the report's Limitations but not on the terminal.

The damaged traces are made here from a repository fixture (tests/data/public, PROVENANCE.md);
the expected counts come from reading the JSON with the json module.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import H100_BERT

from tracestory.cli import main


def _source() -> dict:
    return json.loads(gzip.decompress(H100_BERT.read_bytes()))


def _kernels(doc):
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def test_kernels_all_without_dur_are_refused(tmp_path, capsys):
    doc = _source()
    kernels = _kernels(doc)
    for e in kernels:
        del e["dur"]
    p = tmp_path / "nodur.json"
    p.write_text(json.dumps(doc))
    code, out, err = _run(capsys, "analyze", p)
    assert code == 2 and len(err) == 1 and str(p) in err[0]
    assert f"{len(kernels):,} kernels, none with a 'dur'" in err[0]


@pytest.fixture
def two_thirds_without_dur(tmp_path):
    doc = _source()
    kernels = _kernels(doc)
    cut = 2 * len(kernels) // 3
    zero_already = sum(1 for e in kernels[cut:] if e["dur"] == 0)
    for e in kernels[:cut]:
        del e["dur"]
    p = tmp_path / "partdur.json"
    p.write_text(json.dumps(doc))
    return p, cut, len(kernels), zero_already


def test_kernels_without_dur_are_stated_and_no_verdict_is_built_on_them(two_thirds_without_dur, tmp_path, capsys):
    p, missing, total, zero_already = two_thirds_without_dur
    assert total == 60 and missing == 40   # the fixture, read with json
    warning = f"{missing:,} 'kernel' events without 'dur'"
    code, out, err = _run(capsys, "analyze", p, "--json", tmp_path / "a.json")
    assert code == 0
    assert [line for line in err if warning in line and str(p) in line], err        # on the terminal
    assert f"not judged ({missing + zero_already} of {total} kernels have no duration)" in out
    doc = json.loads((tmp_path / "a.json").read_text())["traces"][0]
    assert any(warning in w for w in doc["source"]["warnings"])                       # in the JSON
    tl = doc["timeline"]
    assert tl["zero_duration_kernels"] == missing + zero_already and tl["launch_bound"] is False
    assert tl["verdict_withheld"]
    code, _, err = _run(capsys, "report", p, "-o", tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    limitations = text.split("## ", 2)[1] if "Limitations" not in text else text[text.index("Limitations"):]
    assert code == 0 and warning in limitations                                       # in Limitations
    assert "| idle time mostly waiting for launches | not judged" in text


@pytest.mark.parametrize("damage,words", [
    (lambda e: e.pop("ph"), "'kernel' events without ph 'X' ignored"),
    (lambda e: e.pop("cat"), "complete events (ph 'X') without a 'cat' ignored"),
    (lambda e: e.update(ts="soon"), "events dropped: 'ts' is not a number"),
    (lambda e: e.update(name=7), "events with a number as 'name'"),
], ids=["no ph", "no cat", "ts text", "name number"])
def test_reader_damage_is_on_the_analyze_terminal(damage, words, tmp_path, capsys):
    doc = _source()
    hit = _kernels(doc)[:3]
    for e in hit:
        damage(e)
    p = tmp_path / "damaged.json"
    p.write_text(json.dumps(doc))
    code, _, err = _run(capsys, "analyze", p)
    lines = [line for line in err if words in line]
    assert code == 0 and len(lines) == 1 and str(p) in lines[0] and "warning" in lines[0], err
