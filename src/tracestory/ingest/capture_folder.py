"""Read a capture folder ``artifacts/<name>/`` written by ``tracestory capture``.

The folder holds ``manifest.json`` and one sub-folder per tool that completed:
``torch/rank<r>.trace.json.gz``, ``nsys/<name>.sqlite`` (+ ``.nsys-rep``), ``ncu/<name>.ncu-rep``
+ ``<name>_raw.csv`` + ``<name>_details.csv``. Staging folders of captures in progress or
interrupted (``.partial-*``) are ignored: only finished captures are read.

A capture under load (``--load``) also holds, in its tool folder, the server's scheduler
event log (``*.sched.jsonl``) and the load generator's ``load.summary.json`` and
``load.requests.jsonl``; :attr:`ArtifactFolder.scheduler_logs` and
:attr:`ArtifactFolder.load_summaries` name those of one capture (see :func:`_serving_files`)
for the batch story. A capture with GPU telemetry holds ``<tool>/telemetry.jsonl``
(:attr:`ArtifactFolder.telemetry`).

:attr:`ArtifactFolder.trace_files` is what ``tracestory report`` loads: every Kineto trace,
each nsys SQLite (the ``.nsys-rep`` only when no SQLite export of it exists), and for Nsight
Compute one source per report, the raw CSV (readable without the optional ``ncu_report``
package) or else the ``.ncu-rep``, so no kernel is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import json

from ..errors import TraceFormatError, UsageError
from .files import check_size, refuse_special

MANIFEST = "manifest.json"                  # the capture's record: environment, commands, files
MANIFEST_SCHEMA = "tracestory.manifest/1"
LOAD_SUMMARY = "load.summary.json"          # ``tracestory load --json`` output of a capture under load

TOOL_FOLDERS = ("torch", "nsys", "ncu")
TELEMETRY_FILE = "telemetry.jsonl"          # GPU telemetry sampled by the capture (tracestory.telemetry)


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The folder's manifest, or None when it has none."""
    p = Path(folder) / MANIFEST
    if not p.is_file():
        return None
    check_size(p, refuse_special(p))
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(p, "a tracestory manifest (JSON)", f"unreadable JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise TraceFormatError(p, f"a manifest with schema {MANIFEST_SCHEMA!r}", f"schema {found!r}")
    return data


@dataclass(frozen=True)
class ArtifactFolder:
    path: Path
    manifest: dict[str, Any]
    torch: tuple[Path, ...]            # torch/*.json.gz, *.json
    nsys_sqlite: tuple[Path, ...]      # nsys/*.sqlite
    nsys_reports: tuple[Path, ...]     # nsys/*.nsys-rep, *.qdrep
    ncu_reports: tuple[Path, ...]      # ncu/*.ncu-rep (.gz)
    ncu_raw_csv: tuple[Path, ...]      # ncu/*_raw.csv
    ncu_details_csv: tuple[Path, ...]  # ncu/*_details.csv
    scheduler_logs: tuple[Path, ...] = ()   # <tool>/*.sched.jsonl (captures under load)
    load_summaries: tuple[Path, ...] = ()   # <tool>/load.summary.json
    telemetry: tuple[Path, ...] = ()        # <tool>/telemetry.jsonl (GPU telemetry, see _telemetry_files)

    @property
    def trace_files(self) -> list[Path]:
        """Files to load, one source per capture (see the module docstring)."""
        files = list(self.torch) + list(self.nsys_sqlite)
        have_sqlite = {p.name[: -len(".sqlite")] for p in self.nsys_sqlite}
        files += [p for p in self.nsys_reports if _stem(p) not in have_sqlite]
        raw_stems = {p.name[: -len("_raw.csv")] for p in self.ncu_raw_csv}
        files += list(self.ncu_raw_csv)
        files += [p for p in self.ncu_reports if _stem(p) not in raw_stems]
        return files


def _stem(p: Path) -> str:
    name = p.name
    for suffix in (".ncu-rep.gz", ".ncu-rep", ".nsys-rep", ".qdrep"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return p.stem


def _glob(folder: Path, *suffixes: str) -> tuple[Path, ...]:
    if not folder.is_dir():
        return ()
    return tuple(p for p in sorted(folder.iterdir())
                 if p.is_file() and p.name.lower().endswith(suffixes))


def load_artifact_folder(path: str | Path) -> ArtifactFolder:
    """The manifest and the trace files of one finished capture folder."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: expected an artifact folder (artifacts/<name>/), found "
                         f"{'a file' if path.exists() else 'nothing'}")
    manifest = read_manifest(path)
    if manifest is None:
        raise TraceFormatError(path, f"an artifact folder with {MANIFEST}", f"no {MANIFEST}")
    csvs = _glob(path / "ncu", ".csv")
    return ArtifactFolder(
        path=path,
        manifest=manifest,
        torch=tuple(p for p in _glob(path / "torch", ".json.gz", ".json") if p.name != LOAD_SUMMARY),
        nsys_sqlite=_glob(path / "nsys", ".sqlite"),
        nsys_reports=_glob(path / "nsys", ".nsys-rep", ".qdrep"),
        ncu_reports=_glob(path / "ncu", ".ncu-rep", ".ncu-rep.gz"),
        ncu_raw_csv=tuple(p for p in csvs if p.name.endswith("_raw.csv")),
        ncu_details_csv=tuple(p for p in csvs if p.name.endswith("_details.csv")),
        **_serving_files(path),
        telemetry=_telemetry_files(path),
    )


def _telemetry_files(path: Path) -> tuple[Path, ...]:
    """The GPU telemetry of the first tool folder, in the order torch, nsys, that holds one (an
    ncu capture never samples: the sampler would disturb its clock control)."""
    for tool in ("torch", "nsys"):
        f = path / tool / TELEMETRY_FILE
        if f.is_file():
            return (f,)
    return ()


def _serving_files(path: Path) -> dict[str, tuple[Path, ...]]:
    """The scheduler log and load summary of one capture under load: the first tool folder,
    in the order torch, nsys, ncu, that holds a log (the torch and nsys logs go with a timeline;
    under ncu the server ran kernel by kernel, so its log tells another run's story)."""
    for tool in TOOL_FOLDERS:
        logs = _glob(path / tool, ".sched.jsonl", ".sched.jsonl.gz")
        if logs:
            return {"scheduler_logs": logs, "load_summaries": _glob(path / tool, LOAD_SUMMARY)}
    return {}
