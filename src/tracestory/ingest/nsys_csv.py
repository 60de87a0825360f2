"""``nsys stats --format csv`` outputs -> one :class:`Trace` per file.

Reports understood (current and legacy names), found by their header line, after any
preamble (``Generating SQLite file ...``, ``Processing [...] with [...]...``); several reports
in one file are read section by section:

* ``cuda_gpu_trace`` / ``gputrace`` (a timeline): one row per kernel, memcpy or memset.
  ``Start``/``Duration`` in the unit of their header (``(ns)``, ``(us)``, ``(ms)``, ``(s)``);
  memory rows (``[CUDA memcpy Host-to-Device]``, ``[CUDA memcpy HtoD]``, ``[CUDA memset]``) are
  renamed as Kineto names them (``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``)
  from ``SrcMemKd``/``DstMemKd``; ``Bytes (MB)`` is taken as 10^6 bytes (nsys's MB); grid,
  block and register columns are kept; ``GreenCtx`` and ``Throughput (MBps)``/``(MB/s)``
  variants are accepted and not needed.
* ``cuda_gpu_kern_sum`` / ``gpukernsum`` (a summary, ``meta.has_timeline = False``): per
  kernel name (and launch shape with 2022.4's ``GridXYZ,BlockXYZ``) its total time and
  instance count. The kernels table gets **one row per instance** so that counts and sums stay
  exact: the total is split evenly (``q, r = divmod(total, n)``: ``r`` rows of ``q + 1`` ns and
  ``n - r`` rows of ``q``). Start times are unknown: ``start_ns = -1`` and ``end_ns =
  duration - 1``, so ``end_ns - start_ns`` is the duration. Per-instance durations are
  therefore synthetic; the CSV's own avg/median/min/max/stddev are kept in
  ``meta.extra["kernel_summary"]``.
* ``nvtx_sum`` / ``nvtxsum`` (summary): ranges the same way (``Range`` or ``Name`` column,
  CPU side, depth 0); the statistics in ``meta.extra["nvtx_summary"]``.
* ``nvtx_pushpop_trace``: ranges with real times, depth from ``Lvl``.

Rows are parsed by the csv module and turned into columns once (``zip(*rows)``); numbers are
converted by numpy, names dictionary-encoded.

Checks (damage refused or stated in ``meta.extra["warnings"]``, see :mod:`.files`)
----------------------------------------------------------------------------------
* nsys ends every row with a newline: a file that does not was cut short; its last row is
  dropped and stated. A row inside a section whose cell count differs from the header's (a
  cut line, a flipped quote or comma) ends the section, counted and stated.
* Summaries carry their own totals: ``Time (%)`` sums to 100 (each cell rounded to one
  decimal, so within 0.05 per row) and ``Avg`` x ``Instances`` is ``Total Time`` (within the
  rounding of the printed cells). A summary that disagrees lost rows or values: stated.
* Impossible values: a negative or missing start, duration or total, an instance count below
  1, times of 2**62 ns (146 years) or more (overflow): the row is dropped and counted. A file
  left with no usable row at all is refused.
* Limits: a file cut exactly at the end of a row of a timeline (``cuda_gpu_trace``) reads as
  a shorter valid file; a summary cut there is caught by its ``Time (%)`` sum.
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError, TracestoryError, UsageError
from ..trace import (
    CPU_SIDE,
    MEMSET,
    StringPool,
    Table,
    Trace,
    TraceMeta,
    build_trace,
    empty_table,
    make_table,
)
from ..units import plural
from .files import check_size, inflate, refuse_special, state, with_warnings

_UNIT = {"ns": 1, "us": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_MB = 1_000_000
_COPY_ABBREV = {"host-to-device": "HtoD", "device-to-host": "DtoH", "device-to-device": "DtoD",
                "host-to-host": "HtoH", "peer-to-peer": "PtoP", "htod": "HtoD", "dtoh": "DtoH",
                "dtod": "DtoD", "htoh": "HtoH", "ptop": "PtoP", "array-to-device": "AtoD",
                "device-to-array": "DtoA", "host-to-array": "HtoA", "array-to-host": "AtoH"}
_KIND_OF = {"HtoD": 1, "HtoA": 1, "DtoH": 2, "AtoH": 2, "DtoD": 3, "AtoD": 3, "DtoA": 3, "AtoA": 3,
            "HtoH": 4, "PtoP": 5}
_OVERFLOW_NS = 2.0 ** 62  # 146 years: a time at or beyond it is an overflow, not a measurement
_MEM_ROW = re.compile(r"^\[CUDA (memcpy|memset)\s*([^\]]*)\]", re.IGNORECASE)


def _kind_of(header: list[str]) -> str | None:
    h = set(header)
    names = {"Name", "Range"} & h
    if not names:
        return None
    if any(c.startswith("Start") for c in h) and any(c.startswith("Duration") for c in h) and "CorrId" in h:
        return "gpu_trace"
    if any(c.startswith("Start") for c in h) and "Lvl" in h:
        return "nvtx_trace"
    if "Instances" in h and any(c.startswith("Total Time") for c in h):
        return "nvtx_sum" if "Range" in h or "Style" in h else "kern_sum"
    return None


# nsys stats' default (column) format: a header whose names are separated by runs of spaces, under
# a " ** Title (report):" banner and over a line of dashes. Not a CSV; the user re-runs with --format csv.
_COLUMN_FORMAT = re.compile(r"^\s*(Time \(%\)|Start \(ns\))\s{2,}(Total Time|Duration|Instances)"
                            r"|^\s*-{4,}(\s{2}-{4,}){2,}\s*$")


def _sections(text: str, path: Path, warnings: list[str]) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    current = None
    bad_rows = 0
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise TraceFormatError(path, "an nsys stats CSV", f"malformed CSV ({e})") from None
    if rows and not text.endswith(("\n", "\r")):
        rows.pop()
        warnings.append("the file ends mid-row (cut short): its last row dropped")
    for row in rows:
        if not row or all(not c.strip() for c in row):
            current = None
            continue
        kind = _kind_of([c.strip() for c in row])
        if kind is not None:
            current = (kind, [c.strip() for c in row], [])
            out.append(current)
        elif current is not None and len(row) == len(current[1]):
            current[2].append(row)
        else:
            if current is not None:
                bad_rows += 1
            current = None  # preamble or trailer text
    if bad_rows:
        warnings.append(f"{plural(bad_rows, 'row')} whose cell count does not match their header ended a report early")
    if not out:
        table = next((ln for ln in text.splitlines() if _COLUMN_FORMAT.search(ln)), None)
        if table is not None:
            raise TraceFormatError(path, "an nsys stats CSV (re-run with `nsys stats --format csv`)",
                                   "nsys stats' default column format (aligned columns, "
                                   f"{' '.join(table.split())[:60]!r})")
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        raise TraceFormatError(path, "an nsys stats CSV (cuda_gpu_trace, cuda_gpu_kern_sum, nvtx_sum, "
                                     "or legacy gputrace/gpukernsum)",
                               f"no known header; first line {first[:80]!r}" if first else "an empty file")
    return out


class _Cols:
    """Columns of one section by header name (prefix match for names with a unit)."""

    def __init__(self, header: list[str], rows: list[list[str]]):
        self.header = header
        self.cols = [np.asarray(c, dtype=object) for c in zip(*rows)] if rows else [np.empty(0, object)] * len(header)
        self.n = len(rows)

    def take(self, keep: np.ndarray) -> "_Cols":
        out = _Cols(self.header, [])
        out.cols = [col[keep] for col in self.cols]
        out.n = int(keep.sum())
        return out

    def find(self, *prefixes: str) -> int | None:
        for p in prefixes:
            for i, h in enumerate(self.header):
                if h == p or h.startswith(p + " ("):
                    return i
        return None

    def text(self, *prefixes: str) -> np.ndarray | None:
        i = self.find(*prefixes)
        return None if i is None else self.cols[i]

    def num(self, *prefixes: str, scale_unit: bool = False, scale: float = 1.0) -> np.ndarray:
        """float64 column; empty cells NaN; ``scale_unit`` multiplies by the header's time unit."""
        i = self.find(*prefixes)
        if i is None:
            return np.full(self.n, np.nan)
        raw = np.char.strip(np.char.replace(self.cols[i].astype(str), ",", ""))
        empty = (raw == "") | (raw == "-")
        raw = np.where(empty, "nan", raw)
        try:
            values = raw.astype(np.float64)
        except ValueError as e:
            raise ValueError(f"column {self.header[i]!r}: {e}") from None
        if scale_unit:
            m = re.search(r"\((\w+)\)$", self.header[i])
            scale *= _UNIT.get(m.group(1), 1) if m else 1
        return values * scale

    def ints(self, *prefixes: str, **kw) -> np.ndarray:
        v = self.num(*prefixes, **kw)
        return np.where(np.isnan(v), -1, np.rint(np.nan_to_num(v, nan=-1))).astype(np.int64)


