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

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path

from .common import add_taxonomy, add_window_options, refuse_overwrite, side_inputs, taxonomy_from, window_spec
from ..analysis.window import WindowSelection, rule_text as window_rule, window_traces
from .. import outputs
from ..analysis import analyze
from ..errors import UsageError
from ..ingest import load_inputs
from ..render.ascii import fmt_ns, fmt_pct
from ..render.story import short_name
from ..analysis.compare import GATE_METRICS, check_gates, compare
from ..render.compare import comparison_json, gate_line, render_comparison


def _label(path: str) -> str:
    name = Path(path.rstrip("/")).name
    for suffix in (".gz", ".json", ".trace", ".pt", ".sqlite", ".nsys-rep", ".csv", ".ncu-rep"):
        name = name.removesuffix(suffix)
    return name or path


def _load_one(path: str, taxonomy, spec=None):
    """(analysis, TraceWindow or None) of the one trace of ``path``, restricted by ``spec``."""
    inputs = load_inputs([path])
    if len(inputs.traces) != 1:
        raise UsageError(f"{path}: compare takes one trace per side, found {len(inputs.traces)} "
                         f"(pass one rank's trace file)")
    trace, tw = inputs.traces[0], None
    if spec is not None:
        (trace,), sel = window_traces([trace], spec)
        tw = sel.traces[0]
    return analyze(trace, taxonomy), tw


_CHUNK = 1 << 20


def digest(path: str) -> str:
    """SHA-256 of a file's bytes (what ``sha256sum`` prints); of a folder, of every file under it
    (relative path, then the file's SHA-256, in name order), so two copies of one capture folder
    have one digest."""
    p = Path(path)
    if not p.is_dir():
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()
    h = hashlib.sha256()
    for f in sorted(f for f in p.rglob("*") if f.is_file()):
        h.update(f.relative_to(p).as_posix().encode() + b"\0" + digest(str(f)).encode() + b"\n")
    return h.hexdigest()


def identical(a: str, b: str) -> str | None:
    """The shared SHA-256 of ``a`` and ``b`` when they are byte-identical, else None (sizes are
    compared first, so two different files are rarely hashed)."""
    pa, pb = Path(a), Path(b)
    if pa.is_file() and pb.is_file() and os.path.getsize(pa) != os.path.getsize(pb):
        return None
    if pa.is_dir() != pb.is_dir():
        return None
    da = digest(a)
    return da if da == digest(b) else None


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


def _renderables(c, findings):
    from rich.table import Table
    from rich.text import Text


    a, b = c.a, c.b
    sign = lambda ns: ("+" if ns > 0 else "-" if ns < 0 else "") + fmt_ns(abs(ns))
    na = lambda v: "n/a" if v is None else f"{v:,}"
    out = [Text(f"A = {a.label}: {a.source} ({'compiled' if a.compiled else 'eager'}: {a.compile_evidence})"),
           Text(f"B = {b.label}: {b.source} ({'compiled' if b.compiled else 'eager'}: {b.compile_evidence})")]
    if c.identical is not None:
        out.append(Text(f"The two inputs are identical (same SHA-256 {c.identical[:16]}...): every number is the "
                        "same on both sides"))
    if c.window is not None:
        out.append(Text(f"Compared: {c.window.request} ({c.window.rule}); " + "; ".join(
            f"{side} {tw.start_ms:.3f}..{tw.end_ms:.3f} ms, {tw.kernels_kept} of {tw.kernels_total} kernels"
            for side, tw in zip("AB", c.window.traces, strict=True))))
    t = Table(title="B vs A (speedup = A time / B time; > 1: B is faster)", title_justify="left")
    for col in ("metric", "A", "B", "speedup"):
        t.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for s in c.speedups:
        t.add_row(s.metric, fmt_ns(s.a_ns), fmt_ns(s.b_ns), "identical" if c.identical else
                  "n/a" if s.speedup is None else f"{s.speedup:.2f}x")
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
    spec = window_spec(args)
    per_metric = parse_gate_metrics(args.gate_metric)
    if args.gate is not None and not args.gate >= 0:
        raise UsageError(f"--gate {args.gate:g}: expected a limit >= 0 (percent)")
    tax = taxonomy_from(args)
    label_a = args.label_a or _label(args.a)
    label_b = args.label_b or _label(args.b)
    if label_a == label_b:
        label_a, label_b = f"A {label_a}", f"B {label_b}"
    (an_a, tw_a), (an_b, tw_b) = _load_one(args.a, tax, spec), _load_one(args.b, tax, spec)
    window = (WindowSelection(request=spec.request, rule=window_rule(spec), traces=(tw_a, tw_b))
              if spec is not None else None)
    c = compare(an_a, an_b, label_a=label_a, label_b=label_b, top=args.top,
                identical=identical(args.a, args.b), window=window)
    if args.gate is not None or per_metric:
        c = dataclasses.replace(c, gates=check_gates(c, args.gate, per_metric))
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
    regressions = [g for g in c.gates if g.regressed]
    for g in regressions:
        print(gate_line(g), file=sys.stderr)
    if c.gates and not regressions:
        print(f"gate: {len(c.gates)} metric(s) within their gates ({', '.join(g.name for g in c.gates)})",
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
