"""Read a capture folder ``artifacts/<name>/`` written by ``tracestory capture``.

The folder holds ``manifest.json`` and one sub-folder per tool that completed:
``torch/rank<r>.trace.json.gz``, ``nsys/<name>.sqlite`` (+ ``.nsys-rep``), ``ncu/<name>.ncu-rep``
+ ``<name>_raw.csv`` + ``<name>_details.csv``. Staging folders of captures in progress or
interrupted (``.partial-*``) are ignored. When no finished capture left files, a failed capture's
kept files (``failed-<tool>/``) are read instead and the manifest says so (``partial``: the
folder, the capture's error, the files it lacks), so a report tells what there is and what is
missing (:func:`load_artifact_folder`).

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
    except OSError as e:                # permission denied, an I/O error
        raise TraceFormatError(p, "a readable tracestory manifest", (e.strerror or str(e)).lower()) from None
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
    named = [p for p in sorted(folder.iterdir()) if p.name.lower().endswith(suffixes)]
    for p in named:   # one named like a trace but not a file is refused, never skipped
        if not p.is_file():
            what = ("a folder" if p.is_dir() else "a dangling link" if p.is_symlink() and not p.exists()
                    else "a special file (FIFO, socket or device)")
            raise TraceFormatError(p, "a trace file (a member of the capture folder named like one)", what)
    return tuple(named)


def capture_root(path: str | Path) -> Path | None:
    """The capture folder of ``path``: itself when it holds a manifest, its parent when ``path``
    is one of its tool folders (``torch/``, ``failed-torch/``, ...); else None."""
    path = Path(path)
    if not path.is_dir():
        return None
    if (path / MANIFEST).is_file():
        return path
    if (path.parent / MANIFEST).is_file() and _tool_of(path.name) is not None:
        return path.parent
    return None


def _tool_of(folder_name: str) -> str | None:
    name = folder_name[len(FAILED_PREFIX):] if folder_name.startswith(FAILED_PREFIX) else folder_name
    return name if name in TOOL_FOLDERS else None


FAILED_PREFIX = "failed-"        # a failed capture's files, kept by tracestory capture


def load_artifact_folder(path: str | Path) -> ArtifactFolder:
    """The manifest and the trace files of one capture folder (or of one of its tool folders).

    Finished captures' tool folders are read. When none holds a file but a failed capture kept
    its files (``failed-<tool>/``), those are read instead, and the returned manifest (a copy)
    gets ``partial``: one entry per folder read that way, with the capture's error and the files
    the capture would have written but did not (:func:`partial_entry`), for the report's
    Limitations. A tool folder given itself (``artifacts/x/failed-torch``) is read alone."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: expected an artifact folder (artifacts/<name>/), found "
                         f"{'a file' if path.exists() else 'nothing'}")
    root = capture_root(path) or path
    manifest = read_manifest(root)
    if manifest is None:
        raise TraceFormatError(path, f"an artifact folder with {MANIFEST}", f"no {MANIFEST}")
    if root != path:                                  # one tool folder, named by the user
        dirs = {_tool_of(path.name): path}
    else:
        dirs = {t: root / t for t in TOOL_FOLDERS}
        if not any(_glob(d, "") for d in dirs.values()):
            failed = {t: root / f"{FAILED_PREFIX}{t}" for t in TOOL_FOLDERS}
            dirs = {t: d for t, d in failed.items() if d.is_dir()} or dirs
    partial = [partial_entry(manifest, t, d) for t, d in dirs.items() if d.name.startswith(FAILED_PREFIX)]
    if partial:
        manifest = {**manifest, "partial": partial}
    none = root / ".none"
    csvs = _glob(dirs.get("ncu", none), ".csv")
    return ArtifactFolder(
        path=root,
        manifest=manifest,
        torch=tuple(p for p in _glob(dirs.get("torch", none), ".json.gz", ".json") if p.name != LOAD_SUMMARY),
        nsys_sqlite=_glob(dirs.get("nsys", none), ".sqlite"),
        nsys_reports=_glob(dirs.get("nsys", none), ".nsys-rep", ".qdrep"),
        ncu_reports=_glob(dirs.get("ncu", none), ".ncu-rep", ".ncu-rep.gz"),
        ncu_raw_csv=tuple(p for p in csvs if p.name.endswith("_raw.csv")),
        ncu_details_csv=tuple(p for p in csvs if p.name.endswith("_details.csv")),
        **_serving_files(dirs),
        telemetry=_telemetry_files(dirs),
    )


def partial_entry(manifest: dict[str, Any], tool: str, folder: Path) -> dict[str, Any]:
    """What a failed capture's kept folder holds and lacks: ``folder``, ``error`` (the last
    failed ``tool`` capture's), ``missing`` (files such a capture writes: a trace per rank, and
    under ``--load`` the scheduler log and the load summary; for nsys/ncu the report)."""
    recs = [c for c in manifest.get("captures") or [] if isinstance(c, dict) and c.get("tool") == tool]
    rec = next((c for c in reversed(recs) if c.get("status") == "failed"), recs[-1] if recs else {})
    settings = rec.get("settings") if isinstance(rec.get("settings"), dict) else {}

    def value(key: str):
        v = settings.get(key)
        return v.get("value") if isinstance(v, dict) else None

    have = {p.name for p in folder.iterdir() if p.is_file()} if folder.is_dir() else set()
    want: list[str] = []
    if tool == "torch":
        if not rec.get("external_profiler"):
            want += [f"rank{r}.trace.json.gz" for r in range(int(value("torchrun") or 1))]
    elif tool == "nsys":
        want += [".nsys-rep report", ".sqlite export"]
    else:
        want += [".ncu-rep report", "_raw.csv"]
    if value("load") is not None:
        want += ["serve.sched.jsonl", LOAD_SUMMARY]
    missing = [w for w in want if not any(h == w or (w.startswith((".", "_")) and h.endswith(w.split()[0]))
                                          for h in have)]
    return {"folder": folder.name, "tool": tool, "error": rec.get("error"), "missing": missing,
            "files": sorted(have)}


def _telemetry_files(dirs: dict[str, Path]) -> tuple[Path, ...]:
    """The GPU telemetry of the first tool folder, in the order torch, nsys, that holds one (an
    ncu capture never samples: the sampler would disturb its clock control)."""
    for tool in ("torch", "nsys"):
        f = dirs[tool] / TELEMETRY_FILE if tool in dirs else None
        if f is not None and f.is_file():
            return (f,)
    return ()


def _serving_files(dirs: dict[str, Path]) -> dict[str, tuple[Path, ...]]:
    """The scheduler log and load summary of one capture under load: the first tool folder,
    in the order torch, nsys, ncu, that holds a log (the torch and nsys logs go with a timeline;
    under ncu the server ran kernel by kernel, so its log tells another run's story)."""
    for tool in TOOL_FOLDERS:
        if tool not in dirs:
            continue
        logs = _glob(dirs[tool], ".sched.jsonl", ".sched.jsonl.gz")
        if logs:
            return {"scheduler_logs": logs, "load_summaries": _glob(dirs[tool], LOAD_SUMMARY)}
    return {}