def _device(values: np.ndarray | None, n: int) -> np.ndarray:
    """``Device`` cells: ``0`` or ``NVIDIA H100 (0)``."""
    if values is None:
        return np.full(n, -1, np.int64)
    uniq, inv = np.unique(values.astype(str), return_inverse=True)
    ids = [int(m.group(1)) if (m := re.search(r"(\d+)\)?\s*$", u)) else -1 for u in uniq]
    return np.asarray(ids, np.int64)[inv.reshape(-1)] if len(uniq) else np.empty(0, np.int64)


def _memop_name(name: str, src: str, dst: str) -> tuple[str, int] | None:
    m = _MEM_ROW.match(name)
    if not m:
        return None
    if m.group(1).lower() == "memset":
        return f"Memset ({dst or src or 'Device'})", MEMSET
    kind = _COPY_ABBREV.get(m.group(2).strip().lower(), m.group(2).strip() or "Unknown")
    src, dst = src or "Unknown", dst or "Unknown"
    return f"Memcpy {kind} ({src} -> {dst})", _KIND_OF.get(kind, 6)


def _impossible(*cols: np.ndarray) -> np.ndarray:
    """Rows where any of ``cols`` (float ns) is missing, negative or an overflow."""
    bad = np.zeros(len(cols[0]), bool)
    for v in cols:
        bad |= np.isnan(v) | (v < 0) | (v >= _OVERFLOW_NS)
    return bad


