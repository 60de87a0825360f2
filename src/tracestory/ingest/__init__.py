"""Files -> :class:`Inputs`: traces, Nsight Compute kernel metrics, capture manifests, and the
serving run's scheduler event log and load summary.

:func:`load_inputs` takes whatever a user passes on the command line — Kineto traces, rocprof (v1)
JSON traces, Nsight
Systems SQLite/CSV/report files, Nsight Compute reports or CSVs, capture folders, folders of
rank traces, a scheduler event log (docs/SCHEDULER_LOG.md) and a ``tracestory load --json``
summary — sniffs each one and returns what it holds. Each reader lives in its own module of
this package; every input is first sniffed (:mod:`.sniffs`, :func:`sniff`: at most its first
64 KiB), and a reader other than Kineto's is imported only when a file of its kind is seen
(:func:`tracestory.lazy.entry`).

One report tells one serving run: at most one scheduler event log and one load summary (from
the command line or from a capture folder), and a summary only together with its log.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import TraceFormatError, UsageError
from ..trace import Trace
from ..lazy import entry
from .capture_folder import MANIFEST, capture_root, load_artifact_folder
from .files import SNIFF_BYTES, check_sparse, named_members, read_head, refuse_special, state, with_warnings
from .sniffs import is_rocprof_head, is_scheduler_log, is_summary_file
from .telemetry import TelemetryLog, is_telemetry_file, read_telemetry
from .kineto import load_kineto

if TYPE_CHECKING:
    from .load_summary import LoadSummary
    from .scheduler_log import SchedulerLog

Progress = Callable[[int, int], None]

_TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".sqlite", ".nsys-rep", ".qdrep", ".csv",
                   ".ncu-rep", ".ncu-rep.gz")


@dataclass(frozen=True)
class Inputs:
    """Everything read from the inputs, in the order given.

    ``kernel_metrics``: ``(path, KernelMetrics)`` pairs, one per Nsight Compute input.
    ``paths``: the inputs as given, trace inputs first, then the serving files named directly.
    ``scheduler_log`` / ``load_summary``: the serving run's parsed files, or None.
    ``telemetry``: the GPU telemetry file of a capture folder or named as an input, or None."""

    traces: tuple[Trace, ...] = ()
    kernel_metrics: tuple = ()
    manifests: tuple[dict, ...] = ()       # capture folders' manifest.json
    artifact_dirs: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    scheduler_log: SchedulerLog | None = None
    load_summary: LoadSummary | None = None
    telemetry: TelemetryLog | None = None  # GPU telemetry (a capture's telemetry.jsonl, or one named)
    window: object | None = None           # analysis.window.WindowSelection: the part of the traces kept
    warnings: tuple[str, ...] = ()         # inputs that disagree with each other (stated on the terminal too)

    def __repr__(self) -> str:
        return (f"Inputs(traces={len(self.traces)}, kernel_metrics={len(self.kernel_metrics)}, "
                f"manifests={len(self.manifests)}, scheduler_log={self.scheduler_log is not None}, "
                f"load_summary={self.load_summary is not None}, telemetry={self.telemetry is not None}, paths={list(self.paths)[:4]!r})")

    @property
    def manifest(self) -> dict | None:
        """The first capture folder's manifest (the one the report's Environment tells)."""
        return self.manifests[0] if self.manifests else None


def sniff(path: Path) -> str:
    """The format of one file: kineto, rocprof-json, nsys-sqlite, nsys-rep, nsys-csv, ncu-rep, ncu-csv.

    A JSON document is rocprof's (v1) when its first 64 KiB hold one of the process names or
    rocminfo keys rocprof writes (:func:`~.rocprof_json.is_rocprof_head`), else Kineto's."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".ncu-rep"):
        return "ncu-rep"
    if name.endswith((".nsys-rep", ".qdrep")):
        return "nsys-rep"
    check_sparse(path, refuse_special(path))  # before a byte is read: special files, sparse giants
    # one read of at most 64 KiB, gzip inflated (damage: one line); the CSV and JSON-start checks
    # look at its first 4 KiB, the rocprof markers at all of it
    full = read_head(path, SNIFF_BYTES)
    head = full[:4096]
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if name.endswith(".csv") or b'"Kernel Name"' in head or b"Time (%)" in head:
        return _sniff_csv(head, path)
    if name.endswith(".json") or head.lstrip()[:1] in (b"{", b"["):
        return "rocprof-json" if is_rocprof_head(full) else "kineto"
    raise TraceFormatError(path, "a Kineto or rocprof .json(.gz), nsys .sqlite/.nsys-rep/CSV or ncu .ncu-rep/CSV",
                           f"an unrecognized file starting with {head[:16]!r}")


