"""The layer contract: no module imports a layer above its own, and no import cycle between
modules. Read from the source (every ``import`` statement, module level or inside a function),
not from what happens to be imported at run time.

Layers, top to bottom (a package may import only packages of lower rows):

    cli
    render  export  bench  serve  loadgen
    analysis  capture  models  parallel
    ingest
    trace  specs  outputs  telemetry
    units  stats  errors
"""

from __future__ import annotations

import ast

from conftest import REPO

SRC = REPO / "src" / "tracestory"
LAYER = {"cli": 6, "render": 5, "export": 5, "bench": 5, "serve": 5, "loadgen": 5, "analysis": 4, "capture": 4,
         "models": 4, "parallel": 4, "ingest": 3, "trace": 2, "specs": 2, "outputs": 2, "telemetry": 2, "units": 1, "stats": 1, "errors": 1, "version": 1}
# The one sideways edge: the load generator counts prompt tokens with the reference server's rule.
ALLOWED = {("loadgen", "serve")}
# Modules whose import pulls a heavy optional dependency (torch, triton): the only internal imports
# that may sit inside a function, so that importing tracestory never imports torch.
# modules with torch (or triton) at their top: imported inside the functions that need them
HEAVY = {"tracestory.models", "tracestory.models.llama", "tracestory.models.fp8", "tracestory.models.flex",
         "tracestory.models.quant_triton"}


def _modules() -> dict[str, tuple]:
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (p, is_pkg)
    return out


def _imports(mods) -> list[tuple[str, str, bool]]:
    """(importer, imported module, at module level?) for every internal import."""
    edges = []
    for name, (path, is_pkg) in mods.items():
        def visit(node, top, name=name, is_pkg=is_pkg):
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, ast.ImportFrom) and ch.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (ch.level - 1)]
                    target = ".".join(base + ([ch.module] if ch.module else []))
                    for alias in ch.names:
                        sub = f"{target}.{alias.name}"
                        edges.append((name, sub if sub in mods else target, top))
                elif isinstance(ch, ast.ImportFrom) and (ch.module or "").startswith("tracestory"):
                    edges.append((name, ch.module, top))
                elif isinstance(ch, ast.Import):
                    edges.extend((name, a.name, top) for a in ch.names if a.name.startswith("tracestory"))
                visit(ch, top and not isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)))
        visit(ast.parse(path.read_text()), True)
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_package_imports_a_layer_above_its_own():
    mods = _modules()
    assert {_package(m) for m in mods} - {""} <= set(LAYER), "a new package needs its row in LAYER"
    bad = sorted({(a, b) for a, b, _ in _imports(mods)
                  if _package(a) and _package(a) != _package(b)
                  and LAYER[_package(a)] <= LAYER[_package(b)]
                  and (_package(a), _package(b)) not in ALLOWED})
    assert bad == []


def test_no_import_cycle_between_modules():
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for a, b, top in _imports(mods):
        if top and b in mods and b != a:
            graph[a].add(b)
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    for m in mods:
        graph[m] = {b for b in graph[m] if not b.startswith(m + ".")}
    color: dict[str, int] = {}
    cycles = []

    def dfs(v, path):
        color[v] = 1
        for w in sorted(graph[v]):
            if color.get(w) == 1:
                cycles.append(path[path.index(w):] + [w])
            elif w not in color:
                dfs(w, path + [w])
        color[v] = 2

    for m in sorted(mods):
        if m not in color:
            dfs(m, [m])
    assert cycles == []


def test_internal_imports_sit_at_module_top():
    """Imports inside functions are for heavy optional dependencies only (HEAVY above)."""
    mods = _modules()
    inside = sorted({(a, b) for a, b, top in _imports(mods) if not top and b in mods and b not in HEAVY})
    assert inside == []


def test_importing_the_package_pulls_no_heavy_dependency():
    import subprocess
    import sys

    code = ("import sys, tracestory, tracestory.cli, tracestory.analysis.results, tracestory.render.build\n"
            "print(sorted(m for m in ('torch', 'triton', 'matplotlib', 'pandas', 'pyarrow', 'dask', 'aiohttp')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
