"""``tracestory export perfetto INPUT... -o out.json(.gz)``: the analyzed timeline for Perfetto.

Every trace in the inputs (several files, a folder of rank traces, capture folders) is analyzed
with the chosen taxonomy and written as one process per trace into one Chrome-trace JSON
(layout: :mod:`tracestory.export.perfetto`); open it in https://ui.perfetto.dev or
chrome://tracing.
"""

from __future__ import annotations

from pathlib import Path

from .. import outputs
from .common import add_inputs, add_taxonomy, options_from, read_inputs
from ..analysis.results import analyze_inputs
from ..errors import UsageError
from ..export.perfetto import export_perfetto


def _perfetto(args) -> int:
    """``-o -`` writes the (uncompressed) JSON to stdout and the summary line to stderr."""
    out = Path(args.output)
    inputs = read_inputs(args, ("-o", args.output))   # as typed: Path("out/") would drop the "/"
    if not inputs.traces:
        raise UsageError("no trace with a GPU timeline in the inputs (Nsight Compute data alone has none)")
    result = export_perfetto(analyze_inputs(inputs, options_from(args)), out)
    print(f"wrote {result.path}: {result.process_count} process(es), {result.track_count} tracks, "
          f"{result.slice_count} slices, {result.flow_count} launch flows, {result.counter_count} counter samples",
          file=outputs.status_stream(args.output))
    return 0


def register(subparsers) -> None:
    exp = subparsers.add_parser("export", help="export the analyzed timeline to other tools (perfetto)",
                                description="Export the analyzed timeline to other tools' formats.")
    sub = exp.add_subparsers(dest="export", required=True, metavar="FORMAT")
    p = sub.add_parser("perfetto", help="Chrome-trace JSON for ui.perfetto.dev / chrome://tracing",
                       description="Kernels by stream with their categories, phases, idle gaps with "
                                   "their cause, CPU threads and launch flows; one process per rank.")
    add_inputs(p, help="Kineto .json(.gz), nsys .sqlite/.nsys-rep, or a folder (one process per trace)")
    p.add_argument("-o", "--output", default="trace.perfetto.json.gz",
                   help="output path; gzip-compressed when it ends in .gz; - for standard output (default: "
                        "trace.perfetto.json.gz)")
    add_taxonomy(p)
    p.set_defaults(func=_perfetto)
