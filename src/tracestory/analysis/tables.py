"""Named result tables: plain columns (name -> numpy array or list) out of the analysis results.

``table(name, analysis)`` builds one of :data:`TABLES` from an
:class:`~tracestory.analysis.Analysis` (and the operator results, computed when not given).
Columns are in base units, the unit in the column name (``total_ns``, ``share`` as a fraction
0..1); a missing value is ``None`` (the column is then a list), never 0. One row per group,
largest first where the rows are groups.

``kernels`` follows ``nsys stats --report cuda_gpu_kern_sum``: one row per kernel name (the
name the trace holds: for Nsight Systems the demangled name, which is what that report groups
by unless given ``base``), ``share`` of the summed kernel time of the table (nsys's
``Time (%)`` / 100; memcpy and memset are not kernels), ``count`` (Instances), ``total_ns``,
``mean_ns``, ``median_ns`` (the middle value, the mean of the two middle ones for an even
count), ``min_ns``, ``max_ns`` and ``stddev_ns``, the SAMPLE standard deviation (``ddof=1``):
nsys prints 233,376,198.5 ns for two calls of 2,971,823 and 333,015,608 ns, which is
``|a - b| / sqrt(2)``, and 0.0 for a single instance, as here. Rows are ordered as that report
orders them: total time descending, then instances, then name. nsys rounds Time, Avg, Med and
StdDev to one decimal when it prints; the columns here are unrounded.

Tables: ``kernels``, ``categories`` (breakdown with Amdahl ceilings), ``ops`` (GPU time per
top-level CPU op), ``leaf_ops`` (per leaf op), ``modules`` (per ``nn.Module`` path), ``phases``,
``gaps`` (every idle gap of the GPU timeline, with the CPU op under it), ``collectives`` (per
collective kind, dtype and message size, with its bandwidth), ``roofline`` (per roofline point)
and the ``nsys stats`` summaries of :mod:`.nsys_tables`. The op tables end with the rows of GPU
time no op can be given (:data:`~tracestory.analysis.operators.UNATTRIBUTED`, :data:`~tracestory.analysis.operators.OUTSIDE_OPS`)
so that their ``share`` sums to 1.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..errors import ToolNotFound, UsageError
from ..lazy import entry
from ..stats import summarize
from ..units import clip_text, plural, sig
from .gaps import gap_causes
from .nsys_tables import missing_reason, other_processes_note, summary_rows
from .table_names import NSYS_TABLES, TABLES
from .links import gpu_ops_column
from .timeline import idle_gap_attribution

if TYPE_CHECKING:
    from . import Analysis
    from .operators import Operators, OpStat   # computed when an op table is asked for (tracestory.lazy)
    from .roofline import Roofline



@dataclass(frozen=True, eq=False)
class Table:
    """A named table of equal-length columns (numpy arrays, or lists where values are missing).

    >>> t = table("kernels", analysis)      # doctest: +SKIP
    >>> t                                    # doctest: +SKIP
    Table('kernels', 42 rows: name, count, total_ns, share, mean_ns, median_ns, min_ns, max_ns, stddev_ns)
    >>> t.to_pandas().head()                 # doctest: +SKIP
    """

    name: str
    columns: Mapping[str, np.ndarray | list]
    # Why the input cannot give this table (it then has no rows): never an empty table that
    # reads as "no time" (``osrt_sum`` of an export captured without ``--trace=osrt``).
    missing: str | None = None
    note: str | None = None  # what the rows leave out, when something (one sentence)

    def __post_init__(self):
        lengths = {len(v) for v in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"table {self.name}: columns of unequal length "
                             f"{ {k: len(v) for k, v in self.columns.items()} }")

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, column: str) -> np.ndarray | list:
        return self.columns[column]

    def __repr__(self) -> str:
        if self.missing is not None:
            return f"Table({self.name!r}, {self.missing})"
        return f"Table({self.name!r}, {len(self)} rows: {', '.join(self.columns)})"

    def rows(self) -> list[tuple]:
        """The rows as tuples of Python values (None where missing)."""
        cols = [_py_list(v) for v in self.columns.values()]
        return list(zip(*cols)) if cols else []

    def to_pandas(self):
        """A ``pandas.DataFrame`` (pandas is optional: ``pip install pandas``)."""
        try:
            import pandas as pd
        except ImportError:
            raise ToolNotFound("pandas", "pip install pandas (the table is also available as .columns)") from None
        nullable = {"int": "Int64", "float": "Float64", "str": "string"}
        return pd.DataFrame({k: v if isinstance(v, np.ndarray) and v.dtype != object
                             else pd.array(_py_list(v), dtype=nullable[column_kind(k)])
                             for k, v in self.columns.items()})

    def to_arrow(self):
        """A ``pyarrow.Table`` (pyarrow is optional: ``pip install pyarrow``)."""
        try:
            import pyarrow as pa
        except ImportError:
            raise ToolNotFound("pyarrow", "pip install pyarrow (the table is also available as .columns)") from None
        types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
        return pa.table({k: pa.array(_py_list(v), type=types[column_kind(k)]) for k, v in self.columns.items()})

    def to_csv(self, file: str | os.PathLike | io.TextIOBase) -> None:
        """Write CSV with a header row: to a path, or to an open text file (``sys.stdout``).
        Missing values are empty fields; floats are written with full precision."""
        if isinstance(file, (str, os.PathLike)):
            with open(file, "w", newline="", encoding="utf-8") as f:
                self._write_csv(f)
        else:
            self._write_csv(file)

    def _write_csv(self, f) -> None:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(self.columns)
        for row in self.rows():
            w.writerow("" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row)

    def to_markdown(self, max_width: int = 60) -> str:
        """A Markdown table; floats with 4 significant digits, text cut to ``max_width``."""
        if self.missing is not None:
            return f"_{self.name}: {self.missing}_\n"
        head = list(self.columns)
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for row in self.rows():
            lines.append("| " + " | ".join(_cell(v, max_width) for v in row) + " |")
        if self.note:
            lines += ["", f"_{self.note}_"]
        return "\n".join(lines) + "\n"


def _py_list(values) -> list:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _cell(v, width: int) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        text = sig(v, 4) if abs(v) >= 1e-3 or v == 0 else f"{v:.3g}"
    else:
        text = str(v)
    return clip_text(text, width).replace("|", "\\|")


# Column kinds by name (the same name means the same thing in every table); others are int.
_TEXT_COLUMNS = frozenset({"trace", "name", "kind", "input_dims", "input_types", "top_kernels", "category", "path", "family",
                           "before", "after", "dtype", "operation", "cpu_op", "within", "bandwidth_basis",
                           "source", "precision", "roof_dtype", "bound"})
_FLOAT_COLUMNS = frozenset({"share", "mean_ns", "median_ns", "stddev_ns", "amdahl_max_speedup",
                            "speedup_if_k_times_faster", "k", "mean_bytes", "median_bytes", "stddev_bytes",
                            "algbw_bytes_per_s", "busbw_bytes_per_s", "flops", "dram_bytes", "arithmetic_intensity",
                            "achieved_flops_per_s", "achieved_bytes_per_s", "peak_flops_per_s", "ridge_flop_per_byte",
                            "fraction_of_roof"})


def column_kind(column: str) -> str:
    """"str", "float" or "int": the type of a column, whatever its rows (an empty table too)."""
    return "str" if column in _TEXT_COLUMNS else "float" if column in _FLOAT_COLUMNS else "int"


_NUMPY = {"str": object, "float": np.float64, "int": np.int64}


def _column(name: str, values: Sequence) -> np.ndarray | list:
    """A numpy array of the column's type when no value is missing, else the list (None stays)."""
    values = list(values)
    if any(v is None for v in values):
        return values
    return np.asarray(values, dtype=_NUMPY[column_kind(name)])


