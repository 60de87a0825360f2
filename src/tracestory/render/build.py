"""Write a report: the Markdown story, and when asked its JSON document and PNG plots, all read
from one :class:`~tracestory.analysis.results.Results`."""

from __future__ import annotations

import json
from pathlib import Path

from .. import outputs
from ..analysis.results import Results
from . import jsonout
from .markdown import render_report
from .multigpu import plot_multigpu
from .plots import plot_telemetry, write_hardware_plots, write_plots
from .plots_serving import write_serving_plots


def write_plots_for(results: Results, out_dir: Path, stem: str) -> list[Path]:
    """Every PNG figure of the report (matplotlib), in report order."""

    images = write_serving_plots(results.batching, out_dir, stem=stem) if results.batching is not None else []
    images += write_plots(results.runs, out_dir, stem=stem)
    rows = jsonout.kernel_rows(results.hardware) if results.hardware else None
    images += write_hardware_plots(rows, results.runs, out_dir, stem=stem)
    if results.multigpu is not None:
        img = plot_multigpu(results.multigpu, out_dir / f"{stem}_multigpu.png")
        images += [img] if img else []
    if getattr(results, "telemetry", None) is not None:
        img = plot_telemetry(results.telemetry, out_dir / f"{stem}_telemetry.png")
        images += [img] if img else []
    return images


def write_report(
    results: Results, output: Path, *, plots: bool = False, json_path=None, written: list | None = None
) -> Path:
    """Write the Markdown report of ``results`` to ``output`` (and its JSON document and PNG
    plots when asked); returns ``output``. ``written``, when given, receives every file written."""
    to_stdout = outputs.is_stdout(output)
    output = Path(output)
    if not to_stdout:
        outputs.ensure_folder(output.parent)
    images = write_plots_for(results, output.parent, output.stem) if plots and not to_stdout else []
    outputs.write_text(output if not to_stdout else outputs.STDOUT, render_report(results, plots=images))
    if json_path:
        write_json(results, json_path)
    if written is not None:
        written += [p for p in (None if to_stdout else output, json_path) if p and not outputs.is_stdout(p)]
        written += images
    return output


def write_json(results: Results, path) -> Path:
    """The JSON document of ``results`` (``-``: standard output), written atomically."""
    outputs.write_text(path, json.dumps(jsonout.document(results), indent=1) + "\n")
    return Path(path)