def _drop(c: "_Cols", bad: np.ndarray, what: str, warnings: list[str]) -> "_Cols":
    if not bad.any():
        return c
    warnings.append(f"{int(bad.sum())} of {c.n} {what} rows dropped: a missing, negative or overflowing time")
    return c.take(~bad)


def _gpu_trace(c: _Cols, pool: StringPool, warnings: list[str]) -> dict:
    s_f, d_f = c.num("Start", scale_unit=True), c.num("Duration", scale_unit=True)
    c = _drop(c, _impossible(s_f, d_f, s_f + d_f), "cuda_gpu_trace", warnings)
    if c.n == 0:
        return {"kernels": empty_table("kernels"), "memops": empty_table("memops")}
    names = c.text("Name")
    src = c.text("SrcMemKd")
    dst = c.text("DstMemKd")
    start = c.ints("Start", scale_unit=True)
    end = start + c.ints("Duration", scale_unit=True)
    # Classify and rename once per distinct (name, src, dst).
    keys = list(zip(names, src if src is not None else [""] * c.n, dst if dst is not None else [""] * c.n))
    distinct = {k: _memop_name(*k) for k in dict.fromkeys(keys)}
    is_mem = np.fromiter((distinct[k] is not None for k in keys), bool, c.n)
    label = [distinct[k][0] if distinct[k] else k[0] for k in keys]
    kind = np.fromiter((distinct[k][1] if distinct[k] else -1 for k in keys), np.int32, c.n)
    common = dict(start_ns=start, end_ns=end, name=pool.encode(label), device=_device(c.text("Device"), c.n),
                  stream=c.ints("Strm"), correlation=c.ints("CorrId"))
    k = ~is_mem
    smem = np.nansum(np.stack([c.num("StcSMem", scale=_MB), c.num("DymSMem", scale=_MB)]), axis=0)
    kernels = make_table("kernels", **{n: v[k] for n, v in common.items()},
                         grid_x=c.ints("GrdX")[k], grid_y=c.ints("GrdY")[k], grid_z=c.ints("GrdZ")[k],
                         block_x=c.ints("BlkX")[k], block_y=c.ints("BlkY")[k], block_z=c.ints("BlkZ")[k],
                         registers_per_thread=c.ints("Reg/Trd")[k],
                         shared_mem_bytes=np.where(np.isnan(c.num("StcSMem")) & np.isnan(c.num("DymSMem")), -1,
                                                   np.rint(smem)).astype(np.int64)[k])
    memops = make_table("memops", **{n: v[is_mem] for n, v in common.items()}, kind=kind[is_mem],
                        bytes=c.ints("Bytes", scale=_MB)[is_mem])
    return {"kernels": kernels, "memops": memops}


