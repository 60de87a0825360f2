"""docs/ARCHITECTURE.md checked against the code: its layer block is the layer contract of
tests/api/test_layers.py, every module (or module's function, rule, class) its feature map and
its prose name exists, and every command the feature map names is a command of the CLI."""

from __future__ import annotations

import importlib
import re

import pytest
from conftest import REPO
from test_layers import LAYER

DOC = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
# the package each middle column of the feature map names modules of
COLUMNS = {1: "ingest", 2: "analysis", 3: "analysis", 4: "render"}
PACKAGES = ("analysis", "render", "ingest", "cli", "export", "capture", "loadgen", "serve", "bench", "models",
            "telemetry")


def _resolve(dotted: str) -> bool:
    """Whether ``tracestory.<dotted>`` is a module, or an attribute chain of the longest module prefix."""
    parts = ["tracestory", *dotted.split(".")]
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _block_after(heading: str) -> list[str]:
    text = DOC[DOC.index(heading):]
    start = text.index("```\n") + 4
    return text[start:text.index("```", start)].strip("\n").splitlines()


def test_layer_block_is_the_layer_contract():
    rows = [line.split() for line in _block_after("## Layers")]
    drawn = {name: len(rows) - i for i, row in enumerate(rows) for name in row}
    assert drawn == LAYER


def _feature_rows() -> list[list[str]]:
    lines = DOC[DOC.index("## Feature map"):].splitlines()
    table = [ln for ln in lines if ln.startswith("| ")]
    assert table[0].startswith("| feature |")
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in table[1:] if not ln.startswith("| ---")]


def _names(cell: str) -> list[str]:
    bare = re.sub(r"\([^)]*\)", "", cell)
    out = []
    for part in bare.split(","):
        part = part.strip().strip("`")
        if part and part not in ("—", "every reader"):
            out.append(part.replace("/", "."))
    return out


def test_feature_map_names_modules_that_exist():
    rows = _feature_rows()
    assert len(rows) >= 20
    missing = []
    for row in rows:
        for col, package in COLUMNS.items():
            for name in _names(row[col]):
                if not _resolve(f"{package}.{name}"):
                    missing.append((row[0][:40], f"{package}/{name}"))
    assert missing == []


def test_feature_map_names_the_features_of_the_step():
    """The facts -> claims -> renderers step: its features each have a row."""
    features = " ".join(r[0] for r in _feature_rows())
    for word in ("workload", "trace kind", "claims", "advice", "gaps", "loops"):
        assert word in features, word


def test_feature_map_commands_exist():
    from tracestory.cli import COMMANDS

    names = {c[0] for c in COMMANDS}
    cells = (re.sub(r"`[^`]*`", "", r[6]) for r in _feature_rows())   # flags quoted after a command
    used = {w.strip().split()[0] for cell in cells for w in cell.split(",") if w.strip()}
    assert used and used <= names, used - names


def test_modules_named_in_prose_exist():
    """Every `package/module.py` and `package/module.name` the page quotes."""
    quoted = set(re.findall(rf"`((?:{'|'.join(PACKAGES)})/[\w/]+(?:\.py|\.\w+)?)`", DOC))
    assert len(quoted) >= 10
    missing = []
    for q in sorted(quoted):
        path = q.removesuffix(".py").rstrip("/")
        if not _resolve(path.replace("/", ".")):
            missing.append(q)
    assert missing == []


@pytest.mark.parametrize("path", sorted(set(re.findall(r"`((?:tests|docs|tools)/[\w/.\-]+)`", DOC))))
def test_files_named_in_prose_exist(path):
    assert (REPO / path).exists()
