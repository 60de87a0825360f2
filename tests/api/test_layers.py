"""The layer contract: no module imports a layer above its own, and no import cycle between
modules. Read from the source (every ``import`` statement, module level or inside a function),
not from what happens to be imported at run time.

Layers, top to bottom (a package may import only packages of lower rows):

    cli
    render  export  bench  serve  loadgen
    analysis  capture  models
    parallel
    ingest
    trace  specs  outputs  telemetry
    units  stats  errors  lazy

Code reached by name (``tracestory.lazy.entry("tracestory.<module>", "<name>")``: a reader, an
analysis pass or a renderer that only some inputs need) is held to the same rule: each call names
its target in literal strings, points down the stack (or within its package) and is listed in
``PLUGIN_POINTS`` with the reason it is reached by name.
"""

from __future__ import annotations

import ast

from conftest import REPO

SRC = REPO / "src" / "tracestory"
LAYER = {"cli": 7, "render": 6, "export": 6, "bench": 6, "serve": 6, "loadgen": 6, "analysis": 5, "capture": 5,
         "models": 5, "parallel": 4, "ingest": 3, "trace": 2, "specs": 2, "outputs": 2, "telemetry": 2, "units": 1,
         "stats": 1, "errors": 1, "version": 1, "lazy": 1}
# The one sideways edge: the load generator counts prompt tokens with the reference server's rule.
ALLOWED = {("loadgen", "serve")}
# Modules whose import pulls a heavy optional dependency (torch, triton): the only internal imports
# that may sit inside a function, so that importing tracestory never imports torch.
# modules with torch (or triton) at their top: imported inside the functions that need them
HEAVY = {"tracestory.models", "tracestory.models.llama", "tracestory.models.fp8", "tracestory.models.flex",
         "tracestory.models.quant_triton", "tracestory.models.glue_triton", "tracestory.models.fp8_small_m",
         "tracestory.models.decode_attn_triton"}


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


# Code reached by name (tracestory.lazy.entry): (calling module, target module) -> why it is not
# imported at the top. Each is an import taken on the code path that needs it, held to the layer rule
# like an import; a renderer reaches only renderers this way (the seam below), and a new point must
# be added here with its reason (test_plugin_points_follow_the_layers).
_READER = "a reader, imported when the sniff names its format; a Kineto trace needs none of them"
_SERVING = "the serving run's pass, run when a scheduler event log is among the inputs"
_MULTI = "the multi-GPU pass, run when two ranks or more are given"
PLUGIN_POINTS = {
    ("tracestory.ingest", "tracestory.ingest.rocprof_json"): _READER,
    ("tracestory.ingest", "tracestory.ingest.nsys_rep"): _READER + " (an .nsys-rep is exported to SQLite)",
    ("tracestory.ingest", "tracestory.ingest.nsys_sqlite"): _READER,
    ("tracestory.ingest", "tracestory.ingest.nsys_csv"): _READER,
    ("tracestory.ingest", "tracestory.ingest.ncu"): _READER + " (Nsight Compute report or CSV)",
    ("tracestory.ingest", "tracestory.ingest.scheduler_log"): _READER + " (its sniff is ingest.sniffs)",
    ("tracestory.ingest", "tracestory.ingest.load_summary"): _READER + " (its sniff is ingest.sniffs)",
    ("tracestory.analysis.results", "tracestory.analysis.batching"): _SERVING,
    ("tracestory.analysis.results", "tracestory.analysis.multigpu"): _MULTI,
    ("tracestory.analysis.results", "tracestory.analysis.findings.multigpu"): _MULTI,
    ("tracestory.analysis.results", "tracestory.analysis.telemetry"): "run when a GPU telemetry file is given",
    ("tracestory.analysis.results", "tracestory.analysis.story"): "the Execution Story, built when the report asks",
    ("tracestory.analysis.results", "tracestory.analysis.tables"): "a named table (--table, the JSON's nsys summaries), "
                                                                   "built when one is asked for (the names: analysis.table_names)",
    ("tracestory.analysis.results", "tracestory.ingest.kineto_modules"):
        "nn.Module ranges, read again from the file when the modules table is asked for",
    ("tracestory.analysis.results", "tracestory.analysis.ncu_join"): "joins Nsight Compute input to a trace, when given",
    ("tracestory.analysis.facts", "tracestory.analysis.ncu_join"): "joins Nsight Compute input to a trace, when given",
    ("tracestory.analysis.results", "tracestory.analysis.questions"): "maps --goal and --question to findings, when asked",
    ("tracestory.analysis.results", "tracestory.analysis.operators"):
        "GPU time per operator, computed on request (the JSON, the report, an op table; not the terminal tables)",
    ("tracestory.analysis.tables", "tracestory.analysis.operators"):
        "GPU time per operator, computed on request (the JSON, the report, an op table; not the terminal tables)",
    ("tracestory.analysis.results", "tracestory.ingest.ranks"): "`tracestory ranks` only (analyze_ranks)",
    ("tracestory.analysis.results", "tracestory.parallel"): "`tracestory ranks` only (analyze_ranks)",
    ("tracestory.analysis.tables", "tracestory.analysis.collectives"):
        "NCCL collectives of one rank, matched when the collectives table is asked for (or two ranks are given)",
    ("tracestory.analysis.results", "tracestory.analysis.window"): "restricts the traces when a window is asked for",
    ("tracestory.cli.common", "tracestory.analysis.window"): "parses --window/--steps/--steady-state when given",
    ("tracestory.render.jsonout", "tracestory.render.multigpu"): "the JSON's multigpu key, when there is one",
    ("tracestory.render.jsonout", "tracestory.render.batch_story"): "the JSON's batching key, when there is one",
}


