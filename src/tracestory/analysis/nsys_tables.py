"""The ``nsys stats`` summary tables people know, computed from the Trace model.

Each is one row per group with the statistics ``nsys stats`` prints, in base units:

=========================  =============================  ======================================
table                      rows: one per                  from
=========================  =============================  ======================================
``cuda_api_sum``           API call name                  ``trace.api`` (CUDA runtime and driver
                                                          calls; nsys: ``CUPTI_ACTIVITY_KIND_RUNTIME``)
``cuda_gpu_mem_time_sum``  memory operation               ``trace.memops``: durations
``cuda_gpu_mem_size_sum``  memory operation               ``trace.memops``: bytes
``osrt_sum``               OS runtime function            ``trace.osrt`` (nsys ``--trace=osrt``:
                                                          ``OSRT_API``)
=========================  =============================  ======================================

Columns as nsys prints them: ``Time (%)`` is ``share`` (0..1 of the table's summed time),
``Total Time`` ``total_ns``, ``Num Calls`` / ``Count`` ``count``, then ``mean_ns``,
``median_ns`` (the middle value, the mean of the two middle ones for an even count),
``min_ns``, ``max_ns`` and ``stddev_ns``, the sample standard deviation (ddof=1; 0.0 for one
call), and ``name`` (``Name``) or ``operation`` (``Operation``). Rows are ordered by total
descending (then count, then name), as those reports order them. ``cuda_gpu_mem_size_sum`` has
the same statistics over bytes (``total_bytes`` ... ``stddev_bytes``) ordered by total bytes;
nsys prints them in MB of 10^6 bytes.

Operations are nsys's labels: ``[CUDA memcpy Host-to-Device]`` (``Device-to-Host``,
``Device-to-Device``, ``Host-to-Host``, ``Peer-to-Peer``, ``Array-to-...``, ``Unified
Host-to-Device`` ...) by copy direction, and one ``[CUDA memset]``; they are read back from
the memop names every reader writes (``Memcpy HtoD (Pinned -> Device)``), so Kineto, rocprof
and nsys CSV timelines get the same tables.

Limits, where these differ from ``nsys stats`` on the same export:

* Per process (one Trace per process with GPU activity). ``nsys stats`` sums every process of
  the report; the calls of processes with no GPU activity (a launcher) are in no trace here,
  and their count is in ``meta.extra["calls_in_other_processes"]``, which the table's ``note``
  states.
* API names are grouped after the ``_vNNNN`` suffix is stripped (``cuLaunchKernel_v7000`` and
  ``cuLaunchKernel`` are one row; nsys strips it when it prints, after grouping by name id).
  Event classes other than runtime (0) and driver (1), e.g. the CUDA backtrace duplicates
  (67) of old exports, are not calls and are not counted.
* OS runtime rows are the calls (eventClass 27); the zero-length "profiling started/finished"
  marks (31, 32) are not counted.

A table the input cannot give is not an empty table (which would read as "no time"): it has
no rows and ``missing`` says why and what captures it (``--trace=osrt``).
"""

from __future__ import annotations

import numpy as np

from ..stats import summarize
from ..trace import MEMSET, Trace

RUNTIME, MEMCPY, MEMSET_TABLE, OSRT, KERNEL = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                                              "CUPTI_ACTIVITY_KIND_MEMSET", "OSRT_API", "CUPTI_ACTIVITY_KIND_KERNEL")

# memop name abbreviations (every reader's "Memcpy <abbrev> (<src> -> <dst>)") -> nsys's label
# (ENUM_CUDA_MEMCPY_OPER.label)
COPY_LABELS = {
    "HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "HtoA": "Host-to-Array", "AtoH": "Array-to-Host",
    "AtoA": "Array-to-Array", "AtoD": "Array-to-Device", "DtoA": "Device-to-Array", "DtoD": "Device-to-Device",
    "HtoH": "Host-to-Host", "PtoP": "Peer-to-Peer", "UVM HtoD": "Unified Host-to-Device",
    "UVM DtoH": "Unified Device-to-Host", "UVM DtoD": "Unified Device-to-Device", "Unknown": "Unknown",
}
STAT_COLUMNS = ("count", "total_ns", "share", "mean_ns", "median_ns", "min_ns", "max_ns", "stddev_ns")
SIZE_COLUMNS = ("count", "total_bytes", "mean_bytes", "median_bytes", "min_bytes", "max_bytes", "stddev_bytes")


def operation(name: str, is_memset: bool) -> str:
    """nsys's operation label of one memop name: ``[CUDA memcpy Host-to-Device]``, ``[CUDA memset]``."""
    if is_memset:
        return "[CUDA memset]"
    rest = name.removeprefix("Memcpy ").strip()
    # "HtoD (Pinned -> Device)" -> HtoD; a name with no direction, "(CopyHostToDevice)" -> its text
    abbrev = rest.split(" (", 1)[0] if not rest.startswith("(") else rest.strip("()")
    return f"[CUDA memcpy {COPY_LABELS.get(abbrev, abbrev or 'Unknown')}]"


