"""First contact: the small things a new user meets (version, the files a report writes, a
manifest passed instead of its folder, charts that stay readable), each checked as behaviour."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import H200_LLAMA, TEST_DATA

from tracestory.cli import main
from tracestory.version import __version__


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tracestory {__version__}"


def test_report_lists_every_file_it_wrote(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # a test dependency; plots need it
    out = tmp_path / "r.md"
    assert main(["report", str(H200_LLAMA), "-o", str(out), "--json", str(tmp_path / "r.json"), "--plots",
                 "--html"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    written = sorted(p.name for p in tmp_path.iterdir())
    assert sorted(p.rsplit("/", 1)[-1] for p in printed) == written   # every file, and only those
    assert printed[0].endswith("r.md") and any(p.endswith(".png") for p in printed)


def test_a_capture_manifest_points_to_its_folder(capsys):
    manifest = TEST_DATA / "multigpu" / "tp2_even" / "manifest.json"
    assert main(["analyze", str(manifest)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass the capture folder" in err[0] and "tp2_even" in err[0]


def test_phase_chart_width_is_capped(tmp_path):
    pytest.importorskip("matplotlib")
    from tracestory.analysis import analyze
    from tracestory.analysis.phases import Phase
    from tracestory.ingest import load_inputs
    from tracestory.render.plots import plot_phases

    a = analyze(load_inputs([H200_LLAMA]).traces[0])
    one = a.phases.phases[1]
    many = tuple(dataclasses.replace(one, index=i, name=f"step_{i}") for i in range(288))
    a = dataclasses.replace(a, phases=dataclasses.replace(a.phases, phases=many))
    png = plot_phases(a, tmp_path / "p.png")
    width = int.from_bytes(png.read_bytes()[16:20], "big")   # PNG IHDR width
    assert isinstance(one, Phase) and width <= 14 * 110 + 200   # 14 in at 110 dpi, tight bbox margin


def test_close_roofline_points_share_one_label():
    from tracestory.render.plots import _label_groups

    # 1 and 2 are 0.04 decades apart on both axes, 3 is a decade away
    assert _label_groups([(1.0, 1e12), (1.1, 1.1e12), (10.0, 1e13)]) == [[0, 1], [2]]


def test_a_weak_batch_fit_stays_out_of_the_summary():
    from types import SimpleNamespace

    from tracestory.render.sections.summary import FIT_R2_FLOOR, _batch_summary

    fit = SimpleNamespace(r_squared=0.02, b_prefill_ns_per_token=None, b_decode_ns_per_seq=1e5, a_ns=-8.11e6)
    d = SimpleNamespace(count=0, p50_ns=None, p99_ns=None)
    b = SimpleNamespace(requests=[], kinds={}, ttft=d, e2e=d, iteration_ns=d, client=None, stalls=(), fit=fit,
                        preemptions=())
    assert "R^2" not in _batch_summary(b) and FIT_R2_FLOOR == 0.5


def test_progress_bar_clears_its_line_and_analysis_has_a_status(monkeypatch):
    """On a terminal: a bar appears for a load that takes over a second, is cleared (transient)
    when the load ends, and a status line covers the analysis; off a terminal nothing is drawn."""
    import io
    import time

    from rich.console import Console

    from tracestory.cli.common import progress_factory

    buf = io.StringIO()
    prog = progress_factory(Console(file=buf, force_terminal=True, width=80))
    clock = iter([0.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock, 3.0))
    update = prog(type("P", (), {"name": "t.json.gz"})())
    update(10, 100)
    update(100, 100)
    assert len(prog.bars) == 1 and "reading t.json.gz" in buf.getvalue()
    prog.close()
    # transient: the bar's line is erased (cursor up, erase line) and the cursor shown again
    assert prog.bars == [] and buf.getvalue().endswith("\x1b[1A\x1b[2K") and "\x1b[?25h" in buf.getvalue()
    quiet = io.StringIO()
    off = progress_factory(Console(file=quiet, force_terminal=False))
    off(type("P", (), {"name": "x"})())(100, 100)
    with off.status("analyzing"):
        pass
    assert quiet.getvalue() == "" and off.bars == []