def _sniff_csv(head: bytes, path: Path) -> str:
    text = head.decode("utf-8", "replace")
    if '"Kernel Name"' in text or '"ID","Process ID"' in text or "==PROF==" in text:
        return "ncu-csv"
    if any(h in text for h in ("Time (%)", "Start (ns)", "Total Time (ns)", "Instances")):
        return "nsys-csv"
    raise TraceFormatError(path, "an ncu --csv export or an nsys stats --format csv output",
                           f"a CSV whose first line is {text.splitlines()[0][:80]!r}" if text else "an empty CSV")


def load_file(path: str | os.PathLike, *, require_gpu: bool = True, progress: Progress | None = None):
    """Read one file. Returns ``("traces", [Trace, ...])`` or ``("ncu", KernelMetrics)``.

    Two checks hold for every reader: text that is not UTF-8 where a reader decodes JSON (a
    damaged byte; msgspec raises ``UnicodeDecodeError``, not its ``DecodeError``) is refused in
    one line, and so is a trace whose kernels all last 0 ns (no GPU time to tell: a damaged or
    rewritten file, never what a profiler records)."""
    try:
        kind, value = _load_file(Path(path), require_gpu, progress)
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, "text in UTF-8 (JSON)", f"a byte that is not UTF-8 ({e.reason}; a damaged "
                                                            "file?)") from None
    if kind == "traces":
        value = refuse_timeless_kernels(path, value)
    return kind, value


def refuse_timeless_kernels(path: str | os.PathLike, traces: list[Trace]) -> list[Trace]:
    """Refuse traces whose kernels all last 0 ns: no GPU time to tell (a damaged or rewritten
    file; a profiler never records that). Some kernels of 0 ns are stated when the format keeps
    nanoseconds (Nsight Systems: a kernel never lasts 0 ns there); Kineto's older files round
    to whole microseconds, where sub-microsecond kernels are 0 ns as written, and say nothing."""
    out = []
    for trace in traces:
        k = trace.kernels
        zero = int(np.count_nonzero(k["end_ns"] <= k["start_ns"])) if len(k) else 0
        if len(k) and zero == len(k):
            raise TraceFormatError(path, "kernels with a duration (their GPU time)", f"{len(k):,} kernels, all of 0 ns")
        if zero and trace.meta.source_format.startswith("nsys"):
            w = f"{zero:,} of {len(k):,} kernels last 0 ns (end = start: rows damaged or rewritten; counted as 0 ns)"
            state(path, [w])
            trace = dataclasses.replace(trace, meta=with_warnings(trace.meta, [w]))
        out.append(trace)
    return out


def _load_file(path: Path, require_gpu: bool, progress: Progress | None):
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    if path.name == MANIFEST and path.is_file():
        raise UsageError(f"{path}: this is a capture folder's manifest; pass the capture folder ({path.parent})")
    kind = sniff(path)
    if kind == "kineto":
        return "traces", [load_kineto(path, require_gpu=require_gpu, progress=progress)]
    # the other readers are imported when a file of their format comes (tracestory.lazy)
    if kind == "rocprof-json":
        return "traces", [entry("tracestory.ingest.rocprof_json", "load_rocprof_json")(path, require_gpu=require_gpu)]
    if kind in ("nsys-sqlite", "nsys-rep"):
        if kind == "nsys-rep":

            path = entry("tracestory.ingest.nsys_rep", "export_nsys_rep")(path)
        return "traces", entry("tracestory.ingest.nsys_sqlite", "load_nsys_sqlite")(path, require_gpu=require_gpu)
    if kind == "nsys-csv":
        return "traces", entry("tracestory.ingest.nsys_csv", "load_nsys_csv")(path)

    return "ncu", entry("tracestory.ingest.ncu", "load_ncu")(path)