def _split_evenly(total_ns: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row index and duration of each instance: ``count[i]`` rows summing exactly to ``total_ns[i]``."""
    count = np.maximum(count, 1)
    q, r = np.divmod(total_ns, count)
    row = np.repeat(np.arange(len(count)), count)
    rank = np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
    return row, q[row] + (rank < r[row])


def _decimals(cells: np.ndarray) -> np.ndarray:
    """Digits after the decimal point of each printed cell."""
    text = np.char.strip(cells.astype(str))
    dot = np.char.find(text, ".")
    return np.where(dot >= 0, np.char.str_len(text) - dot - 1, 0)


def _check_summary(c: "_Cols", kind: str, warnings: list[str]) -> "_Cols":
    """Drop impossible rows; state a summary that disagrees with its own totals."""
    total, count = c.num("Total Time", scale_unit=True), c.num("Instances")
    bad = _impossible(total) | np.isnan(count) | (count < 1) | (count >= _OVERFLOW_NS)
    if bad.any():
        warnings.append(f"{int(bad.sum())} of {c.n} {kind} rows dropped: a missing or negative total or "
                        "instance count, or an overflow")
        c = c.take(~bad)
    pct = c.num("Time")
    if c.n and not np.isnan(pct).all():
        got = float(np.nansum(pct))
        if abs(got - 100.0) > 0.05 * c.n + 0.1:
            warnings.append(f"{kind}: Time (%) of the {c.n} rows read sums to {got:.1f}%, not 100%: rows missing "
                            "or damaged (cut short?)")
    i_avg, i_tot = c.find("Avg"), c.find("Total Time")
    if c.n and i_avg is not None and i_tot is not None and c.header[i_avg][3:] == c.header[i_tot][10:]:
        avg, tot, n = c.num("Avg"), c.num("Total Time"), c.num("Instances")
        tol = n * 0.5 * 10.0 ** -_decimals(c.cols[i_avg]) + 0.5 * 10.0 ** -_decimals(c.cols[i_tot]) + 1e-9 * np.abs(tot)
        off = ~np.isnan(avg) & (np.abs(avg * n - tot) > tol)
        if off.any():
            warnings.append(f"{kind}: {int(off.sum())} of {c.n} rows whose Avg x Instances is not their Total Time "
                            "(damaged values)")
    return c


def _summary(c: _Cols, pool: StringPool, label_col: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    if c.n == 0:
        return np.empty(0, np.int32), np.empty(0, np.int64), []
    names = c.text(*label_col)
    total = c.ints("Total Time", scale_unit=True)
    count = c.ints("Instances")
    row, dur = _split_evenly(np.maximum(total, 0), count)
    codes = pool.encode(list(names))[row]
    stats = []
    for i in range(c.n):  # one dict per distinct name: a summary is small
        entry = {"name": str(names[i]), "total_ns": int(total[i]), "instances": int(count[i])}
        for key, col in (("avg_ns", "Avg"), ("median_ns", "Med"), ("min_ns", "Min"), ("max_ns", "Max"),
                         ("stddev_ns", "StdDev")):
            v = c.num(col, scale_unit=True)[i]
            entry[key] = None if np.isnan(v) else float(v)
        for col in ("GridXYZ", "BlockXYZ"):
            if (t := c.text(col)) is not None:
                entry[col] = str(t[i]).strip()
        stats.append(entry)
    return codes, dur, stats


def load_nsys_csv(path: str | os.PathLike) -> list[Trace]:
    """Read an ``nsys stats --format csv`` output (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    check_size(path, refuse_special(path))
    try:
        with open(path, "rb") as f:
            data = f.read()
        text = inflate(path, data, "an nsys stats CSV").decode("utf-8", "replace")
        trace, warnings = _load(path, text)
    except TracestoryError:
        raise
    except (csv.Error, ValueError, TypeError, IndexError, KeyError, OverflowError, MemoryError, OSError) as e:
        raise TraceFormatError(path, "a readable nsys stats CSV",
                               f"damaged content ({type(e).__name__}: {str(e)[:160]})") from None
    state(path, warnings)
    return [trace]


def _load(path: Path, text: str) -> tuple[Trace, list[str]]:
    warnings: list[str] = []
    pool = StringPool()
    tables: dict[str, list] = {"kernels": [], "memops": [], "ranges": []}
    extra: dict = {"reports": []}
    timeline = False
    for kind, header, rows in _sections(text, path, warnings):
        c = _Cols(header, rows)
        extra["reports"].append(kind)
        try:
            if kind == "gpu_trace":
                got = _gpu_trace(c, pool, warnings)
                tables["kernels"].append(got["kernels"])
                tables["memops"].append(got["memops"])
                timeline = True
            elif kind == "kern_sum":
                c = _check_summary(c, "cuda_gpu_kern_sum", warnings)
                codes, dur, stats = _summary(c, pool, ("Name",))
                tables["kernels"].append(make_table("kernels", start_ns=np.full(len(dur), -1), end_ns=dur - 1, name=codes))
                extra["kernel_summary"] = stats
            elif kind == "nvtx_sum":
                c = _check_summary(c, "nvtx_sum", warnings)
                codes, dur, stats = _summary(c, pool, ("Range", "Name"))
                tables["ranges"].append(make_table("ranges", start_ns=np.full(len(dur), -1), end_ns=dur - 1, name=codes,
                                                   side=np.full(len(dur), CPU_SIDE), depth=np.zeros(len(dur))))
                extra["nvtx_summary"] = stats
            else:  # nvtx_trace
                s_f, e_f = c.num("Start", scale_unit=True), c.num("End", scale_unit=True)
                c = _drop(c, _impossible(s_f, e_f, e_f - s_f), "nvtx_pushpop_trace", warnings)
                tables["ranges"].append(make_table(
                    "ranges", start_ns=c.ints("Start", scale_unit=True), end_ns=c.ints("End", scale_unit=True),
                    name=pool.encode(list(c.text("Name"))), side=np.full(c.n, CPU_SIDE), pid=c.ints("PID"),
                    tid=c.ints("TID"), depth=c.ints("Lvl")))
        except ValueError as e:
            raise TraceFormatError(path, f"numbers in the {kind} columns", str(e)) from None
    if "gpu_trace" in extra["reports"] and "kern_sum" in extra["reports"]:
        # Both describe the same kernels: keep the timeline, not a double count.
        tables["kernels"] = [t for t in tables["kernels"] if len(t) == 0 or t["start_ns"][0] >= 0]
    if not any(len(t) for ts in tables.values() for t in ts):
        raise TraceFormatError(path, "an nsys stats CSV with at least one usable row",
                               "none" + (f" ({warnings[0]})" if warnings else ""))
    meta = TraceMeta(source_path=str(path), source_format="nsys-csv", has_timeline=timeline, extra=extra)
    meta = with_warnings(meta, warnings)
    parts = {k: Table.concat(v) for k, v in tables.items() if v}
    return build_trace(meta, pool, **parts), warnings
