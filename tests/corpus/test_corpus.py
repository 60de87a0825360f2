"""The field corpus: every trace in tests/data with a sidecar of expectations written by hand from the
file itself (tests/data/corpus/README.md), checked against what tracestory tells of it.

The truth fields are compared with the run's facts (trace kind, platform, framework, engine, mode,
workload, graph replays, kernel count: summed over the files of a set); the ``must`` / ``must_not``
regexes with the Markdown report. Nsight Compute files alone carry no run facts: their kind, kernel
count and report are checked.
A sidecar with ``known_wrong`` names what the report still gets wrong: the test then expects the
failure (a strict xfail, so a fix turns it red until the note is removed).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from conftest import REPO

import tracestory
from tracestory.cli import main
from tracestory.errors import TracestoryError

DATA = REPO / "tests" / "data"


def sidecars() -> list[Path]:
    return sorted([*DATA.rglob("*.expect.toml"), *DATA.rglob("EXPECT.toml")])


def _inputs(sidecar: Path, doc: dict) -> list[Path]:
    if doc.get("inputs"):
        return [sidecar.parent / p for p in doc["inputs"]]
    return [sidecar.with_name(sidecar.name[: -len(".expect.toml")])]


def _id(p: Path) -> str:
    rel = p.relative_to(DATA)
    return str(rel.parent if rel.name == "EXPECT.toml" else rel).removesuffix(".expect.toml")[-60:]


def _as_list(v) -> list:
    return v if isinstance(v, list) else [v]


def check(sidecar: Path, tmp_path: Path) -> list[str]:
    """Every expectation of ``sidecar`` that does not hold, one line each."""
    doc = tomllib.loads(sidecar.read_text())
    truth, want = doc.get("truth", {}), doc.get("report", {})
    paths = [str(p) for p in _inputs(sidecar, doc)]
    wrong: list[str] = []
    if truth.get("refused"):
        rc = main(["report", *paths, "-o", str(tmp_path / "r.md")])
        if rc != 2:
            wrong.append(f"expected exit 2 (refused), got {rc}")
        try:
            tracestory.analyze(paths)
        except TracestoryError as e:
            if truth.get("error") and not re.search(truth["error"], str(e), re.I):
                wrong.append(f"error {str(e)!r} does not match {truth['error']!r}")
        return wrong
    results = tracestory.analyze(paths)
    text = tracestory.report(results, tmp_path / "r.md").read_text()
    runs = results.runs
    if not runs and results.hardware:
        # Nsight Compute alone: per-kernel metrics, no timeline and no run facts (framework, workload and
        # mode are not told from kernel metrics); the kind, the kernel count and the report are checked.
        if truth.get("kind") not in (None, "summary_only"):
            wrong.append(f"kind: Nsight Compute input is summary_only, expected {truth['kind']!r}")
        n = sum(len(h.metrics.kernels) for h in results.hardware)
        if "kernels" in truth and n != truth["kernels"]:
            wrong.append(f"kernels: {n} read, {truth['kernels']} expected")
    elif not runs:
        return [f"no trace in the results of {paths}"]
    for run in runs:
        f = run.facts
        got = {"kind": f.kind.kind, "platform": f.platform, "framework": f.producer.framework,
               "engine": f.producer.engine or "", "mode": f.producer.mode, "workload": f.workload.kind,
               "graph_replays": f.producer.graphs.graph_kernels > 0}
        for key, value in got.items():
            if key in truth and value not in _as_list(truth[key]):
                wrong.append(f"{run.trace.label}: {key} is {value!r}, expected {truth[key]!r}")
    if runs and "kernels" in truth and sum(len(r.trace.kernels) for r in runs) != truth["kernels"]:
        wrong.append(f"kernels: {sum(len(r.trace.kernels) for r in runs)} read, {truth['kernels']} expected")
    for rx in want.get("must", []):
        if not re.search(rx, text, re.I | re.M):
            wrong.append(f"report lacks /{rx}/")
    for rx in want.get("must_not", []):
        m = re.search(rx, text, re.I | re.M)
        if m:
            line = text[text.rfind("\n", 0, m.start()) + 1: text.find("\n", m.end())]
            wrong.append(f"report says /{rx}/: {line.strip()[:160]}")
    return wrong


def _params():
    out = []
    for p in sidecars():
        note = tomllib.loads(p.read_text()).get("report", {}).get("known_wrong", "")
        marks = [pytest.mark.xfail(strict=True, reason=f"known wrong: {note}")] if note else []
        out.append(pytest.param(p, marks=marks, id=_id(p)))
    return out


def test_the_corpus_is_large_and_every_trace_has_expectations():
    assert len(sidecars()) >= 40
    for p in sidecars():
        doc = tomllib.loads(p.read_text())
        assert doc.get("truth") and doc.get("read_by"), p
        for path in _inputs(p, doc):
            assert path.is_file(), path


@pytest.mark.parametrize("sidecar", _params())
def test_expectations_hold(sidecar, tmp_path):
    wrong = check(sidecar, tmp_path)
    assert not wrong, "\n".join(wrong)
