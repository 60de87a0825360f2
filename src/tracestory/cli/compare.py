"""``tracestory compare A B``: two runs side by side (eager vs compiled, bf16 vs fp8, ...).

Each of A and B is one trace file or a capture folder holding one trace (one rank). Prints
the comparison as tables; ``-o`` writes it as Markdown, ``--json`` as JSON
(:mod:`tracestory.analysis.compare` has the model, :mod:`tracestory.render.compare` the
rendering).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import add_taxonomy, refuse_overwrite, side_inputs, taxonomy_from
from .. import outputs
from ..analysis import analyze
from ..errors import UsageError
from ..ingest import load_inputs
from ..render.ascii import fmt_ns, fmt_pct
from ..render.story import short_name
from ..analysis.compare import compare
from ..render.compare import comparison_json, render_comparison


def _label(path: str) -> str:
    name = Path(path.rstrip("/")).name
    for suffix in (".gz", ".json", ".trace", ".pt", ".sqlite", ".nsys-rep", ".csv", ".ncu-rep"):
        name = name.removesuffix(suffix)
    return name or path


def _load_one(path: str, taxonomy):
    inputs = load_inputs([path])
    if len(inputs.traces) != 1:
        raise UsageError(f"{path}: compare takes one trace per side, found {len(inputs.traces)} "
                         f"(pass one rank's trace file)")
    return analyze(inputs.traces[0], taxonomy)


def _renderables(c, findings):
    from rich.table import Table
    from rich.text import Text


    a, b = c.a, c.b
    sign = lambda ns: ("+" if ns > 0 else "-" if ns < 0 else "") + fmt_ns(abs(ns))
    na = lambda v: "n/a" if v is None else f"{v:,}"
    out = [Text(f"A = {a.label}: {a.source} ({'compiled' if a.compiled else 'eager'}: {a.compile_evidence})"),
           Text(f"B = {b.label}: {b.source} ({'compiled' if b.compiled else 'eager'}: {b.compile_evidence})")]
    t = Table(title="B vs A (speedup = A time / B time; > 1: B is faster)", title_justify="left")
    for col in ("metric", "A", "B", "speedup"):
        t.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for s in c.speedups:
        t.add_row(s.metric, fmt_ns(s.a_ns), fmt_ns(s.b_ns), "n/a" if s.speedup is None else f"{s.speedup:.2f}x")
    t.add_row("kernels", f"{a.kernel_count:,}", f"{b.kernel_count:,}", "")
    t.add_row("launches", na(a.launch_count), na(b.launch_count), "")
    t.add_row("GPU idle share", fmt_pct(a.idle_fraction), fmt_pct(b.idle_fraction), "")
    out.append(t)
    t = Table(title="GPU op time by category", title_justify="left")
    for col in ("category", "A", "A %", "B", "B %", "B - A"):
        t.add_column(col, justify="left" if col == "category" else "right", no_wrap=True)
    for d in c.categories:
        t.add_row(d.name, fmt_ns(d.a_time_ns), fmt_pct(d.a_share), fmt_ns(d.b_time_ns), fmt_pct(d.b_share),
                  sign(d.delta_ns))
    out.append(t)
    t = Table(title="Top kernels", title_justify="left")
    for col in ("kernel", "in", "A", "A runs", "B", "B runs"):
        t.add_column(col, justify="left" if col in ("kernel", "in") else "right", no_wrap=True)
    where = {"a": "only A", "b": "only B", None: "both"}
    for k in c.kernels:
        t.add_row(short_name(k.name, 50), where[k.only_in], fmt_ns(k.a_time_ns), f"{k.a_count:,}",
                  fmt_ns(k.b_time_ns), f"{k.b_count:,}")
    out.append(t)
    for f in findings:
        out.append(Text.assemble((f"[{f.severity.upper()}] ", "bold"), f.title, "\n  ", f.implication,
                                 "\n  ", f.recommendation))
    return out


def cmd_compare(args) -> int:
    from rich.console import Console


    refuse_overwrite((args.a, args.b, *side_inputs(args)), ("-o", args.output), ("--json", args.json))
    data_on_stdout = any(o and outputs.is_stdout(o) for o in (args.output, args.json))
    tax = taxonomy_from(args)
    label_a = args.label_a or _label(args.a)
    label_b = args.label_b or _label(args.b)
    if label_a == label_b:
        label_a, label_b = f"A {label_a}", f"B {label_b}"
    c = compare(_load_one(args.a, tax), _load_one(args.b, tax),
                label_a=label_a, label_b=label_b, top=args.top)
    # the tables go to stderr when stdout carries the Markdown or the JSON
    console = Console(stderr=data_on_stdout, width=None if sys.stdout.isatty() else 120)
    for r in _renderables(c, c.findings):
        console.print(r)
    with outputs.all_or_nothing():
        if args.output:
            outputs.write_text(args.output, render_comparison(c))
        if args.json:
            outputs.write_text(args.json, json.dumps(comparison_json(c), indent=1) + "\n")
    for o in (args.output, args.json):
        if o and not outputs.is_stdout(o):
            console.print(f"wrote {o}")
    return 0


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
    p.set_defaults(func=cmd_compare)