def _plugin_calls(mods) -> list[tuple[str, str | None, str | None, int]]:
    """(calling module, target module, attribute, line) of every call of ``entry`` imported from
    tracestory.lazy; target and attribute None where they are not literal strings."""
    out = []
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text())
        local = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and (n.module or "").endswith("lazy") for a in n.names if a.name == "entry"}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in local:
                lits = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None
                        for a in n.args]
                ok = len(lits) == 2 and None not in lits and not n.keywords
                out.append((name, lits[0] if ok else None, lits[1] if ok else None, n.lineno))
    return out


def _without_type_checking(mods, folder) -> dict[str, tuple]:
    """``mods`` copied into ``folder`` with each ``if TYPE_CHECKING:`` block emptied (imports for
    annotations only, which the layer rule reads but which import nothing at run time)."""
    out = {}
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING":
                n.body = [ast.Pass()]
        p = folder / f"{name}.py"
        p.write_text(ast.unparse(tree))
        out[name] = (p, is_pkg)
    return out


def test_plugin_points_follow_the_layers(tmp_path):
    import importlib

    mods = _modules()
    calls = _plugin_calls(mods)
    assert [c for c in calls if c[1] is None] == [], "entry() takes two literal strings: module, name"
    edges = {(a, b) for a, b, _, _ in calls}
    assert edges == set(PLUGIN_POINTS), "a module reached by name needs its line (and reason) in PLUGIN_POINTS"
    for a, b, attr, line in calls:
        assert b in mods, (a, line, b)
        pa, pb = _package(a), _package(b)
        assert pa == pb or LAYER[pa] > LAYER[pb] or (pa, pb) in ALLOWED, (a, b)
        assert not (pa in SEAM_LAYERS and pb in SEAM_SOURCES), (a, b)   # renderers read results only
        if pa == "cli" and pb in CLI_RESTRICTED:   # a command: an entry point, or a class (WindowSpec)
            obj = getattr(importlib.import_module(b), attr)
            assert f"{b}.{attr}" in CLI_ENTRY_POINTS or not _is_function(obj), (a, b, attr)
        assert hasattr(importlib.import_module(b), attr), (b, attr)
    top = {(a, b) for a, b, is_top in _imports(_without_type_checking(mods, tmp_path)) if is_top}
    assert edges & top == set(), "reached by name and imported at the top (not for types only): drop one"
    assert all(why for why in PLUGIN_POINTS.values())


