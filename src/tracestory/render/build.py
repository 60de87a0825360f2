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


def multigpu_result(analyses):
    """The multi-GPU analysis when the inputs hold several ranks (traces with collectives or
    distinct ranks), else None."""
    traces = [a.trace for a in analyses]
    if len(traces) < 2:
        return None
    ranks = {t.meta.rank for t in traces if t.meta.rank is not None}
    if len(ranks) < 2 and not any(len(t.collectives) for t in traces):
        return None
    from ..analysis.multigpu import combine, rank_summary

    return combine([rank_summary(t) for t in traces])


def write_report(inputs, analyses, *, output: Path, goal=None, questions=(), plots=False, json_path=None,
                 peaks_path=None, command=None, batch=None, extra_inputs=()) -> Path:
    """Write the Markdown report (and the JSON and plots when asked). ``batch``: the analysed
    scheduler event log (:func:`~tracestory.analysis.batching.analyze_batching`), whose
    Continuous Batching story opens the Execution Story."""
    from . import jsonout
    from .markdown import render_report

    sections, hw_json = extra_sections(inputs, analyses, peaks_path=peaks_path)
    multigpu = multigpu_result(analyses)
    output.parent.mkdir(parents=True, exist_ok=True)
    if plots:
        from .plots import write_plots

        from .plots import write_hardware_plots

        images = write_plots(analyses, output.parent, stem=output.stem)
        images += write_hardware_plots(hw_json, analyses, output.parent, stem=output.stem, peaks_path=peaks_path,
                                       manifest=inputs.manifests[0] if inputs.manifests else None)
        if multigpu is not None:
            from .multigpu import plot_multigpu

            img = plot_multigpu(multigpu, output.parent / f"{output.stem}_multigpu.png")
            images = [*images, *([img] if img else [])]
        sections["_plots"] = "\n".join(f"![{p.stem}]({p.name})" for p in images)
    text = render_report(analyses, goal=goal, questions=tuple(questions), extra_sections=sections,
                         inputs=[*map(str, inputs.paths), *map(str, extra_inputs)], command=command,
                         multigpu=multigpu, kernel_metrics=inputs.kernel_metrics or None, batch=batch)
    output.write_text(text)
    if json_path:
        doc = jsonout.document(analyses, hardware=hw_json, kernel_metrics=inputs.kernel_metrics or None)
        if multigpu is not None:
            from .multigpu import multigpu_json

            doc["multigpu"] = multigpu_json(multigpu)
        if batch is not None:
            from .batch_story import batch_json

            doc["batching"] = batch_json(batch)
        Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")
    return output


def demo_trace_path() -> Path:
    return Path(str(resources.files("tracestory") / "data" / "demo" / DEMO_TRACE))


def demo(output_dir: Path) -> Path:
    """Report on the bundled H200 Llama trace into ``output_dir/report.md`` (+ analysis.json and
    report.html)."""
    from ..analysis import analyze
    from ..ingest import load_inputs

    inputs = load_inputs([demo_trace_path()])
    analyses = [analyze(t) for t in inputs.traces]
    output_dir.mkdir(parents=True, exist_ok=True)
    out = write_report(inputs, analyses, output=output_dir / "report.md",
                       goal="Understand where GPU time goes in Llama prefill and decode on the H200, and what to optimize first.",
                       json_path=output_dir / "analysis.json", command="tracestory demo")
    from .html import write_html

    write_html(out, output_dir / "report.html")
    return out
