"""Write a report: the Markdown story, and when asked its JSON document and PNG plots, all read
from one :class:`~tracestory.analysis.results.Results`."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..analysis.results import AnalysisOptions, Results, analyze_inputs
from ..ingest import load_inputs
from . import jsonout
from .html import write_html
from .markdown import render_report

DEMO_TRACE = "llama2layer_eager_decode.trace.json.gz"
DEMO_GOAL = "Understand where GPU time goes in Llama prefill and decode on the H200, and what to optimize first."


def write_plots_for(results: Results, out_dir: Path, stem: str) -> list[Path]:
    """Every PNG figure of the report (matplotlib), in report order."""
    from .multigpu import plot_multigpu
    from .plots import write_hardware_plots, write_plots

    images = write_plots(results.runs, out_dir, stem=stem)
    rows = jsonout.kernel_rows(results.hardware) if results.hardware else None
    images += write_hardware_plots(rows, results.runs, out_dir, stem=stem)
    if results.multigpu is not None:
        img = plot_multigpu(results.multigpu, out_dir / f"{stem}_multigpu.png")
        images += [img] if img else []
    return images


def write_report(results: Results, output: Path, *, plots: bool = False, json_path=None) -> Path:
    """Write the Markdown report of ``results`` to ``output`` (and its JSON document and PNG
    plots when asked); returns ``output``."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    images = write_plots_for(results, output.parent, output.stem) if plots else []
    output.write_text(render_report(results, plots=images))
    if json_path:
        write_json(results, Path(json_path))
    return output


def write_json(results: Results, path: Path) -> Path:
    path.write_text(json.dumps(jsonout.document(results), indent=1) + "\n")
    return path


def demo_trace_path() -> Path:
    return Path(str(resources.files("tracestory") / "data" / "demo" / DEMO_TRACE))


def demo(output_dir: Path) -> Path:
    """Report on the bundled H200 Llama trace into ``output_dir/report.md`` (+ analysis.json and
    report.html)."""
    results = analyze_inputs(load_inputs([demo_trace_path()]),
                             AnalysisOptions(goal=DEMO_GOAL, command="tracestory demo"))
    output_dir.mkdir(parents=True, exist_ok=True)
    out = write_report(results, output_dir / "report.md", json_path=output_dir / "analysis.json")
    write_html(out, output_dir / "report.html")
    return out
