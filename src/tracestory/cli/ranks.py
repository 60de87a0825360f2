"""``tracestory ranks``: the multi-GPU analysis of many rank traces, in parallel.

Each rank is read and summarized in a worker (a local process pool by default, or a
dask.distributed cluster with ``--dask ADDRESS``; ``--dask local`` starts a LocalCluster); only
the small per-rank summaries come back to be combined. Prints the headline and writes the
multi-GPU section (timeline, per-GPU and per-collective tables, findings) as Markdown with
``-o`` and as JSON with ``--json``. ``tracestory report`` on the same inputs gives the whole
report, with every rank analysed in one process.
"""

from __future__ import annotations

import argparse
import glob
import json
from typing import Any

from .common import add_inputs, refuse_overwrite
from .. import outputs
from ..analysis.results import analyze_ranks
from ..render.multigpu import multigpu_json, render_multigpu_section


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("ranks", help="multi-GPU analysis of many rank traces (process pool or dask)")
    add_inputs(p, help="rank traces: files, folders, globs, a --torchrun capture")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU; 1: in-process)")
    p.add_argument("--dask", metavar="ADDRESS", help="dask.distributed scheduler address, or 'local' for a LocalCluster")
    p.add_argument("-o", "--output", help="write the multi-GPU section as Markdown")
    p.add_argument("--json", metavar="OUT", help="write the multi-GPU results as JSON")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    # a glob stands for the files it matches: each is an input an output may not overwrite
    matched = [m for i in args.inputs if any(c in i for c in "*?[") for m in glob.glob(i, recursive=True)]
    refuse_overwrite([*args.inputs, *matched], ("-o", args.output), ("--json", args.json))
    with outputs.prints_to_stderr(any(o and outputs.is_stdout(o) for o in (args.output, args.json))):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    ranks = analyze_ranks(args.inputs, workers=args.workers, dask_address=args.dask)
    result, findings = ranks.multigpu, ranks.findings
    h = result.headline
    print(f"{len(result.ranks)} ranks: " + (h if h else "no collective matched across ranks."))
    with outputs.all_or_nothing():
        if args.output:
            outputs.write_text(args.output, f"# Multi-GPU analysis: {len(result.ranks)} ranks\n\n"
                                         + render_multigpu_section(result, findings) + "\n")
        if args.json:
            outputs.write_text(args.json, json.dumps(multigpu_json(result, findings), indent=1) + "\n")
    for o in (args.output, args.json):
        if o and not outputs.is_stdout(o):
            print(f"wrote {o}")
    return 0
