"""tracestory: GPU traces in, the story of the execution out.

The verbs::

    traces = tracestory.load("trace.json.gz")        # files -> Trace per rank/process
    result = tracestory.analyze(traces[0])           # Trace -> Analysis (frozen results)
    tracestory.report([result], "report.md")         # Analysis -> Markdown story
    with tracestory.region("decode"):                # one marker for nsys, ncu and torch.profiler
        ...

Capturing a workload is ``tracestory.capture.pipeline.capture`` (and ``tracestory capture`` on
the command line). Nothing heavy is imported here: torch, ncu_report and matplotlib load only
when a function needs them.
"""

from __future__ import annotations

from .analysis import Analysis, analyze
from .capture.region import region

__all__ = ["Analysis", "analyze", "load", "region", "report"]
__version__ = "0.1.0"


def load(*paths):
    """Read traces (Kineto, nsys SQLite/CSV, capture folders) -> list of Trace, one per rank."""
    from .ingest import load_inputs

    return load_inputs(paths).traces


def report(analyses, output, *, goal=None, questions=()):
    """Write the Markdown story report of ``analyses`` to ``output``; returns its path."""
    from pathlib import Path

    from .ingest import Inputs
    from .render.build import write_report

    analyses = list(analyses)
    inputs = Inputs(traces=[a.trace for a in analyses], paths=[a.trace.meta.source_path for a in analyses])
    return write_report(inputs, analyses, output=Path(output), goal=goal, questions=tuple(questions))
