"""``manifest.json``: what a capture ran on and every command it ran (the Actions Log).

Layout (plain JSON; times are UTC ISO-8601 strings, durations integer ns, sizes bytes)::

    {
      "schema": "tracestory.manifest/1",
      "name": "tiny_llama",
      "environment": {...},                    # capture.environment.collect_environment()
      "captures": [                            # one per `tracestory capture <tool>` call
        {"tool": "ncu", "status": "complete" | "failed",
         "started_at": "...", "duration_ns": 123,
         "invocation": ["tracestory", "capture", "ncu", ...],   # reproduces it
         "workload": {"argv": [...], "cwd": "...", "git": {...}},
         "settings": {"launch_count": {"value": 20, "source": "flag"}, ...},
         "steps": [
           {"name": "profile", "argv": [...], "command": "ncu ... python x.py",
            "env": {}, "in_process": false, "started_at": "...", "duration_ns": 1,
            "exit_code": 0, "status": "ok" | "failed", "error": null,
            "files": [{"path": "ncu/x.ncu-rep", "bytes": 1234}]}]}]
    }

Several captures (torch, then ncu, ...) into one folder append to ``captures``; the
``environment`` is the latest one's. The file is replaced atomically (write then rename), so
a reader never sees half a manifest. A capture is recorded before it runs anything
(``"status": "running"``) and the file is rewritten as each step starts and ends, so a capture
killed at any point leaves a manifest saying how far it got. Steps also record ``signal``
(the signal that killed the child), ``interrupted`` (the stop signal that reached the
capture) and ``stop_signal`` (the last signal the capture sent the child).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..ingest.capture_folder import MANIFEST, read_manifest  # noqa: F401  (re-exported for the pipeline)
from ..ingest.capture_folder import MANIFEST_SCHEMA as SCHEMA
from ..outputs import write_text
from .supervise import run_child

# What a capture folder is and how it is read live with its reader (ingest.capture_folder); the
# capture writes what that reader reads: MANIFEST, SCHEMA and read_manifest come from there.


@dataclass(frozen=True)
class Step:
    """One command of a capture plan."""

    name: str                      # "warmup-run", "profile", "export-sqlite", "csv-raw", ...
    argv: tuple[str, ...]          # what runs (staging paths)
    shown: tuple[str, ...]         # the same with final paths: what the user would type
    stdout: str | None = None      # staging path that receives stdout (CSV imports)
    stdout_shown: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # variables added for this step
    in_process: bool = False       # the torch capture runs inside tracestory
    env_shown: Mapping[str, str] | None = None   # ``env`` with final paths (default: ``env``)
    role: str | None = None        # with --load: "server" (the profiled step) or "load"

    @property
    def env_display(self) -> Mapping[str, str]:
        """``env`` as recorded and shown: with final paths."""
        return self.env if self.env_shown is None else self.env_shown

    @property
    def command(self) -> str:
        """Shell form of ``shown``: ``VAR=x cmd args > out``."""
        parts = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_display.items())]
        parts.append(shlex.join(self.shown))
        if self.stdout_shown:
            parts.append("> " + shlex.quote(self.stdout_shown))
        return " ".join(parts)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_manifest(name: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "name": name, "environment": {}, "captures": []}


def write_manifest(folder: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Replace ``manifest.json`` atomically (an error writing it is one line)."""
    p = Path(folder) / MANIFEST
    write_text(p, json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return p


def snapshot(folder: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``folder``."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): p.stat().st_size
            for p in sorted(folder.rglob("*")) if p.is_file()}


def new_files(before: Mapping[str, int], after: Mapping[str, int]) -> list[tuple[str, int]]:
    """Files created or changed between two snapshots, sorted by path."""
    return [(k, n) for k, n in sorted(after.items()) if before.get(k) != n or k not in before]


def run_step(step: Step, *, cwd: str | Path | None = None, grace_s: float = 120.0) -> dict[str, Any]:
    """Run one step as a supervised child (:func:`.supervise.run_child`) and return its record
    (without ``files``; the caller adds them).

    The child inherits stdin/stderr (the user sees the workload's output); ``stdout`` goes to
    the step's file when it has one. A stop signal that reaches the capture is forwarded; the
    record says which (``interrupted``), what was sent (``stop_signal``) and, for a child that
    died of a signal, which one (``signal``).
    """
    started = now_iso()
    t0 = time.perf_counter_ns()
    env = {**os.environ, **step.env} if step.env else None
    try:
        with open(step.stdout, "wb") if step.stdout else contextlib.nullcontext() as fh:
            out = run_child(step.argv, grace_s=grace_s, env=env, cwd=str(cwd) if cwd else None, stdout=fh)
        code, error = out.code, out.error
    except OSError as e:
        out, code, error = None, 127, f"{e.filename or step.argv[0]}: {e.strerror or e}"
    duration = time.perf_counter_ns() - t0
    return {
        "name": step.name,
        "argv": list(step.shown),
        "command": step.command,
        "env": dict(step.env_display),
        "in_process": step.in_process,
        "started_at": started,
        "duration_ns": int(duration),
        "exit_code": int(code),
        "status": "ok" if code == 0 else "failed",
        "error": error,
        "files": [],
        "signal": out.signal if out else None,
        "interrupted": out.interrupted if out else None,
        "stop_signal": out.stop_signal if out else None,
    }


def dry_run_lines(steps: Sequence[Step]) -> list[str]:
    """The exact commands a plan would run, one per line, for ``--dry-run``."""
    return [s.command for s in steps]