def test_plugin_check_sees_an_entry_call(tmp_path):
    """The check itself: a call through entry() is read, with its literal target or None."""
    mod = tmp_path / "probe.py"
    mod.write_text("from tracestory.lazy import entry as e\nx = 'm'\n"
                   "def f():\n    return e('tracestory.ingest.ncu', 'load_ncu'), e(x, 'y')\n")
    calls = _plugin_calls({"tracestory.render.probe": (mod, False)})
    assert calls == [("tracestory.render.probe", "tracestory.ingest.ncu", "load_ncu", 4),
                     ("tracestory.render.probe", None, None, 4)]


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


# ------------------------------------------------------------------ the seam: results -> output
#
# Renderers and exporters read typed results: a module of ``render/`` or ``export/`` may import
# from ``analysis/`` and ``ingest/`` only classes, constants and type aliases, never a function
# (what it needs is a field of ``Results`` / ``RunFacts``, computed once). The command line goes
# through one door: a ``cli/`` module may use, of ``analysis/``, ``ingest/``, ``render/``,
# ``export/`` and ``loadgen/``, only the entry points below (parse -> one library call ->
# one render call -> ``outputs``). Read from the source like the layer checks above; an imported
# name is classified by importing its module (a class, a constant or a function).

SEAM_LAYERS = ("render", "export")
SEAM_SOURCES = ("analysis", "ingest")
CLI_RESTRICTED = ("analysis", "ingest", "render", "export", "loadgen")
CLI_ENTRY_POINTS = {
    # read and compute
    "tracestory.ingest.load_inputs",
    "tracestory.analysis.results.analyze_inputs",
    "tracestory.analysis.results.analyze_ranks",
    "tracestory.analysis.compare.compare_paths",
    "tracestory.analysis.category_totals.category_totals",
    "tracestory.loadgen.session.run_session",
    # render and export
    "tracestory.render.build.write_report",
    "tracestory.render.html.write_html",
    "tracestory.render.jsonout.document",
    "tracestory.render.jsonout.kernel_rows",
    "tracestory.render.jsonable.jsonable",
    "tracestory.render.terminal.analysis_renderables",
    "tracestory.render.terminal.hardware_table",
    "tracestory.render.terminal.comparison_renderables",
    "tracestory.render.tables_out.table_renderable",
    "tracestory.render.tables_out.table_text",
    "tracestory.render.category_table.category_table",
    "tracestory.render.category_table.category_table_text",
    "tracestory.render.compare.render_comparison",
    "tracestory.render.compare.comparison_json",
    "tracestory.render.multigpu.render_multigpu_section",
    "tracestory.render.multigpu.multigpu_json",
    "tracestory.render.checklist.check_file",
    "tracestory.render.checklist.render_text",
    "tracestory.render.compare.gate_line",
    "tracestory.render.window.window_lines",
    "tracestory.export.perfetto.export_perfetto",
}
# What the seam does not hold yet, each with its reason: (module, function or "*") -> why. Empty: the
# seam holds; an entry added here must say why and leave when it is fixed (test_seam_allow_list_is_live).
SEAM_ALLOWED: dict[tuple[str, str], str] = {}


