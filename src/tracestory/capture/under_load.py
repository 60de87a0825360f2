"""Capture under load: start a server, wait until it is healthy, run a load against it, stop it.

:func:`run_under_load` runs three phases and records each for the manifest:

1. **server**: ``server_argv`` starts as a subprocess in its own session (process group), so
   the stop signal reaches every process of it (a profiler such as ``nsys profile`` and the
   server it launched) the way a terminal Ctrl-C would, while a Ctrl-C typed at
   ``tracestory capture`` does not kill it before the load's records are written;
2. **health**: ``GET <base_url>/health`` is polled until it answers 200, at most
   ``health_timeout_s``; a server that exits first ends the wait at once;
3. **load**: the load command runs as a subprocess (``tracestory load ...`` runs as
   ``python -m tracestory.cli load ...`` with this interpreter, so no console script is needed;
   a command whose first word starts with ``-`` is taken as arguments of ``tracestory load``);
   its exit code is recorded;
4. **stop**: SIGINT to the server's process group, then SIGTERM after ``grace_s``, then
   SIGKILL after another ``grace_s``; the signal that ended it is recorded. The server is
   stopped whatever happened before (failed health check, failed load, Ctrl-C). A server
   launched by ``torchrun`` (or ``python -m torch.distributed.run``, also under ncu or nsys)
   gets the SIGINT on its ranks only (the children of the launcher, found in ``/proc``; a rank
   that is ncu or nsys, ``capture ncu --profile-rank``, through the program it runs): a
   launcher that receives a signal itself ends its ranks and exits 1 with a traceback, while
   ranks that stop by themselves let it exit 0 (``tracestory serve --tensor-parallel N``: rank 0
   stops serving and tells the others to exit). Ranks still running ``grace_s`` later get
   SIGTERM, then SIGKILL (still the ranks, not the launcher, which then exits by itself). Only
   when no rank can be found, or the launcher outlives its ranks, does the process group get
   the sequence above.

Each phase's record has the keys of a manifest step (``name``, ``argv``, ``command``, ``env``,
``in_process``, ``started_at``, ``duration_ns``, ``exit_code``, ``status``, ``error``,
``files``) plus, for the server, ``stop_signal`` (the last signal sent), ``stopped`` (``"ranks"``
or ``"process group"``: whom it was sent to) and ``stop_ns`` (from the first stop signal until
it exited) and ``waited_ns`` for the health check, so the
capture pipeline can append them to a capture's ``steps``.

A server that exits 0, or dies of the SIGINT/SIGTERM it was sent, is ``ok``; one that needed
SIGKILL, or exited on its own before it was stopped, is ``failed``. A Ctrl-C during the run
stops everything the same way and returns the records with ``interrupted=True`` (the caller
writes the manifest, then re-raises KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .manifest import now_iso

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class LoadCapture:
    """What ran: one manifest-step record per phase, and the overall outcome."""

    server: dict[str, Any]
    health: dict[str, Any]
    load: dict[str, Any]
    base_url: str
    ok: bool
    error: str | None
    interrupted: bool = False       # Ctrl-C: the caller should re-raise KeyboardInterrupt

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [self.server, self.health, self.load]

    def manifest(self) -> dict[str, Any]:
        """The ``load`` block of a capture record in ``manifest.json``."""
        return {"base_url": self.base_url, "ok": self.ok, "error": self.error, "interrupted": self.interrupted,
                "server": self.server, "health": self.health, "load": self.load}


def load_argv(load_command: str | Sequence[str]) -> list[str]:
    """The argv that runs a load command (see the module docstring)."""
    words = shlex.split(load_command) if isinstance(load_command, str) else list(load_command)
    if not words:
        return []
    if words[0].startswith("-"):
        words = ["tracestory", "load", *words]
    if Path(words[0]).name == "tracestory":
        return [sys.executable, "-m", "tracestory.cli", *words[1:]]
    return words


EVENT_LOG_ENV = "TRACESTORY_EVENT_LOG"   # `tracestory serve` writes its scheduler log here by default
SCHED_LOG = "serve.sched.jsonl"
LOAD_RECORDS = "load.requests.jsonl"
LOAD_SUMMARY = "load.summary.json"


def is_tracestory_load(argv: Sequence[str]) -> bool:
    """Whether an argv from :func:`load_argv` runs ``tracestory load``."""
    return list(argv[1:4]) == ["-m", "tracestory.cli", "load"]


def capture_load_argv(load_command: str | Sequence[str], folder: str | Path) -> list[str]:
    """The load command of a capture: for ``tracestory load``, ``--output`` and ``--json``
    go into ``folder`` unless the command names them (any other program runs as given)."""
    argv = load_argv(load_command)
    if not is_tracestory_load(argv):
        return argv
    given = {w.split("=", 1)[0] for w in argv}
    if "--output" not in given:
        argv += ["--output", str(Path(folder) / LOAD_RECORDS)]
    if "--json" not in given:
        argv += ["--json", str(Path(folder) / LOAD_SUMMARY)]
    return argv


def url_of(load_command: str | Sequence[str], default: str = DEFAULT_URL) -> str:
    """The server address of a load command line: ``--base-url`` (or its older name ``--url``),
    else ``--host``/``--port`` (vLLM's spelling), else ``default``."""
    words = shlex.split(load_command) if isinstance(load_command, str) else list(load_command)
    found: dict[str, str] = {}
    for i, w in enumerate(words):
        for flag in ("--base-url", "--url", "--host", "--port"):
            if w == flag and i + 1 < len(words):
                found.setdefault(flag, words[i + 1])
            elif w.startswith(flag + "="):
                found.setdefault(flag, w.split("=", 1)[1])
    if "--base-url" in found or "--url" in found:
        return found.get("--base-url") or found["--url"]
    if "--host" in found or "--port" in found:
        host, port = default.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
        return f"http://{found.get('--host', host)}:{found.get('--port', port)}"
    return default


def _record(name: str, argv: Sequence[str], started: str, t0: int, code: int | None, error: str | None,
            **extra: Any) -> dict[str, Any]:
    return {"name": name, "argv": list(argv), "command": shlex.join(argv), "env": {}, "in_process": False,
            "started_at": started, "duration_ns": time.perf_counter_ns() - t0, "exit_code": code,
            "status": "ok" if error is None else "failed", "error": error, "files": [], **extra}


def wait_for_health(base_url: str, timeout_s: float, proc: subprocess.Popen | None = None,
                    interval_s: float = 0.1) -> tuple[bool, str]:
    """Poll ``GET /health`` until 200: (True, "") or (False, what was seen last)."""
    url = base_url.rstrip("/") + "/health"
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        if proc is not None and proc.poll() is not None:
            return False, f"the server exited with code {proc.returncode} before {url} answered 200"
        try:
            with urllib.request.urlopen(url, timeout=max(0.2, min(2.0, timeout_s))) as resp:
                if resp.status == 200:
                    return True, ""
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() >= deadline:
            return False, f"{url}: expected HTTP 200 within {timeout_s:g} s, found {last}"
        time.sleep(interval_s)


# NVLink multicast (NVLS) off for every rank a capture launches with torchrun, unless the
# environment says otherwise: on multi-GPU H200 hosts it fails or hangs (see docs/CAPTURE.md)
TORCHRUN_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def torchrun_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`TORCHRUN_SAFE_ENV` variables that ``environ`` (default: this process's) lacks."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in TORCHRUN_SAFE_ENV.items() if k not in env}


def _is_launcher(cmdline: Sequence[str]) -> bool:
    words = list(cmdline[:4])
    return bool(words) and (Path(words[0]).name == "torchrun" or "torch.distributed.run" in words
                            or any(Path(w).name == "torchrun" for w in words[1:2]))


def _proc_table() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every process /proc shows (empty where there is no /proc)."""
    out: dict[int, tuple[int, list[str]]] = {}
    root = Path("/proc")
    if not root.is_dir():
        return out
    for d in root.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        out[int(d.name)] = (ppid, [a.decode(errors="replace") for a in argv if a])
    return out


# a rank that is one of these (capture --profile-rank) is signalled in the program it runs: ncu
# 2025.3 on the H100 ran `/bin/sh .../ncu` -> `.../target/.../ncu` -> `TreeLauncherSubreaper` ->
# the program, and a SIGINT to any of the three did not reach the program
PROFILERS = ("ncu", "nsys", "TreeLauncherSubreaper")


def torchrun_ranks(root_pid: int) -> list[int]:
    """The pids of the processes a torchrun launcher at or below ``root_pid`` started; for a
    rank that is a profiler (``capture ncu --profile-rank``: ncu runs the rank's program as its
    child), the program's pid instead, so the program stops as the other ranks do and the
    profiler then writes its report and exits by itself."""
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _argv) in table.items():
        kids.setdefault(ppid, []).append(pid)
    ranks, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        below = kids.get(pid, [])
        if pid in table and _is_launcher(table[pid][1]):
            for rank in below:
                ranks += _through_profiler(rank, table, kids)
        else:
            todo += below
    return sorted(ranks)


def _is_profiler(argv: Sequence[str]) -> bool:
    """``ncu ...``, or a script named ncu run by its interpreter (``/bin/sh .../ncu ...``)."""
    return any(Path(w).name in PROFILERS for w in argv[:2])


def _through_profiler(pid: int, table: dict[int, tuple[int, list[str]]], kids: dict[int, list[int]]) -> list[int]:
    """``[pid]``, or for a profiler the programs it runs (through profilers that start profilers)."""
    if not _is_profiler(table.get(pid, (0, []))[1]) or not kids.get(pid):
        return [pid]
    return [p for kid in kids[pid] for p in _through_profiler(kid, table, kids)]


def _alive_pids(pids: Sequence[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            out.append(pid)
    return out


def stop_torchrun_ranks(proc: subprocess.Popen, grace_s: float) -> str | None:
    """Stop a torchrun server through its ranks, never through the launcher (module docstring):
    SIGINT to every rank, then, for ranks still running ``grace_s`` later, SIGTERM, then
    SIGKILL. Returns the last signal the ranks were sent, or None when no rank was found (the
    caller then stops the process group). ``proc`` (the launcher) has exited when this returns
    a signal, unless it outlived its own ranks by ``grace_s``."""
    ranks = torchrun_ranks(proc.pid)
    if not ranks:
        return None
    sent = None
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        alive = _alive_pids(ranks)
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        sent = sig.name
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    return sent


def stop_process_group(proc: subprocess.Popen, grace_s: float) -> str | None:
    """SIGINT, then SIGTERM, then SIGKILL to the group of ``proc`` (started with
    ``start_new_session``); returns the last signal sent, or None when it had already exited."""
    if proc.poll() is not None:
        return None
    sent = None
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        sent = sig.name
        try:
            proc.wait(timeout=grace_s if sig != signal.SIGKILL else None)
            break
        except subprocess.TimeoutExpired:
            continue
    return sent


def run_under_load(server_argv: Sequence[str], load_command: str | Sequence[str], *,
                   base_url: str | None = None, health_timeout_s: float = 120.0, grace_s: float = 10.0,
                   cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                   server_log: str | Path | None = None, load_timeout_s: float | None = None) -> LoadCapture:
    """Start the server, wait for health, run the load, stop the server (see the module docstring).

    ``base_url`` defaults to the load command's ``--url`` (else ``http://127.0.0.1:8000``).
    ``server_log``: file that receives the server's stdout and stderr (else they are inherited).
    ``load_timeout_s``: the load process is stopped (SIGINT, then SIGTERM/SIGKILL) after this long.
    """
    url = base_url or url_of(load_command)
    largv = load_argv(load_command)
    full_env = {**os.environ, **env} if env else None
    s_started, s_t0 = now_iso(), time.perf_counter_ns()
    try:
        # The child keeps its own copy of the log's file descriptor; ours closes at once.
        with open(server_log, "wb") if server_log is not None else contextlib.nullcontext() as log_fh:
            proc = subprocess.Popen(list(server_argv), cwd=cwd, env=full_env, start_new_session=True,
                                    stdout=log_fh, stderr=subprocess.STDOUT if log_fh else None)
    except OSError as e:
        err = f"{e.filename or server_argv[0]}: {e.strerror or e}"
        server = _record("server", server_argv, s_started, s_t0, 127, err, stop_signal=None)
        health = _record("health", ["GET", url + "/health"], now_iso(), time.perf_counter_ns(), None,
                         "not checked: the server did not start", waited_ns=0)
        load = _record("load", largv, now_iso(), time.perf_counter_ns(), None, "not run: the server did not start")
        return LoadCapture(server, health, load, url, False, err)
    health = load = None
    server_error: str | None = None
    stop_sig = None
    interrupted = False
    try:
        h_started, h_t0 = now_iso(), time.perf_counter_ns()
        healthy, why = wait_for_health(url, health_timeout_s, proc)
        health = _record("health", ["GET", url.rstrip("/") + "/health"], h_started, h_t0, None,
                         None if healthy else why, waited_ns=time.perf_counter_ns() - h_t0)
        l_started, l_t0 = now_iso(), time.perf_counter_ns()
        if not healthy:
            load = _record("load", largv, l_started, l_t0, None, "not run: the server never became healthy")
        else:
            load = _run_load_process(largv, l_started, l_t0, cwd, full_env, load_timeout_s, grace_s)
            interrupted = bool(load.pop("interrupted", False))
        if proc.poll() is not None:
            server_error = f"the server exited by itself with code {proc.returncode} before it was stopped"
    except KeyboardInterrupt:
        interrupted = True
    finally:
        t_stop = time.perf_counter_ns()
        stopped = "process group"
        stop_sig = None
        if proc.poll() is None and _is_launcher_argv(server_argv):
            stop_sig = stop_torchrun_ranks(proc, grace_s)
            stopped = "ranks"
        if stop_sig is None or proc.poll() is None:
            stop_sig = stop_process_group(proc, grace_s) or stop_sig
            stopped = "process group" if stop_sig else stopped
        stop_ns = time.perf_counter_ns() - t_stop
        if server_error is None and stop_sig == "SIGKILL":
            server_error = (f"the server's {stopped} ignored SIGINT and SIGTERM for {grace_s:g} s each: killed")
        elif server_error is None and proc.returncode not in (0, -signal.SIGINT, -signal.SIGTERM, 130, 143):
            server_error = f"exit code {proc.returncode} after {stop_sig} to its {stopped}"
        server = _record("server", server_argv, s_started, s_t0, proc.returncode, server_error,
                         stop_signal=stop_sig, stopped=stopped if stop_sig else None, stop_ns=stop_ns,
                         log=str(server_log) if server_log is not None else None)
        if health is None:  # interrupted during the health check
            health = _record("health", ["GET", url + "/health"], now_iso(), time.perf_counter_ns(), None,
                             "interrupted", waited_ns=0)
        if load is None:
            load = _record("load", largv, now_iso(), time.perf_counter_ns(), None, "interrupted")
    errors = [f"{r['name']}: {r['error']}" for r in (server, health, load) if r["error"]]
    return LoadCapture(server, health, load, url, not errors and not interrupted,
                       "; ".join(errors) or ("interrupted" if interrupted else None), interrupted)


def _is_launcher_argv(argv: Sequence[str]) -> bool:
    """Whether a server command starts torchrun (directly, or under ncu/nsys)."""
    return any(Path(w).name == "torchrun" or w == "torch.distributed.run" for w in argv)


def _run_load_process(argv: list[str], started: str, t0: int, cwd, env, timeout_s: float | None,
                      grace_s: float) -> dict[str, Any]:
    try:
        p = subprocess.Popen(argv, cwd=cwd, env=env)
    except OSError as e:
        return _record("load", argv, started, t0, 127, f"{argv[0]}: {e.strerror or e}")
    try:
        code = p.wait(timeout=timeout_s)
        err = None if code == 0 else f"exit code {code}"
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)  # tracestory load writes its records on SIGINT
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        code, err = p.returncode, f"stopped after --load-timeout {timeout_s:g} s (exit code {p.returncode})"
    except KeyboardInterrupt:
        # Ctrl-C at the capture: the load (same process group) got it too; let it write its
        # records, then report the interrupt.
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        return _record("load", argv, started, t0, p.returncode, f"interrupted (exit code {p.returncode})",
                       interrupted=True)
    return _record("load", argv, started, t0, code, err)
