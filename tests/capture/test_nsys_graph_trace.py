"""`capture nsys` and CUDA graphs: ``--cuda-graph-trace=node`` is passed when the installed nsys
lists it in ``nsys profile --help``; otherwise a warning that graph replays will be opaque. The
manifest records which. Real nsys cannot run on the project's machines: a stand-in nsys prints
a help text with or without the option (the option's spelling as the Nsight Systems CLI
documents it) and writes the files a capture expects.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tracestory.capture import nsys as _nsys
from tracestory.capture import pipeline
from tracestory.cli import main

STAND_IN = r'''#!{py}
import sys
a = sys.argv[1:]
if a[:2] == ["profile", "--help"]:
    print("usage: nsys profile [<args>] [application] [<application args>]")
    print("  -t, --trace=     Possible values are 'cuda', 'nvtx', 'osrt' ...")
    if "{graph}" == "yes":
        print("  --cuda-graph-trace=   Possible values are 'graph' or 'node' ...")
    sys.exit(0)
opt = {{k: v for k, _, v in (x[2:].partition("=") for x in a if x.startswith("--"))}}
if a[0] == "profile":
    open(opt["output"] + ".nsys-rep", "wb").write(" ".join(a).encode())
else:
    open(opt["output"], "wb").write(b"SQLite format 3\0" + b"s" * 100)
'''


pytestmark = pytest.mark.usefixtures("clean_cwd")  # an empty folder, no TRACESTORY_* variables


def install(tmp_path: Path, monkeypatch, graph: bool) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nsys"
    exe.write_text(STAND_IN.format(py=sys.executable, graph="yes" if graph else "no"))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_supported_nsys_gets_node_tracing_and_the_manifest_says_so(tmp_path, monkeypatch, capsys):
    install(tmp_path, monkeypatch, graph=True)
    assert _nsys.graph_trace_support() is True
    p = pipeline.plan("nsys", ["python", "w.py"], {})
    profile = next(s for s in p.steps if s.name == "nsys-profile")
    assert list(profile.shown[:8]) == [
        "nsys", "profile", "--output=artifacts/w/nsys/w", "--force-overwrite=true", "--trace=cuda,nvtx,osrt",
        "--cuda-memory-usage=true", "--sample=none", "--cuda-graph-trace=node"]
    (tmp_path / "w.py").write_text("")
    assert main(["capture", "nsys", "--name", "g", "--", sys.executable, "w.py"]) == 0
    assert "warning" not in capsys.readouterr().err
    cap = json.loads((tmp_path / "artifacts" / "g" / "manifest.json").read_text())["captures"][-1]
    assert cap["tool_options"] == {"cuda_graph_trace": "node"}
    # the stand-in wrote its own argv into the report: the option reached nsys
    assert "--cuda-graph-trace=node" in (tmp_path / "artifacts" / "g" / "nsys" / "g.nsys-rep").read_text()


def test_nsys_without_the_option_warns_that_graph_replays_are_opaque(tmp_path, monkeypatch, capsys):
    install(tmp_path, monkeypatch, graph=False)
    assert _nsys.graph_trace_support() is False
    p = pipeline.plan("nsys", ["python", "w.py"], {})
    profile = next(s for s in p.steps if s.name == "nsys-profile")
    assert not any(a.startswith("--cuda-graph-trace") for a in profile.argv)
    (tmp_path / "w.py").write_text("")
    assert main(["capture", "nsys", "--name", "g", "--", sys.executable, "w.py"]) == 0
    err = capsys.readouterr().err
    assert "capture nsys: warning:" in err and "graph replays will be opaque" in err
    cap = json.loads((tmp_path / "artifacts" / "g" / "manifest.json").read_text())["captures"][-1]
    assert cap["tool_options"]["cuda_graph_trace"] == "graph"
    assert "graph replays will be opaque" in cap["tool_options"]["warning"]


def test_without_nsys_nothing_is_claimed(tmp_path, monkeypatch):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert _nsys.graph_trace_support() is None
    p = pipeline.plan("nsys", ["python", "w.py"], {})
    assert p.tool_options["cuda_graph_trace"] is None
    assert not any(a.startswith("--cuda-graph-trace") for s in p.steps for a in s.argv)


def test_other_tools_record_no_tool_options():
    assert pipeline.plan("ncu", ["python", "w.py"], {}).tool_options == {}