def _make(name: str, columns: Mapping[str, Sequence]) -> Table:
    return Table(name, {k: _column(k, v) for k, v in columns.items()})


# --------------------------------------------------------------------------- tables
def kernels_table(trace) -> Table:
    """Per kernel name: nsys ``cuda_gpu_kern_sum`` statistics (module docstring)."""
    k = trace.kernels
    dur = k.dur_ns.astype(np.int64)
    codes = k["name"].astype(np.int64)
    cols: dict[str, list] = {c: [] for c in ("name", "count", "total_ns", "share", "mean_ns", "median_ns",
                                              "min_ns", "max_ns", "stddev_ns")}
    if dur.size:
        order = np.lexsort((dur, codes))
        uniq, first = np.unique(codes[order], return_index=True)
        groups = np.split(dur[order], first[1:])
        total = int(dur.sum())
        rows = []
        for code, d in zip(uniq.tolist(), groups):
            s = summarize(d, ddof=1)
            rows.append((trace.name(code), s.count, int(d.sum()), s.mean, s.median, int(s.min), int(s.max),
                         s.std if s.std is not None else 0.0))
        rows.sort(key=lambda r: (-r[2], r[1], r[0]))
        for name, count, tot, mean, median, mn, mx, std in rows:
            for c, v in zip(cols, (name, count, tot, tot / total if total else 0.0, mean, median, mn, mx, std)):
                cols[c].append(v)
    return _make("kernels", cols)


