"""Each command imports its own code only: ``tracestory --version`` imports no analysis, and
``analyze`` imports no serve, bench, capture or load-generator module (nor asyncio, which only
those use); of a Kineto trace, ``analyze`` imports no other format's reader, no serving,
multi-GPU or telemetry pass and none of the report's renderers (they are reached by name,
:mod:`tracestory.lazy`, when an input needs them). Run in fresh interpreters; the modules loaded
are read from ``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import H100_BERT, TEST_DATA

OTHER_COMMANDS = ("tracestory.serve", "tracestory.bench", "tracestory.capture", "tracestory.loadgen",
                  "tracestory.cli.serve", "tracestory.cli.bench", "tracestory.cli.capture", "tracestory.cli.loadgen")


def _modules_after(argv: list[str]) -> tuple[int, list[str], str]:
    code = ("import json, sys\n"
            "from tracestory.cli import main\n"
            f"sys.argv = ['tracestory', *{argv!r}]\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "sys.stdout.flush()\n"
            "print('\\nMODULES', json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
            "sys.exit(rc)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    modules = json.loads(p.stderr.rsplit("MODULES ", 1)[1])
    return p.returncode, modules, p.stdout


def test_version_imports_no_command():
    rc, modules, out = _modules_after(["--version"])
    assert rc == 0 and out.startswith("tracestory ")
    ours = [m for m in modules if m.startswith("tracestory")]
    assert ours == ["tracestory", "tracestory.cli", "tracestory.errors", "tracestory.version"], ours
    assert "numpy" not in modules and "asyncio" not in modules


def test_analyze_imports_no_serve_bench_capture_or_loadgen(tmp_path):
    out = tmp_path / "a.json"
    rc, modules, _ = _modules_after(["analyze", str(H100_BERT), "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["traces"]
    loaded = [m for m in modules if m.startswith(OTHER_COMMANDS)]
    assert loaded == [] and "asyncio" not in modules, loaded


# What a Kineto trace's analyze does not need: the other readers (and their record types), the
# serving run's files and passes, the multi-GPU pass, the telemetry analysis, the report's
# renderers (Markdown sections, HTML, plots, the Execution Story), the rank pool, and the builders of
# the named tables (--table; the JSON's nsys summaries).
NOT_FOR_A_KINETO_TRACE = (
    "tracestory.ingest.nsys_sqlite", "tracestory.ingest.nsys_rep", "tracestory.ingest.nsys_csv",
    "tracestory.ingest.nsys_db", "tracestory.ingest.ncu", "tracestory.ingest.ncu_rep", "tracestory.ingest.ncu_csv",
    "tracestory.ingest.rocprof_json", "tracestory.ingest.scheduler_log", "tracestory.ingest.load_summary",
    "tracestory.ingest.ranks", "tracestory.ingest.kineto_modules", "tracestory.parallel",
    "tracestory.analysis.batching", "tracestory.analysis.serving_story", "tracestory.analysis.multigpu",
    "tracestory.analysis.findings.multigpu", "tracestory.analysis.telemetry", "tracestory.analysis.findings.telemetry",
    "tracestory.analysis.story", "tracestory.analysis.category_totals", "tracestory.analysis.ncu_join",
    "tracestory.analysis.questions", "tracestory.analysis.collectives", "tracestory.analysis.operators",
    "tracestory.analysis.window", "tracestory.analysis.tables", "tracestory.analysis.nsys_tables",
    "tracestory.render.build", "tracestory.render.html", "tracestory.render.markdown", "tracestory.render.sections",
    "tracestory.render.story", "tracestory.render.batch_story", "tracestory.render.multigpu",
    "tracestory.render.plots", "tracestory.render.timeline_page", "tracestory.cli.story",
)


def test_analyze_of_a_kineto_trace_imports_only_what_it_needs(tmp_path):
    """The terminal tables (what benchmarks/startup.py times) and the JSON; GPU time per operator
    and the nsys summary tables are computed for the JSON only."""
    rc, modules, out = _modules_after(["analyze", str(H100_BERT)])
    assert rc == 0 and "GPU time by category" in out
    loaded = [m for m in modules if m.startswith(NOT_FOR_A_KINETO_TRACE)]
    assert loaded == [], loaded
    # the Kineto worker processes (off by default) and the telemetry sampler's host name
    assert "multiprocessing" not in modules and "socket" not in modules
    assert {"tracestory.ingest.kineto", "tracestory.render.terminal", "tracestory.cli.analyze"} <= set(modules)
    doc = tmp_path / "a.json"
    rc, modules, _ = _modules_after(["analyze", str(H100_BERT), "--json", str(doc)])
    assert rc == 0 and json.loads(doc.read_text())["traces"][0]["source"]["format"] == "kineto"
    loaded = [m for m in modules if m.startswith(NOT_FOR_A_KINETO_TRACE)]
    # the JSON's operators and nsys_summaries keys
    assert loaded == ["tracestory.analysis.nsys_tables", "tracestory.analysis.operators",
                      "tracestory.analysis.tables"], loaded


def test_the_readers_and_passes_reached_by_name_still_come_when_needed(tmp_path):
    """The other side: an input that needs a lazy reader or pass gets it. An nsys export; a TP
    serving capture folder (two ranks, a scheduler event log, GPU telemetry), whose JSON holds the
    batching, multigpu and telemetry keys (its README: a TP=2 serving capture on two H100s, with
    GPU telemetry; the JSON of the code before this change holds the same three keys)."""
    out = tmp_path / "a.json"
    rc, modules, _ = _modules_after(["analyze", str(TEST_DATA / "public" / "nsys_2024.5_a100_cloverleaf.sqlite"),
                                     "--json", str(out)])
    assert rc == 0 and "tracestory.ingest.nsys_sqlite" in modules
    rc, modules, out_text = _modules_after(["analyze", str(H100_BERT), "--table", "kernels", "--format", "csv"])
    assert rc == 0 and out_text.startswith("name,") and "tracestory.analysis.tables" in modules
    rc, modules, _ = _modules_after(["analyze", str(TEST_DATA / "tp_serve_gpu"), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and {"batching", "multigpu", "telemetry"} <= set(doc)
    wanted = {"tracestory.ingest.scheduler_log", "tracestory.analysis.batching", "tracestory.render.batch_story",
              "tracestory.analysis.multigpu", "tracestory.analysis.findings.multigpu", "tracestory.render.multigpu",
              "tracestory.analysis.telemetry"}
    assert wanted <= set(modules), sorted(wanted - set(modules))


def test_help_lists_every_command_with_its_own_help():
    """The one-line help in cli.COMMANDS (shown without importing the commands) is each module's own."""
    from tracestory.cli import COMMANDS, build_parser

    def helps(parser):
        sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
        return [(a.dest, a.help) for a in sub._choices_actions]

    full = helps(build_parser())            # every module imported, its register() used
    light = helps(build_parser(""))         # names and help only
    assert full == light == [(name, help_) for name, _, help_ in COMMANDS]
