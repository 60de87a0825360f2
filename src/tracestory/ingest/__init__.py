"""Files -> Trace (and Nsight Compute KernelMetrics).

:func:`load_inputs` takes whatever a user passes on the command line — Kineto traces, Nsight
Systems SQLite/CSV/report files, Nsight Compute reports or CSVs, capture folders, folders of
rank traces — sniffs each one and returns the traces and kernel metrics it holds. Each reader
lives in its own module and is imported only when a file of its kind is seen.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import TraceFormatError, UsageError
from ..trace import Trace

Progress = Callable[[int, int], None]

_TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".sqlite", ".nsys-rep", ".qdrep", ".csv",
                   ".ncu-rep", ".ncu-rep.gz")


@dataclass
class Inputs:
    """Everything read from the command line's inputs."""

    traces: list[Trace] = field(default_factory=list)
    kernel_metrics: list = field(default_factory=list)   # (path, KernelMetrics) pairs
    manifests: list[dict] = field(default_factory=list)  # capture folders' manifest.json
    artifact_dirs: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    scheduler_logs: list[str] = field(default_factory=list)   # capture folders' serving logs
    load_summaries: list[str] = field(default_factory=list)   # capture folders' load summaries


def sniff(path: Path) -> str:
    """The format of one file: kineto, nsys-sqlite, nsys-rep, nsys-csv, ncu-rep, ncu-csv."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".ncu-rep"):
        return "ncu-rep"
    if name.endswith((".nsys-rep", ".qdrep")):
        return "nsys-rep"
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        if head[:2] == b"\x1f\x8b" and not name.endswith(".json"):
            with gzip.open(path, "rb") as f:  # a gzip'ed CSV or SQLite file: sniff the content
                head = f.read(4096)
    except OSError as e:  # includes gzip.BadGzipFile
        raise TraceFormatError(path, "a readable file", str(e)) from None
    except EOFError:
        raise TraceFormatError(path, "a complete gzip file", "a truncated gzip stream") from None
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if name.endswith(".csv") or b'"Kernel Name"' in head or b"Time (%)" in head:
        return _sniff_csv(head, path)
    if head[:2] == b"\x1f\x8b" or name.endswith(".json") or head.lstrip()[:1] in (b"{", b"["):
        return "kineto"
    raise TraceFormatError(path, "a Kineto .json(.gz), nsys .sqlite/.nsys-rep/CSV or ncu .ncu-rep/CSV",
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
    """Read one file. Returns ``("traces", [Trace, ...])`` or ``("ncu", KernelMetrics)``."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    kind = sniff(path)
    if kind == "kineto":
        from .kineto import load_kineto

        return "traces", [load_kineto(path, require_gpu=require_gpu, progress=progress)]
    if kind in ("nsys-sqlite", "nsys-rep"):
        from .nsys_sqlite import load_nsys_sqlite

        if kind == "nsys-rep":
            from .nsys_rep import export_nsys_rep

            path = export_nsys_rep(path)
        return "traces", load_nsys_sqlite(path)
    if kind == "nsys-csv":
        from .nsys_csv import load_nsys_csv

        return "traces", load_nsys_csv(path)
    from .ncu import load_ncu

    return "ncu", load_ncu(path)


def _expand(path: Path) -> list[Path]:
    """A folder of traces -> its trace files, in name order."""
    files = [p for p in sorted(path.rglob("*")) if p.is_file() and p.name.lower().endswith(_TRACE_SUFFIXES)]
    if not files:
        raise UsageError(f"{path}: folder holds no trace files ({', '.join(_TRACE_SUFFIXES)})")
    return files


def load_inputs(paths, *, progress_factory: Callable[[Path], Progress | None] | None = None) -> Inputs:
    """Read every input; folders with a ``manifest.json`` are capture folders."""
    out = Inputs()
    for raw in paths:
        path = Path(raw)
        out.paths.append(str(path))
        if path.is_dir() and (path / "manifest.json").exists():
            from ..capture.artifacts import load_artifact_folder

            folder = load_artifact_folder(path)
            out.manifests.append(folder.manifest)
            out.artifact_dirs.append(str(path))
            require_gpu = bool(folder.manifest.get("environment", {}).get("gpus"))
            files = folder.trace_files
            out.scheduler_logs += [str(p) for p in folder.scheduler_logs]
            out.load_summaries += [str(p) for p in folder.load_summaries]
        elif path.is_dir():
            require_gpu, files = True, _expand(path)
        else:
            require_gpu, files = True, [path]
        for f in files:
            progress = progress_factory(f) if progress_factory else None
            kind, value = load_file(f, require_gpu=require_gpu, progress=progress)
            if kind == "traces":
                out.traces.extend(value)
            else:
                out.kernel_metrics.append((str(f), value))
    return out
