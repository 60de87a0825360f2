"""``tracestory compare A B``: two runs side by side (eager vs compiled, bf16 vs fp8, ...).

Each of A and B is one trace file or a capture folder holding one trace (one rank). Prints
the comparison as tables; ``-o`` writes it as Markdown, ``--json`` as JSON
(:mod:`tracestory.analysis.compare` has the model, :mod:`tracestory.render.compare` the
rendering).

``--window``/``--steps``/``--steady-state`` restrict both sides alike before they are analysed
(:mod:`tracestory.analysis.window`). ``--gate PCT`` and ``--gate-metric NAME=PCT`` make it a CI
check: exit code 1 when B regresses against A beyond a gate, one ``regression:`` line per
metric on standard error (0 when every gated metric is within its gate; 2 for bad input).
Byte-identical inputs (same SHA-256) are named as such.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import add_taxonomy, add_window_options, refuse_overwrite, side_inputs, taxonomy_from, window_spec
from .. import outputs
from ..errors import UsageError
from ..units import plural
from ..analysis.compare import GATE_METRICS, compare_paths
from ..render.compare import comparison_json, gate_line, render_comparison
from ..render.terminal import comparison_renderables


def _label(path: str) -> str:
    name = Path(path.rstrip("/")).name
    for suffix in (".gz", ".json", ".trace", ".pt", ".sqlite", ".nsys-rep", ".csv", ".ncu-rep"):
        name = name.removesuffix(suffix)
    return name or path


def parse_gate_metrics(items) -> dict[str, float]:
    """``NAME=PCT`` items -> {name: pct}; one line for a malformed one."""
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            if not sep:
                raise ValueError
            out[name] = float(value)
        except ValueError:
            raise UsageError(f"--gate-metric: expected NAME=PCT (NAME one of {', '.join(GATE_METRICS)}), "
                             f"found {item!r}") from None
        if name not in GATE_METRICS:
            raise UsageError(f"--gate-metric {name}: expected one of {', '.join(GATE_METRICS)}")
    return out


def cmd_compare(args) -> int:
    from rich.console import Console


    refuse_overwrite((args.a, args.b, *side_inputs(args)), ("-o", args.output), ("--json", args.json))
    data_on_stdout = any(o and outputs.is_stdout(o) for o in (args.output, args.json))
    spec = window_spec(args)
    per_metric = parse_gate_metrics(args.gate_metric)
    if args.gate is not None and not args.gate >= 0:
        raise UsageError(f"--gate {args.gate:g}: expected a limit >= 0 (percent)")
    tax = taxonomy_from(args)
    label_a = args.label_a or _label(args.a)
    label_b = args.label_b or _label(args.b)
    if label_a == label_b:
        label_a, label_b = f"A {label_a}", f"B {label_b}"
    c = compare_paths(args.a, args.b, tax, label_a=label_a, label_b=label_b, top=args.top, window=spec,
                      gate=args.gate, gate_metrics=per_metric)
    # the tables go to stderr when stdout carries the Markdown or the JSON
    console = Console(stderr=data_on_stdout, width=None if sys.stdout.isatty() else 120)
    for r in comparison_renderables(c):
        console.print(r)
    with outputs.all_or_nothing():
        if args.output:
            outputs.write_text(args.output, render_comparison(c))
        if args.json:
            outputs.write_text(args.json, json.dumps(comparison_json(c), indent=1) + "\n")
    for o in (args.output, args.json):
        if o and not outputs.is_stdout(o):
            console.print(f"wrote {o}")
    regressions = [g for g in c.gates if g.regressed]
    for g in regressions:
        print(gate_line(g), file=sys.stderr)
    if c.gates and not regressions:
        print(f"gate: {plural(len(c.gates), 'metric')} within their gates ({', '.join(g.name for g in c.gates)})",
              file=sys.stderr)
    return 1 if regressions else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="two runs side by side: time, categories, kernels, speedup",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("a", metavar="A", help="baseline: a trace file or a capture folder (one trace)")
    p.add_argument("b", metavar="B", help="the run compared against A")
    p.add_argument("--label-a", help="name of A in tables (default: its file name)")
    p.add_argument("--label-b", help="name of B in tables (default: its file name)")
    p.add_argument("-o", "--output", metavar="MD", help="write the comparison as Markdown")
    p.add_argument("--json", metavar="OUT", help="write the comparison as JSON")
    add_taxonomy(p)
    p.add_argument("--top", type=int, default=15, help="kernels in the top-kernels table (default: 15)")
    add_window_options(p)
    p.add_argument("--gate", type=float, metavar="PCT",
                   help="exit 1 when B is slower than A by more than PCT%% on a time metric both have (iteration "
                        "median and mean, wall, GPU busy, GPU op time); one line per regression on stderr")
    p.add_argument("--gate-metric", action="append", metavar="NAME=PCT",
                   help=f"gate one metric (repeatable; replaces --gate for it): {', '.join(GATE_METRICS)} "
                        "(idle: percentage points of the GPU idle share)")
    p.set_defaults(func=cmd_compare)