def _expand(path: Path) -> list[Path]:
    """A folder of traces -> its trace files, in name order (files.named_members: one named like a
    trace that is not a regular file is refused)."""
    files = named_members(path, _TRACE_SUFFIXES)
    if not files:
        raise UsageError(f"{path}: folder holds no trace files ({', '.join(_TRACE_SUFFIXES)})")
    return files


def split_serving_files(paths) -> tuple[list, list, list]:
    """(other inputs, scheduler event logs, load summaries) among ``paths``: the serving files
    are read by their own readers, not the trace readers."""
    logs = [p for p in paths if Path(p).is_file() and is_scheduler_log(p)]
    summaries = [p for p in paths if p not in logs and Path(p).is_file() and is_summary_file(p)]
    return [p for p in paths if p not in logs and p not in summaries], logs, summaries


def load_inputs(paths, *, progress_factory: Callable[[Path], Progress | None] | None = None,
                require_content: bool = True) -> Inputs:
    """Read every input; folders with a ``manifest.json`` are capture folders.

    Raises :class:`~tracestory.errors.UsageError` for two scheduler logs or two load summaries,
    a summary without its log, and (``require_content``) inputs that hold no trace, no kernel
    metrics and no scheduler log."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [str(p) for p in paths]
    others, logs, summaries = split_serving_files(paths)
    telemetry_files = [p for p in others if Path(p).is_file() and is_telemetry_file(p)]
    others = [p for p in others if p not in telemetry_files]
    traces: list[Trace] = []
    metrics: list = []
    manifests: list[dict] = []
    dirs: list[str] = []
    for raw in others:
        path = Path(raw)
        if capture_root(path) is not None:          # a capture folder, or one of its tool folders
            folder = load_artifact_folder(path)
            manifests.append(folder.manifest)
            dirs.append(str(path))
            require_gpu = bool(folder.manifest.get("environment", {}).get("gpus"))
            files = folder.trace_files
            logs += [str(p) for p in folder.scheduler_logs]
            summaries += [str(p) for p in folder.load_summaries]
            telemetry_files += [str(p) for p in folder.telemetry]
        elif path.is_dir():
            require_gpu, files = True, _expand(path)
        else:
            require_gpu, files = True, [path]
        for f in files:
            progress = progress_factory(f) if progress_factory else None
            kind, value = load_file(f, require_gpu=require_gpu, progress=progress)
            if kind == "traces":
                traces.extend(value)
            else:
                metrics.append((str(f), value))
    for what, found in (("scheduler event log", logs), ("load summary", summaries),
                        ("GPU telemetry file", telemetry_files)):
        if len(found) > 1:
            raise UsageError(f"{found[1]}: one {what} per report (found {len(found)}: {', '.join(found)})")
    if summaries and not logs:
        raise UsageError(f"{summaries[0]}: a load summary is reported with the scheduler event log of the same "
                         "run (`tracestory serve --event-log`), found none")
    if require_content and not traces and not metrics and not logs:
        raise UsageError("no trace or kernel metrics found in the inputs")
    named = [p for p in paths if p in logs or p in summaries or p in telemetry_files]
    log = entry("tracestory.ingest.scheduler_log", "read_scheduler_log")(logs[0]) if logs else None
    summary = entry("tracestory.ingest.load_summary", "read_summary")(summaries[0]) if summaries else None
    warnings: list[str] = []
    if log is not None and summary is not None:
        warnings = entry("tracestory.ingest.load_summary", "against_log")(summary, log)
        state(summaries[0], warnings)  # on the terminal too
    return Inputs(traces=tuple(traces), kernel_metrics=tuple(metrics), manifests=tuple(manifests),
                  artifact_dirs=tuple(dirs), paths=tuple([*others, *named]), scheduler_log=log,
                  load_summary=summary, telemetry=read_telemetry(telemetry_files[0]) if telemetry_files else None,
                  warnings=tuple(warnings))