def categories_table(analysis: "Analysis") -> Table:
    b = analysis.breakdown
    cats = b.categories
    return _make("categories", {
        "category": [c.name for c in cats],
        "count": [c.count for c in cats],
        "total_ns": [c.time_ns for c in cats],
        "share": [c.percent / 100.0 for c in cats],
        "mean_ns": [c.mean_ns for c in cats],
        "amdahl_max_speedup": [c.amdahl_max_speedup for c in cats],
        "speedup_if_k_times_faster": [c.whatif_speedup for c in cats],
        "k": [b.speedup_factor for _ in cats],
    })


def _op_rows(stats: Sequence[OpStat], ops: Operators) -> dict[str, list]:
    unattributed = entry("tracestory.analysis.operators", "UNATTRIBUTED")
    outside = entry("tracestory.analysis.operators", "OUTSIDE_OPS")
    rest = [(unattributed, ops.unattributed_count, ops.unattributed_ns),
            (outside, ops.outside_ops_count, ops.outside_ops_ns)]
    total = ops.total_gpu_ns
    cols: dict[str, list] = {c: [] for c in ("name", "kind", "input_dims", "input_types", "calls", "launches",
                                              "gpu_ops", "kernels", "total_ns", "share", "top_kernels")}
    for s in stats:
        for c, v in zip(cols, (s.name, s.kind, s.input_dims, s.input_types, s.calls, s.launches, s.gpu_op_count,
                               s.kernel_count, s.gpu_ns, s.share, "; ".join(n for n, _ in s.top_kernels))):
            cols[c].append(v)
    for name, count, ns in rest:
        if count == 0:
            continue
        for c, v in zip(cols, (name, "none", None, None, None, None, count, None, ns,
                               ns / total if total else 0.0, None)):
            cols[c].append(v)
    return cols


def modules_table(ops: Operators) -> Table:
    m = ops.modules
    return _make("modules", {
        "path": [x.path for x in m], "name": [x.name for x in m], "depth": [x.depth for x in m],
        "calls": [x.calls for x in m], "gpu_ops": [x.gpu_op_count for x in m], "total_ns": [x.gpu_ns for x in m],
        "self_ns": [x.self_gpu_ns for x in m], "share": [x.share for x in m],
    })


def phases_table(analysis: "Analysis") -> Table:
    p = analysis.phases.phases
    return _make("phases", {
        "index": [x.index for x in p], "name": [x.name for x in p], "family": [x.family for x in p],
        "step": [x.step for x in p], "start_ns": [x.start_ns for x in p], "end_ns": [x.end_ns for x in p],
        "wall_ns": [x.wall_ns for x in p], "gpu_start_ns": [x.gpu_start_ns for x in p],
        "gpu_end_ns": [x.gpu_end_ns for x in p], "gpu_span_ns": [x.gpu_span_ns for x in p],
        "gpu_busy_ns": [x.gpu_busy_ns for x in p], "kernels": [x.kernel_count for x in p],
        "memops": [x.memop_count for x in p],
    })


GAP_COLUMNS = ("start_ns", "dur_ns", "launch_wait_ns", "other_ns", "before", "after", "cpu_op", "cpu_op_dur_ns",
               "within")


