"""Nsight Systems reports (``.nsys-rep``, older ``.qdrep``) -> the SQLite export next to them.

The report format is private; the only supported reader is ``nsys export --type sqlite``.
When ``nsys`` is on PATH the report is exported once to ``<report>.sqlite`` (same folder, same
stem) and that file is reused while it is newer than the report. Without ``nsys`` the error
says the exact command to run by hand on a machine that has it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import ToolNotFound, TraceFormatError, UsageError
from .files import refuse_special


def sqlite_path_for(report: Path) -> Path:
    """Where the export of ``report`` goes: same folder, suffix ``.sqlite``."""
    return report.with_suffix(".sqlite")


def export_command(report: Path, nsys: str = "nsys") -> list[str]:
    """The argv that exports ``report`` to :func:`sqlite_path_for` (``--force-overwrite`` since
    a stale export is replaced)."""
    return [nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
            "--output", str(sqlite_path_for(report)), str(report)]


def export_nsys_rep(path: str | os.PathLike, *, timeout_s: float | None = 600) -> Path:
    """Export an ``.nsys-rep``/``.qdrep`` to SQLite next to it (or reuse a fresh export).

    Raises :class:`ToolNotFound` when ``nsys`` is not on PATH and no fresh export exists, and
    :class:`TraceFormatError` when ``nsys export`` fails.
    """
    report = Path(path)
    if not report.exists():
        raise UsageError(f"{report}: no such file")
    refuse_special(report)
    out = sqlite_path_for(report)
    if out.is_file() and out.stat().st_mtime >= report.stat().st_mtime:
        return out
    nsys = shutil.which("nsys")
    if nsys is None:
        manual = " ".join(export_command(report))
        raise ToolNotFound("nsys", f"cannot read {report} without Nsight Systems; export it by hand with "
                                   f"`{manual}` and pass the .sqlite file instead")
    argv = export_command(report, nsys)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise TraceFormatError(report, f"`nsys export` to finish within {timeout_s} s", "it did not") from None
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise TraceFormatError(report, "a report `nsys export --type sqlite` can read",
                               f"exit code {proc.returncode}: {tail[0][:200]}")
    return out
