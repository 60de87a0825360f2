"""tracestory: GPU traces in, the story of the execution out.

The verbs, each callable any number of times in one process::

    trace = tracestory.load("trace.json.gz")          # one file -> Trace (load_all for many ranks)
    results = tracestory.analyze(trace)               # a Trace or a path -> Results (computed once)
    tracestory.report(["trace.json.gz"], "r.md")      # paths or Results -> Markdown story
    with tracestory.region("decode"):                 # one marker for nsys, ncu and torch.profiler
        ...

Tables for a notebook: ``results.kernels_frame()`` (pandas, one row per kernel, real names, with
its ``category``, ``phase``, ``op`` and ``top_op``; ``trace.kernels_frame()`` without them),
``results.table(name)`` (``kernels``, ``categories``, ``ops``, ``leaf_ops``, ``modules``,
``phases``, ``gaps``, ``collectives``, ``roofline``, and from nsys inputs ``cuda_api_sum``,
``cuda_gpu_mem_time_sum``, ``cuda_gpu_mem_size_sum``, ``osrt_sum``; ``.to_pandas()``,
``.to_arrow()``, ``.to_csv(f)``) and ``results.findings`` (typed FindingRecord records)::

    results.table("ops").to_pandas().head(10)         # GPU time per top-level op and input shapes

``load_inputs(paths)`` reads everything a report can take (traces, Nsight Compute metrics,
capture folders, a scheduler event log and a load summary). Capturing a workload is
``tracestory.capture.pipeline.capture`` (and ``tracestory capture`` on the command line).
Nothing is imported here until used: the API's names load on first access (``import tracestory``
costs the version and the error types); torch, ncu_report and matplotlib load only when a
function needs them.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UsageError
from .version import __version__  # noqa: F401  (one place for the version)

if TYPE_CHECKING:
    from .analysis.results import AnalysisOptions, Results
    from .capture.region import region
    from .ingest import Inputs, load_inputs
    from .trace import Trace

__all__ = ["AnalysisOptions", "FindingRecord", "Inputs", "Results", "Trace", "analyze", "load", "load_all",
           "load_inputs", "region", "report"]

# The API's names are imported when first used, not with the package: ``tracestory --version``
# and every command start without the analysis stack (see tracestory.cli).
_LAZY = {"AnalysisOptions": "analysis.results", "Results": "analysis.results", "analyze_inputs": "analysis.results",
         "FindingRecord": "analysis.results",
         "region": "capture.region", "Inputs": "ingest", "load_inputs": "ingest", "Trace": "trace",
         "write_report": "render.build"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def _api(name: str):
    return globals()[name] if name in globals() else __getattr__(name)


def load_all(path) -> list[Trace]:
    """Every trace in ``path`` (a file, a folder of rank traces, a capture folder): one Trace per
    rank or process."""
    return list(_api("load_inputs")([path]).traces)


def load(path) -> Trace:
    """The one trace in ``path``. A path that holds several ranks or processes raises
    :class:`~tracestory.errors.UsageError` pointing to :func:`load_all`."""
    traces = load_all(path)
    if len(traces) != 1:
        raise UsageError(f"{path}: holds {len(traces)} traces (ranks or processes), not one; "
                         "use tracestory.load_all(path) for a list of them")
    return traces[0]


def _inputs_of(items) -> Inputs:
    """Paths and already-loaded traces -> one Inputs."""
    trace_cls = _api("Trace")
    if isinstance(items, (str, os.PathLike, trace_cls)):
        items = [items]
    items = list(items)
    paths = [p for p in items if not isinstance(p, trace_cls)]
    traces = [t for t in items if isinstance(t, trace_cls)]
    inputs = _api("load_inputs")(paths) if paths else _api("Inputs")()
    if traces:
        inputs = replace(inputs, traces=(*inputs.traces, *traces),
                         paths=(*inputs.paths, *(t.meta.source_path for t in traces)))
    return inputs


def analyze(trace_or_path, **options) -> Results:
    """All results of a trace, a path, or a list of them. ``options`` are those of
    :class:`~tracestory.analysis.results.AnalysisOptions` (``taxonomy``, ``k``, ``peaks_path``,
    ``goal``, ``questions``, ``command``)."""
    return _api("analyze_inputs")(_inputs_of(trace_or_path), _api("AnalysisOptions")(**options))


def report(paths_or_results, output, *, plots: bool = False, json_path=None, **options) -> Path:
    """Write the Markdown story report to ``output``; returns its path. ``paths_or_results``: a
    :class:`Results`, or what :func:`analyze` takes (then ``options`` go to it)."""

    results = paths_or_results if isinstance(paths_or_results, _api("Results")) else analyze(paths_or_results, **options)
    return _api("write_report")(results, Path(output), plots=plots, json_path=json_path)