def grouped_stats(codes: np.ndarray, values: np.ndarray, label, share: bool = True) -> list[tuple]:
    """Per distinct integer code: ``(label(code), count, total, [share,] mean, median, min, max,
    stddev)`` with the sample standard deviation (0.0 for one value), ordered by total
    descending, then count, then label. Rows with the same label are one group. Grouping is
    on the codes (one sort), names are looked up once per code."""
    codes = np.asarray(codes, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return []
    # codes are small non-negative ids (-1: none): a lookup array instead of a sorting np.unique
    shifted = codes + 1
    present = np.flatnonzero(np.bincount(shifted))
    index = np.zeros(int(present[-1]) + 1, dtype=np.int64)
    index[present] = np.arange(present.size)
    uniq, inv = present - 1, index[shifted]
    labels = [label(int(c)) for c in uniq.tolist()]
    # codes whose labels are equal (a name with and without a version suffix) are one group
    by_label: dict[str, int] = {}
    group = np.asarray([by_label.setdefault(x, len(by_label)) for x in labels], dtype=np.int64)[inv]
    names = list(by_label)
    order = np.argsort(group, kind="stable")  # one key (a two-key lexsort is ~10x slower)
    sorted_group = group[order]
    bounds = np.flatnonzero(sorted_group[1:] != sorted_group[:-1]) + 1
    grand = int(values.sum())
    rows = []
    firsts = sorted_group[np.concatenate([[0], bounds])].tolist()
    for g, part in zip(firsts, np.split(values[order], bounds), strict=True):
        s = summarize(part, ddof=1)
        tot = int(part.sum())
        head = (names[g], s.count, tot) + ((tot / grand if grand else 0.0,) if share else ())
        rows.append(head + (s.mean, s.median, int(s.min), int(s.max), s.std if s.std is not None else 0.0))
    rows.sort(key=lambda r: (-r[2], r[1], r[0]))
    return rows


def _extra(trace: Trace) -> dict:
    return dict(trace.meta.extra or {})


def _export_tables(trace: Trace) -> set[str] | None:
    """The summary tables an nsys SQLite export held (None for other sources)."""
    tables = _extra(trace).get("nsys_tables")
    return set(tables) if tables is not None and trace.meta.source_format == "nsys-sqlite" else None


def missing_reason(name: str, trace: Trace) -> str | None:
    """Why ``trace`` cannot give table ``name`` (None when it can): what the input lacks and
    what captures it."""
    fmt = trace.meta.source_format
    tables = _export_tables(trace)
    if name == "cuda_api_sum":
        if tables is not None:
            return None if RUNTIME in tables else (
                f"not in this export: no {RUNTIME} table (capture with nsys profile --trace=cuda)")
        if fmt == "nsys-csv":
            return ("not in this export: an nsys stats CSV holds no API calls (export the report as SQLite: "
                    "nsys export --type sqlite)")
        return None if len(trace.api) else "not in this trace: it records no CUDA runtime or driver calls"
    if name in ("cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum"):
        if tables is not None and not {MEMCPY, MEMSET_TABLE} & tables:
            if {KERNEL, RUNTIME} & tables:
                return (f"no memcpy or memset in this export: no {MEMCPY} or {MEMSET_TABLE} table although CUDA "
                        "was traced (none was recorded; nsys 2024+ leaves empty tables out)")
            return (f"not in this export: no {MEMCPY} or {MEMSET_TABLE} table "
                    "(capture with nsys profile --trace=cuda)")
        if tables is None and len(trace.memops) == 0:
            return "not in this trace: it records no memcpy or memset"
        return None
    if name == "osrt_sum":
        if tables is not None:
            return None if OSRT in tables else f"not in this export: no {OSRT} table (capture with nsys profile --trace=osrt)"
        return ("not in this trace: OS runtime calls are recorded by Nsight Systems only "
                "(nsys profile --trace=osrt, read from its SQLite export)")
    raise ValueError(f"not an nsys summary table: {name!r}")


def other_processes_note(name: str, trace: Trace) -> str | None:
    """The calls of this export that are in no trace (processes without GPU activity)."""
    table = {"cuda_api_sum": RUNTIME, "osrt_sum": OSRT}.get(name)
    n = (_extra(trace).get("calls_in_other_processes") or {}).get(table, 0) if table else 0
    if not n:
        return None
    return (f"this process only: {n:,} more {table} calls of processes with no GPU activity are in the export "
            "(nsys stats counts them)")


def summary_rows(name: str, trace: Trace) -> tuple[tuple[str, ...], list[tuple]]:
    """The columns and rows of table ``name`` (one of :data:`~tracestory.analysis.table_names.NSYS_TABLES`) of ``trace``; call
    :func:`missing_reason` first."""
    if name in ("cuda_api_sum", "osrt_sum"):
        t = trace.api if name == "cuda_api_sum" else trace.osrt
        return ("name", *STAT_COLUMNS), grouped_stats(t["name"], t.dur_ns, trace.name)
    m = trace.memops
    # one code per (name, memset or not): the operation label is computed once per distinct pair
    key = m["name"].astype(np.int64) * 2 + (m["kind"] == MEMSET)
    label = lambda k: operation(trace.name(k // 2), bool(k % 2))  # noqa: E731
    if name == "cuda_gpu_mem_time_sum":
        return ("operation", *STAT_COLUMNS), grouped_stats(key, m.dur_ns, label)
    if name == "cuda_gpu_mem_size_sum":
        known = m["bytes"] >= 0   # a memop whose size the source did not record is left out
        return ("operation", *SIZE_COLUMNS), grouped_stats(key[known], m["bytes"][known], label, share=False)
    raise ValueError(f"not an nsys summary table: {name!r}")