def _bindings(name: str, path, is_pkg: bool) -> dict[str, str]:
    """Local name -> dotted target (a module, or a module's attribute) of every internal import."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("tracestory"):
                for a in node.names:
                    out[a.asname or a.name] = f"{mod}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tracestory.") and a.asname:
                    out[a.asname] = a.name
    return out


def _resolve(dotted: str):
    """(dotted name of the object used, the object): modules are walked into, the first
    non-module attribute is what is used."""
    import importlib

    parts = dotted.split(".")
    obj, i = importlib.import_module(parts[0]), 1
    while i < len(parts):
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            obj = getattr(obj, parts[i])
            return ".".join(parts[: i + 1]), obj
        i += 1
    return dotted, obj


def _uses(mods) -> list[tuple[str, str, object]]:
    """(module, dotted name, object) for every internal name a module uses through its imports."""
    import inspect

    out = []
    for name, (path, is_pkg) in mods.items():
        bound = _bindings(name, path, is_pkg)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            chain = []
            x = node
            while isinstance(x, ast.Attribute):
                chain.append(x.attr)
                x = x.value
            if not (isinstance(x, ast.Name) and x.id in bound and isinstance(x.ctx, ast.Load)):
                continue
            if isinstance(node, ast.Name) or chain:
                dotted, obj = _resolve(".".join([bound[x.id], *reversed(chain)]))
                if not inspect.ismodule(obj):
                    out.append((name, dotted, obj))
    # an Attribute node's inner Name is visited too: keep the longest resolution per spot
    return sorted({(m, d, id(o)): (m, d, o) for m, d, o in out}.values(), key=lambda t: (t[0], t[1]))


def _is_function(obj) -> bool:
    import inspect

    return callable(obj) and not inspect.isclass(obj)


def _defined_in(dotted: str, packages) -> bool:
    parts = dotted.split(".")
    return len(parts) > 2 and parts[1] in packages


def test_renderers_use_no_analysis_or_ingest_function():
    mods = {m: v for m, v in _modules().items() if _package(m) in SEAM_LAYERS}
    bad = sorted({(m, d) for m, d, obj in _uses(mods)
                  if _defined_in(d, SEAM_SOURCES) and _is_function(obj) and (m, d) not in SEAM_ALLOWED
                  and (m, "*") not in SEAM_ALLOWED})
    assert bad == [], "render/ and export/ read typed results: compute this in analysis/ as a field"


def test_cli_calls_only_the_entry_points():
    mods = {m: v for m, v in _modules().items() if _package(m) == "cli"}
    bad = sorted({(m, d) for m, d, obj in _uses(mods)
                  if _defined_in(d, CLI_RESTRICTED) and _is_function(obj) and d not in CLI_ENTRY_POINTS
                  and (m, d) not in SEAM_ALLOWED and (m, "*") not in SEAM_ALLOWED})
    assert bad == [], "a command is parse -> load_inputs/analyze_inputs (or one library call) -> render -> outputs"


def test_seam_allow_list_is_live():
    """Every allow-list entry still names a use that exists (a fixed entry must leave the list)."""
    mods = _modules()
    used = {(m, d) for m, d, _ in _uses({m: v for m, v in mods.items() if _package(m) in ("cli", *SEAM_LAYERS)})}
    for (m, d), why in SEAM_ALLOWED.items():
        assert why
        assert (d == "*" and any(u[0] == m for u in used)) or (m, d) in used, (m, d)
    assert all(_is_function(_resolve(e)[1]) for e in CLI_ENTRY_POINTS)


def test_seam_check_sees_a_function_use(tmp_path):
    """The check itself: a renderer that calls an analysis function is caught, a class is not."""
    mod = tmp_path / "probe.py"
    mod.write_text("from tracestory.analysis.links import gpu_ops_column\nfrom tracestory.analysis import Analysis\n"
                   "from tracestory.analysis import intervals\n"
                   "def f(t):\n    return gpu_ops_column(t, 'x'), intervals.gaps, Analysis\n")
    uses = {d: _is_function(o) for _, d, o in _uses({"tracestory.render.probe": (mod, False)})}
    assert uses == {"tracestory.analysis.links.gpu_ops_column": True, "tracestory.analysis.intervals.gaps": True,
                    "tracestory.analysis.Analysis": False}
