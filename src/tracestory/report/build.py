"""Assemble and write a report: the Markdown story plus optional JSON and plots.

This is the one place that joins the analyses with the optional inputs (Nsight Compute
metrics, capture manifests) before handing them to the Markdown renderer.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

DEMO_TRACE = "llama2layer_eager_decode.trace.json.gz"


def extra_sections(inputs, analyses, *, peaks_path=None) -> tuple[dict[str, str], list | None]:
    """Section bodies from the optional inputs, and the ncu JSON rows (or None)."""
    from .hardware_glue import estimated_roofline_section, hardware_results

    sections: dict[str, str] = {}
    hw_json = None
    if inputs.kernel_metrics:
        hw_json, body = hardware_results(inputs, analyses, peaks_path=peaks_path)
        if body:
            sections["Hardware Behavior Analysis"] = body
    else:
        manifest = inputs.manifests[0] if inputs.manifests else None
        estimate = estimated_roofline_section(analyses, peaks_path=peaks_path, manifest=manifest)
        if estimate:
            sections["_hardware_estimate"] = estimate
    if inputs.manifests:
        from .manifest_sections import render_actions_log, render_environment, render_reproduction

        manifest = inputs.manifests[0]
        sections["Environment"] = render_environment(manifest)
        sections["Actions Log"] = render_actions_log(manifest)
        sections["Reproduction Guide"] = render_reproduction(manifest)
    return sections, hw_json


def write_report(inputs, analyses, *, output: Path, goal=None, questions=(), plots=False, json_path=None,
                 peaks_path=None, command=None) -> Path:
    from . import jsonout
    from .markdown import render_report

    sections, hw_json = extra_sections(inputs, analyses, peaks_path=peaks_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    if plots:
        from .plots import write_plots

        images = write_plots(analyses, output.parent, stem=output.stem)
        sections["_plots"] = "\n".join(f"![{p.stem}]({p.name})" for p in images)
    text = render_report(analyses, goal=goal, questions=tuple(questions), extra_sections=sections,
                         inputs=list(inputs.paths), command=command)
    output.write_text(text)
    if json_path:
        Path(json_path).write_text(json.dumps(jsonout.document(analyses, hardware=hw_json), indent=1) + "\n")
    return output


def demo_trace_path() -> Path:
    return Path(str(resources.files("tracestory") / "data" / "demo" / DEMO_TRACE))


def demo(output_dir: Path) -> Path:
    """Report on the bundled H200 Llama trace into ``output_dir/report.md`` (+ analysis.json)."""
    from ..analyze import analyze
    from ..ingest import load_inputs

    inputs = load_inputs([demo_trace_path()])
    analyses = [analyze(t) for t in inputs.traces]
    output_dir.mkdir(parents=True, exist_ok=True)
    return write_report(inputs, analyses, output=output_dir / "report.md",
                        goal="Understand where GPU time goes in Llama prefill and decode on the H200, and what to optimize first.",
                        json_path=output_dir / "analysis.json", command="tracestory demo")