def gaps_table(trace, phases=None) -> Table:
    """Every idle gap between busy periods of the GPU (the timeline's model), in time order,
    with the CPU op under it (:func:`tracestory.analysis.gaps.gap_causes`, the rule the report's
    gap findings use): ``cpu_op`` is what the launching host thread ran during the gap (the
    innermost CPU op or range covering at least half of the host's part of the gap; None when
    none does, or when the next op had been launched before the gap began), ``cpu_op_dur_ns``
    that op's whole duration, ``within`` the innermost op or range around the next op's launch
    call lasting at least half the gap (e.g. the step). ``phases``: the trace's phases when
    already computed."""
    cols: dict[str, list] = {c: [] for c in GAP_COLUMNS}
    if trace.meta.has_timeline and len(trace.kernels) + len(trace.memops):
        names = gpu_ops_column(trace, "name")
        g0, g1, before, after, wait = idle_gap_attribution(trace)
        dur = g1 - g0
        causes = {c.start_ns: c for c in gap_causes(trace, min_ns=1, limit=max(int(dur.size), 1), steps=phases)}
        cause = [causes.get(int(x)) for x in g0.tolist()]
        op_dur = [c.op_dur_ns if c is not None else None for c in cause]
        cols = {"start_ns": g0, "dur_ns": dur, "launch_wait_ns": wait, "other_ns": dur - wait,
                "before": trace.names(names[before]), "after": trace.names(names[after]),
                "cpu_op": _column("cpu_op", [c.op_name if c is not None else None for c in cause]),
                "cpu_op_dur_ns": _column("cpu_op_dur_ns", op_dur),
                "within": _column("within", [c.within if c is not None else None for c in cause])}
        return Table("gaps", {k: v if isinstance(v, list) else np.asarray(v) for k, v in cols.items()})
    return _make("gaps", cols)


COLLECTIVE_COLUMNS = ("kind", "dtype", "bytes", "group_size", "count", "total_ns", "mean_ns", "median_ns", "min_ns",
                      "max_ns", "stddev_ns", "algbw_bytes_per_s", "busbw_bytes_per_s", "bandwidth_basis")
COLLECTIVES_NOTE = ("algbw = bytes / median_ns (NCCL's size S: the whole array; all-gather its output), busbw = "
                    "algbw x NCCL's bus factor for the group size; one rank's kernel time includes waiting for later "
                    "peers, so both are lower bounds (tracestory ranks / report on every rank gives the transfer time)")


def _bandwidth(kind: str | None, nbytes: int | None, gsize: int | None, median_ns: float):
    """(algbw, busbw, basis) of one row of the collectives table (see :data:`COLLECTIVES_NOTE`)."""
    if nbytes is None:
        return None, None, "no sizes recorded (an nsys input names the collective in the kernel name only)"
    if median_ns <= 0:
        return None, None, "zero duration"
    algbw = nbytes / (median_ns * 1e-9)
    factor = entry("tracestory.analysis.collectives", "busbw_factor")(kind, gsize)
    if factor is None:
        why = "group size unknown" if gsize is None else f"no bus factor for {kind or 'an unknown kind'}"
        return algbw, None, f"algbw from the median; busbw n/a: {why}"
    return algbw, algbw * factor, f"from the median; bus factor {factor:.4g} (n={gsize})"


def collectives_table(trace) -> Table:
    """Per (collective kind, dtype, message bytes, group size): duration statistics and the
    algorithm and bus bandwidth where the sizes are known (:data:`COLLECTIVES_NOTE`;
    ``bandwidth_basis`` says per row how they were computed, or why not)."""
    rc = entry("tracestory.analysis.collectives", "rank_collectives")(trace)  # the collectives table only
    cols: dict[str, list] = {c: [] for c in COLLECTIVE_COLUMNS}
    n = len(rc.start_ns)
    if n:
        dur = (rc.end_ns - rc.start_ns).astype(np.int64)
        groups: dict[tuple, list[int]] = {}
        for i, key in enumerate(zip(rc.kind.tolist(), rc.dtype.tolist(), rc.bytes.tolist(), rc.group_size.tolist())):
            groups.setdefault(key, []).append(i)  # collectives are few: one per NCCL kernel
        rows = []
        for (kind, dtype, nbytes, gsize), idx in groups.items():
            s = summarize(dur[idx], ddof=1)
            nb, gs = (nbytes if nbytes >= 0 else None), (gsize if gsize > 0 else None)
            rows.append((kind or None, dtype or None, nb, gs, s.count, int(s.total), s.mean, s.median, int(s.min),
                         int(s.max), s.std if s.std is not None else 0.0, *_bandwidth(kind or None, nb, gs, s.median)))
        rows.sort(key=lambda r: (-r[5], str(r[0]), str(r[1]), r[2] or 0))
        for r in rows:
            for c, v in zip(cols, r):
                cols[c].append(v)
    t = _make("collectives", cols)
    return Table("collectives", t.columns, note=COLLECTIVES_NOTE if n else None)


ROOFLINE_COLUMNS = ("name", "source", "count", "duration_ns", "precision", "roof_dtype", "flops", "dram_bytes",
                    "arithmetic_intensity", "achieved_flops_per_s", "achieved_bytes_per_s", "peak_flops_per_s",
                    "ridge_flop_per_byte", "bound", "fraction_of_roof")
