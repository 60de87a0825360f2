"""The re-audit's runner and judge: run one case as a new user would (the ``tracestory`` command
line, its own working folder, stdin empty) and classify what happened.

Model. A :class:`Case` is a command line plus what the judge needs to know about it: the files
it reads (hashed before and after: an input overwritten is a failure), the files it may write
(present after a failed run: a partial output), whether its input was damaged on purpose (exit 0
then needs the damage stated on the terminal or numbers that agree with a second reading), and
whether an output flag was ``-`` (stdout must then hold only the data). Each case runs in a fresh
process: by default a child forked from a worker that imported tracestory once (start-up cost
paid once per worker, not per case; the child calls ``tracestory.cli.main`` exactly as
``python -m tracestory.cli`` does and exits with its code), or with ``subprocess=True`` a real
``python -m tracestory.cli`` (slower, for checking that the fork changes nothing; the cases run as
uid 65534 stay forked, since that user cannot start an interpreter installed under /root).

Outcomes: ``refused`` (exit 2 and one line on stderr), ``done`` (exit 0), ``done-stated``
(exit 0, a ``warning`` line on stderr), ``failed-1`` (exit 1 where the case allows it: a gate,
a load whose requests failed) and the failures ``traceback``, ``exit-code`` (not 0/1/2/130, or
1 where 1 is not an answer), ``timeout``, ``silent-wrong``, ``input-overwritten``,
``partial-output``, ``stdout-mixed`` (status text or non-data on stdout with ``-``),
``not-one-line`` (exit 2 with no single line naming what was wrong).

Limits: a byte changed inside a valid number cannot be told from a real value by any reader;
such a case counts as done when the second reading agrees (it reads the damaged file as written).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAILURES = ("traceback", "exit-code", "timeout", "silent-wrong", "input-overwritten", "partial-output",
            "stdout-mixed", "not-one-line")
OK = ("refused", "done", "done-stated", "failed-1")
CAP = 64 * 1024   # bytes of stdout/stderr kept per case


@dataclasses.dataclass
class Case:
    """One command line and what the judge checks about it (see the module docstring)."""

    cls: str                          # inputs, outputs, subcommands, server, load/telemetry
    name: str                         # unique, readable: reader/damage/command
    argv: list[str]                   # after ``tracestory``
    inputs: list[str] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)
    damaged: bool = False             # the input was damaged on purpose
    must_state: bool = False          # exit 0 must state it (empty data, missing fields, 0 ns, ...)
    reference: str | None = None      # key of the pristine case whose numbers a damaged run is held to
    second: tuple[int, int] | None = None   # (kernels, ns) by a plain reading of the damaged file
    json_out: str | None = None       # the run's --json file (numbers, warnings)
    dash: str | None = None           # "json", "text" or "gzip": what stdout must hold (an output flag was -)
    allow_1: bool = False             # exit 1 is an answer here (gates, failed requests)
    stdout_path: str | None = None    # stdout goes here (e.g. /dev/full), not to a capture file
    as_nobody: bool = False           # run as uid 65534 (permission cases; root ignores chmod)
    timeout_s: float = 60.0
    prepare: list = dataclasses.field(default_factory=list)   # ops run in the case folder first
    expect_refusal: bool = False      # exit 0 is wrong here (an output naming an input, one file for two flags)
    must_write: list = dataclasses.field(default_factory=list)   # on exit 0 each is a file ("" never is)


def _hash(path: str) -> str | None:
    p = Path(path)
    try:
        if p.is_dir():
            h = hashlib.sha256()
            for f in sorted(p.rglob("*")):
                if f.is_file() and not f.is_symlink():
                    h.update(str(f.relative_to(p)).encode() + hashlib.sha256(f.read_bytes()).digest())
            return h.hexdigest()
        if p.is_file():
            return hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"
    return None


def _state(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _prepare(ops: list, cwd: Path) -> None:
    """Set-up operations, relative to the case folder: ("mkdir", p), ("write", p, text),
    ("fifo", p), ("symlink", target, p), ("hardlink", target, p), ("chmod", p, mode)."""
    for op in ops:
        kind, *args = op
        paths = [Path(a) if os.path.isabs(a) else cwd / a for a in args if isinstance(a, str)]
        if kind == "mkdir":
            paths[0].mkdir(parents=True, exist_ok=True)
        elif kind == "write":
            paths[0].parent.mkdir(parents=True, exist_ok=True)
            paths[0].write_text(args[1])
        elif kind == "fifo":
            os.mkfifo(paths[0])
        elif kind == "symlink":
            os.symlink(args[0], paths[1])
        elif kind == "hardlink":
            os.link(paths[0], paths[1])
        elif kind == "chmod":
            os.chmod(paths[0], args[1])


def preload(warm: list[list[str]] = ()) -> None:
    """Import what every analysis command needs, once per worker: run ``warm`` (command lines on
    pristine files) here, output thrown away, so that the lazy imports are done before a case
    runs (a case run as uid 65534 cannot read an interpreter installed under /root)."""
    import tracestory.analysis.results  # noqa: F401
    import tracestory.cli  # noqa: F401
    import tracestory.cli.story  # noqa: F401
    import tracestory.ingest  # noqa: F401
    import tracestory.render.build  # noqa: F401
    from tracestory.cli import main
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for argv in warm:
            os.dup2(null, 1)
            os.dup2(null, 2)
            try:
                main(argv)
            except BaseException:   # noqa: BLE001 (warming only; the cases judge)
                pass
    finally:
        sys.stdout.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(null)


def _child(case: Case, cwd: Path, out: Path, err: Path) -> None:
    """In the forked child: become a fresh ``tracestory`` process and exit with its code."""
    code = 1
    try:
        os.setsid()
        os.chdir(cwd)
        fd0 = os.open(os.devnull, os.O_RDONLY)
        fd1 = os.open(case.stdout_path or out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        fd2 = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        os.dup2(fd0, 0)
        os.dup2(fd1, 1)
        os.dup2(fd2, 2)
        if case.as_nobody:
            os.setgid(65534)
            os.setuid(65534)
        sys.argv = ["tracestory", *case.argv]
        from tracestory.cli import main
        try:
            code = main(case.argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
        except BaseException:
            print("Exception ignored while flushing sys.stdout", file=sys.stderr)
            code = 120
        sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) else 1)


def _wait(pid: int, timeout_s: float) -> tuple[int, bool]:
    """(exit code as the shell shows it, timed out) of a forked child."""
    deadline = time.monotonic() + timeout_s
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            _, status = os.waitpid(pid, 0)
            return 137, True
        if fd is not None:
            select.select([fd], [], [], min(left, 1.0))
        else:
            time.sleep(0.01)
    if fd is not None:
        os.close(fd)
    try:
        os.killpg(pid, signal.SIGKILL)   # workers it left behind (ranks' pool)
    except OSError:
        pass
    return (os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)), False


def run_case(case: Case, root: str, use_subprocess: bool = False) -> dict:
    """Run ``case`` in ``root``/<index folder> and return its raw record (judged by :func:`judge`)."""
    cwd = Path(root) / case.name.replace("/", "__")
    cwd.mkdir(parents=True, exist_ok=True)
    os.chmod(cwd, 0o777)
    _prepare(case.prepare, cwd)
    out, err = cwd / ".stdout", cwd / ".stderr"
    before_in = {p: _hash(p if os.path.isabs(p) else str(cwd / p)) for p in case.inputs}
    before_out = {p: _state(p if os.path.isabs(p) else str(cwd / p)) for p in case.outputs}
    t0 = time.monotonic()
    if use_subprocess and not case.as_nobody:   # uid 65534 cannot start an interpreter under /root: forked
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        pre = None
        with open(os.devnull) as fin, open(case.stdout_path or out, "wb") as fo, open(err, "wb") as fe:
            try:
                r = subprocess.run([sys.executable, "-m", "tracestory.cli", *case.argv], cwd=cwd, stdin=fin,
                                   stdout=fo, stderr=fe, env=env, timeout=case.timeout_s, preexec_fn=pre,
                                   start_new_session=True)
                code, timed_out = r.returncode, False
            except subprocess.TimeoutExpired:
                code, timed_out = 137, True
    else:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(case, cwd, out, err)
        code, timed_out = _wait(pid, case.timeout_s)
    secs = time.monotonic() - t0
    read = lambda p: p.read_bytes()[:CAP] if p.exists() else b""   # noqa: E731
    rec = {"name": case.name, "cls": case.cls, "code": code, "timed_out": timed_out, "secs": round(secs, 3),
           "stdout": read(out).decode("utf-8", "replace") if not case.stdout_path else "",
           "stdout_raw_head": read(out)[:4].hex() if not case.stdout_path else "",
           "stderr": read(err).decode("utf-8", "replace"),
           "inputs_changed": [p for p in case.inputs
                              if _hash(p if os.path.isabs(p) else str(cwd / p)) != before_in[p]],
           "outputs_after": {p: (_state(p if os.path.isabs(p) else str(cwd / p)) != before_out[p])
                             for p in case.outputs},
           "dash_file": (cwd / "-").exists(), "numbers": None, "warnings": None,
           "not_written": [p for p in case.must_write   # os.path, not Path: "out/" must be a folder's path
                           if not p or not os.path.isfile(p if os.path.isabs(p) else os.path.join(cwd, p))]}
    if case.json_out and code == 0:
        jp = Path(case.json_out if os.path.isabs(case.json_out) else cwd / case.json_out)
        try:
            doc = json.loads(jp.read_text())
            rec["numbers"] = [sum(t["gpu"]["kernel_count"] for t in doc["traces"]),
                              sum(t["gpu"]["kernel_time_ns"] for t in doc["traces"])]
            if not doc["traces"] and doc.get("batching"):   # a serving run alone: its story's numbers
                rec["numbers"] = hashlib.sha256(json.dumps(doc["batching"], sort_keys=True).encode()).hexdigest()[:16]
            rec["warnings"] = sum(len(t["source"].get("warnings") or ())
                                  + len((t["source"].get("extra") or {}).get("warnings") or ()) for t in doc["traces"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return rec


def _stated(err: str) -> bool:
    return any("warning" in ln.lower() for ln in err.splitlines())


def judge(case: Case, rec: dict, refs: dict[str, dict]) -> tuple[str, str]:
    """(outcome, why) of one case: one of :data:`OK` or :data:`FAILURES`."""
    code, err = rec["code"], rec["stderr"]
    if rec["timed_out"]:
        return "timeout", f"over {case.timeout_s:.0f} s"
    if "Traceback (most recent call last)" in err:
        return "traceback", err.strip().splitlines()[-1][:200]
    if rec["inputs_changed"]:
        return "input-overwritten", ", ".join(rec["inputs_changed"])
    if code not in (0, 1, 2, 130) or (code == 1 and not case.allow_1):
        return "exit-code", f"exit {code}: {err.strip()[-200:]}"
    if code != 0:
        changed = [p for p, ch in rec["outputs_after"].items() if ch]
        if changed:
            return "partial-output", f"exit {code} but wrote {', '.join(changed)}"
    if rec["dash_file"]:
        return "stdout-mixed", "a file named '-' was written"
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip() and "warning" not in ln.lower()]
        errors = [ln for ln in lines if ln.startswith("tracestory") and ": error: " in ln]
        if len(errors) == 1 and not any("Traceback" in ln for ln in lines):
            lines = errors            # argparse's usage, or a status note printed before the error
        if len(lines) != 1:
            return "not-one-line", f"{len(lines)} lines: {err.strip()[:200]}"
        return "refused", lines[0][:200]
    if code == 1:
        return "failed-1", (err.strip().splitlines() or [""])[-1][:200]
    if case.expect_refusal:
        return "silent-wrong", "exit 0 where the command must refuse (an output naming an input or another output)"
    if rec.get("not_written"):
        return "silent-wrong", f"exit 0 but {', '.join(repr(p) for p in rec['not_written'])} not written as a file"
    if case.dash and case.stdout_path is None:
        bad = _dash_problem(case.dash, rec)
        if bad:
            return "stdout-mixed", bad
    stated = _stated(err)
    if case.damaged and not stated:
        if case.must_state:
            return "silent-wrong", "exit 0, damage of a kind that must be stated, no warning line"
        ref = refs.get(case.reference or "")
        nums = rec.get("numbers")
        if nums is not None and ref is not None and ref.get("numbers") == nums:
            return "done", "numbers as the undamaged file's"
        if nums is not None and case.second is not None and list(case.second) == nums:
            return "done", "numbers as a plain reading of the damaged file"
        if nums is None and ref is None:
            return "done", "no numbers to hold to (no reference)"
        return "silent-wrong", f"exit 0, no warning; numbers {nums} vs undamaged {ref and ref.get('numbers')} " \
                               f"and plain reading {case.second}"
    return ("done-stated", "warning on stderr") if stated else ("done", "")


def _dash_problem(kind: str, rec: dict) -> str | None:
    out = rec["stdout"]
    if kind == "gzip":
        return None if rec["stdout_raw_head"].startswith("1f8b") else "stdout is not the gzip data"
    if kind == "json":
        try:
            json.loads(out)
        except ValueError:
            if len(out) >= CAP:
                return None
            return f"stdout is not one JSON document: {out[:120]!r}"
        return None
    for marker in ("wrote ", "written to", "tracestory:"):
        if marker in out:
            return f"status text on stdout: {marker!r}"
    return None
