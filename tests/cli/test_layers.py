"""The package layers, checked from the source: every import, also one inside a function, points
down the stack below (or within its own package, or to a listed sideways edge), and no two
modules import each other, directly or around a loop.

    cli
    render   export   bench   serve   loadgen   parallel
    analysis capture  models
    ingest
    trace    specs    outputs
    units    stats    errors

``tracestory/__init__.py`` (the public verbs) may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

SRC = REPO / "src" / "tracestory"

LAYERS = (
    ("units", "stats", "errors"),
    ("trace", "specs", "outputs"),
    ("ingest",),
    ("analysis", "capture", "models"),
    ("render", "export", "bench", "serve", "loadgen", "parallel"),
    ("cli",),
)
LEVEL = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
# Sideways edges allowed on purpose: the load generator counts tokens as the server does, and a
# capture under load starts our own server and load generator.
SIDEWAYS = {("loadgen", "serve")}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the tracestory modules that ``path`` imports, anywhere in the file."""
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tracestory")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("tracestory"):
                target = node.module
            else:
                continue
            # ``from . import x`` names the submodule x when there is one, else a member of target.
            submodules = {f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")}
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(target)
    return {f for f in found if _exists(f)}


def _exists(name: str) -> bool:
    p = SRC.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}


def test_every_package_has_a_layer():
    tops = {_top(m) for m in _graph()} - {""}
    assert tops <= set(LEVEL), f"packages without a layer: {sorted(tops - set(LEVEL))}"


def test_imports_point_down_the_layers():
    bad = []
    for mod, targets in _graph().items():
        src = _top(mod)
        if not src:
            continue  # tracestory/__init__.py: the public verbs
        for t in targets:
            dst = _top(t)
            if dst and dst != src and LEVEL[dst] >= LEVEL[src] and (src, dst) not in SIDEWAYS:
                bad.append(f"{mod} -> {t}")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = _graph()
    # Package __init__ modules re-export their members; an edge member -> its own package's
    # __init__ is the usual Python shape only when the __init__ does not import the member back.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def strongconnect(v, counter=[0]):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