ROOFLINE_NEEDS_PEAKS = ("the roofline needs the GPU's peaks, resolved by tracestory.analyze: "
                        "Results.table('roofline')")


def roofline_table(roofline: "Roofline | None", source: str, missing: str | None = None) -> Table:
    """One row per roofline point (the JSON's ``roofline_estimate.points[]`` or, with Nsight
    Compute input, ``kernels[].roofline``), longest first: the kernel name, ``source``
    (``estimate``: FLOPs and bytes from the ops' shapes, grouped by kernel name; ``ncu``: one
    profiled kernel), the kernels it holds, their time, precision and the roof used, FLOPs, DRAM
    bytes, arithmetic intensity (FLOP/byte; inf with no DRAM bytes), achieved FLOP/s and
    bytes/s, the compute roof and ridge point, the bound and ``fraction_of_roof`` (the JSON's
    ``pct_of_roof`` / 100). Points an estimate dropped as above their roof are named in the
    ``note``. ``missing``: why there is no roofline (no peaks, no op shapes)."""
    cols: dict[str, list] = {c: [] for c in ROOFLINE_COLUMNS}
    if roofline is None or not roofline.points:
        why = missing or (roofline.note if roofline is not None and roofline.note else "no roofline points")
        return Table("roofline", _make("roofline", cols).columns, missing=why)
    for p in sorted(roofline.points, key=lambda p: (-(p.duration_ns or 0), p.label)):
        vals = (p.label, source, p.count, p.duration_ns, p.precision, p.roof_dtype, p.flops, p.dram_bytes,
                p.arithmetic_intensity, p.achieved_flops_per_s, p.achieved_bytes_per_s, p.peak_flops_per_s,
                p.ridge_flop_per_byte, p.bound, p.pct_of_roof / 100.0 if p.pct_of_roof is not None else None)
        for c, v in zip(cols, vals):
            cols[c].append(v)
    notes = [roofline.note] if roofline.note else []
    if roofline.dropped:
        notes.append(f"{plural(len(roofline.dropped), 'estimate')} above their roof dropped as estimate errors: "
                     + ", ".join(f"{label} ({pct:.0f}% of roof)" for label, pct in roofline.dropped[:5]))
    t = _make("roofline", cols)
    return Table("roofline", t.columns, note="; ".join(notes) or None)


def nsys_table(name: str, trace) -> Table:
    """One ``nsys stats`` summary table (:mod:`tracestory.analysis.nsys_tables`), or the reason
    this input cannot give it."""
    why = missing_reason(name, trace)
    cols, rows = summary_rows(name, trace) if why is None else (summary_rows(name, trace)[0], [])
    t = _make(name, {c: [r[i] for r in rows] for i, c in enumerate(cols)})
    return Table(name, t.columns, missing=why, note=other_processes_note(name, trace) if why is None else None)


def table(name: str, analysis: "Analysis", *, operators: Operators | None = None,
          roofline: "tuple[Roofline | None, str, str | None] | None" = None) -> Table:
    """The table ``name`` (one of :data:`TABLES`) of one analysed trace. ``operators``: the
    result of :func:`tracestory.analysis.operators.operators` (with module ranges when there
    are any); computed from ``analysis.trace`` when not given. ``roofline``: ``(roofline,
    source, why none)`` as :meth:`Results.table` resolves it (the roofline needs the GPU's peaks)."""
    trace = analysis.trace
    if name == "kernels":
        return kernels_table(trace)
    if name == "categories":
        return categories_table(analysis)
    if name in ("ops", "leaf_ops", "modules"):
        ops = operators if operators is not None else entry("tracestory.analysis.operators", "operators")(trace)
        if name == "modules":
            return modules_table(ops)
        return _make(name, _op_rows(ops.top_level if name == "ops" else ops.leaf, ops))
    if name == "phases":
        return phases_table(analysis)
    if name == "gaps":
        return gaps_table(trace, analysis.phases)
    if name == "collectives":
        return collectives_table(trace)
    if name in NSYS_TABLES:
        return nsys_table(name, trace)
    if name == "roofline":
        return roofline_table(*roofline) if roofline is not None else roofline_table(None, "", ROOFLINE_NEEDS_PEAKS)
    raise UsageError(f"unknown table {name!r}: expected one of {', '.join(TABLES)}")
