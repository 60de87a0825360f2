"""One capture: plan the commands, run them into a staging folder, move it into place,
record everything in ``manifest.json``.

Layout: ``<out>/<name>/{torch,nsys,ncu}/...`` + ``<out>/<name>/manifest.json``. A capture runs
into ``<out>/<name>/.partial-<tool>/`` and only a capture whose every step exited 0 (and, for
torch, wrote a trace) is renamed to ``<out>/<name>/<tool>/`` (replacing an older one). A
failed capture leaves no ``<tool>/`` folder behind, only its failed steps in the manifest; a
missing tool raises :class:`~tracestory.errors.ToolNotFound` before anything is created.

With ``--load`` the workload is a server: its profiled step (the torch runner, ``nsys
profile`` or ``ncu``) is started, ``GET <url>/health`` is polled, the load command runs, and
the server is stopped with SIGINT (:mod:`.load`); the server, health and load records are all
steps of the capture. ``tracestory serve`` writes its scheduler log and ``tracestory load``
its records and summary into the tool folder (``serve.sched.jsonl``, ``load.requests.jsonl``,
``load.summary.json``), so ``tracestory report artifacts/<name>`` tells the batch story with
the trace of the same run.

A failed capture whose staging folder holds files (a partial trace, a load's records) keeps
them as ``<out>/<name>/failed-<tool>/``, named in the manifest; readers never take it for a
complete capture.

Surviving signals and crashes: every command, the profiled workload included, runs as a
supervised child in its own session (:mod:`.supervise`); the torch capture runs the workload
under ``python -m tracestory.capture.runner`` with this interpreter. The manifest is written
before anything runs and rewritten as each step starts and ends. A stop signal (Ctrl-C,
SIGTERM, SIGHUP) reaching the capture is forwarded to the child, whose profiler exports what
it holds; the capture then records the signal and exits 128 + its number (130 for Ctrl-C).
A torch capture whose every rank had written its complete trace (range, schedule) before a
stop signal is **complete** (``interrupted`` and ``note`` say so); a workload killed by a
signal (SIGSEGV, SIGABRT, SIGKILL) fails the capture, naming the signal, and the complete
traces written before it died are kept in ``failed-<tool>/`` (temporary files of an export cut
short are removed). Before anything starts, the workload is checked
(:func:`.workload.check_startable`: missing interpreter, script or module) and every folder
the capture creates or replaces is checked against its inputs
(:class:`tracestory.outputs.OutputPlan`).

GPU telemetry: while the steps run, this process samples NVML into ``<tool>/telemetry.jsonl``
(:mod:`tracestory.telemetry`; the capture's ``telemetry`` record says on or off and why); off
with ``--skip-power-monitor`` and always off for ncu. Telemetry cannot fail a capture: a sampler
whose readings fail, return bad values or whose thread stops leaves ``telemetry.incomplete``
("telemetry incomplete: <reason>") in the record, and the capture ends as its steps did. Its children run with
``TRACESTORY_SKIP_POWER_MONITOR=1``, so a workload that samples by default does not sample twice.

Commands are recorded as the user would type them (final paths, not staging paths), and each
capture records ``invocation``: the ``tracestory capture`` command with every non-default
setting as a flag, which reproduces it whatever source (flag, env, file) set the values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import telemetry
from ..errors import ToolNotFound, UsageError
from ..outputs import OutputPlan, ensure_folder, is_temporary
from ..units import plural
from . import under_load as _load
from . import ncu as _ncu
from . import nsys as _nsys
from . import settings as _settings
from .environment import collect_environment, external_profiler
from .manifest import (MANIFEST, Step, new_files, new_manifest, now_iso, read_manifest, run_step,
                       snapshot, write_manifest)
from .runner import build_argv as runner_argv
from .supervise import describe_exit, interrupts_raise, signal_of
from .torch import TorchOptions
from .workload import Workload, check_startable, parse_workload

TORCHRUN_HINT = "torchrun ships with PyTorch: install torch in the environment that runs the capture"


@dataclass(frozen=True)
class CapturePlan:
    tool: str
    name: str
    folder: Path                   # <out>/<name>
    staging: Path                  # <out>/<name>/.partial-<tool>
    final: Path                    # <out>/<name>/<tool>
    workload: Workload
    settings: Mapping[str, _settings.Setting]
    steps: tuple[Step, ...]
    invocation: tuple[str, ...]
    # what the tool's own options came to (nsys: the CUDA graph trace mode), for the manifest
    tool_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def values(self) -> dict[str, Any]:
        return _settings.values(self.settings)


@dataclass(frozen=True)
class CaptureResult:
    tool: str
    folder: str
    status: str                    # "complete" | "failed"
    files: tuple[tuple[str, int], ...]   # (path relative to folder, bytes)
    manifest_path: str
    error: str | None
    interrupted: str | None = None   # the stop signal that reached the capture ("SIGINT", ...)
    note: str | None = None          # e.g. a complete capture whose workload was then stopped

    @property
    def exit_code(self) -> int:
        """0 complete; 128 + signal when a stop signal failed it; 1 otherwise."""
        if self.status == "complete":
            return 0
        if self.interrupted:
            return 128 + _signum(self.interrupted)
        return 1


STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_HOST = socket.gethostname()


def _signum(name: str) -> int:
    import signal

    return int(getattr(signal, name, signal.SIGINT))


def _display(p: Path) -> str:
    """A path as the user would write it: relative to the current folder when inside it."""
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def torch_options(v: Mapping[str, Any]) -> TorchOptions:
    return TorchOptions(**{f.name: v.get(f.name) if v.get(f.name) is not None else f.default
                           for f in dataclasses.fields(TorchOptions)})


def invocation(tool: str, settings: Mapping[str, _settings.Setting], w: Workload) -> list[str]:
    """``tracestory capture <tool> [non-default settings as flags] -- <workload>``."""
    argv = ["tracestory", "capture", tool]
    for opt in _settings.options_for(tool):
        val = settings[opt.name].value
        if val == opt.default:
            continue
        flag = "--" + opt.name.replace("_", "-")
        if opt.type == "bool":
            argv.append(flag if val else "--no-" + opt.name.replace("_", "-"))
        elif opt.type == "list":
            argv += [flag, ",".join(val)]
        else:
            argv += [flag, str(val)]
    return argv + ["--", w.python or "python", *w.target, *w.args]


def plan(tool: str, workload_words: Sequence[str], flags: Mapping[str, Any], *,
         env: Mapping[str, str] | None = None, config: str | Path | None = None) -> CapturePlan:
    """Resolve settings and build every command of a capture; runs nothing (but ``nsys profile
    --help`` for an nsys capture: whether it can trace CUDA graph nodes)."""
    if tool not in _settings.TOOLS:
        raise UsageError(f"capture: expected one of {', '.join(_settings.TOOLS)}, found {tool!r}")
    w = parse_workload(workload_words)
    st = _settings.resolve(tool, flags, env=env, config=config)
    v = _settings.values(st)
    _settings.validate(tool, v)
    name = v.get("name") or w.stem
    if not name or "/" in name or name.startswith("."):
        raise UsageError(f"capture: expected an artifact name without '/' or leading '.', found {name!r}")
    folder = Path(v.get("out") or "artifacts") / name
    staging, final = folder / f".partial-{tool}", folder / tool
    sd, fd = str(staging), _display(final)

    def step(step_name: str, argv: list[str], stdout: str | None = None, **kw: Any) -> Step:
        shown = tuple(a.replace(sd, fd) for a in argv)
        if kw.get("env"):
            kw["env_shown"] = {k: x.replace(sd, fd) for k, x in kw["env"].items()}
        return Step(step_name, tuple(argv), shown, stdout,
                    stdout.replace(sd, fd) if stdout else None, **kw)

    server = v.get("load") is not None
    # The profiled step of a capture under load is the server: a subprocess we can stop.
    prof_kw: dict[str, Any] = ({"role": "server", "env": {_load.EVENT_LOG_ENV: str(staging / _load.SCHED_LOG)}}
                               if server else {})
    if v.get("torchrun") and _load.torchrun_env():    # NVLink multicast off for the ranks unless set
        prof_kw["env"] = {**prof_kw.get("env", {}), **_load.torchrun_env()}
    steps: list[Step] = []
    tool_options: dict[str, Any] = {}
    if v.get("warmup_run"):
        steps.append(step("warmup-run", w.torchrun_argv(v["torchrun"]) if v.get("torchrun") else w.argv()))
    inv = invocation(tool, st, w)
    if tool == "torch":
        opts = torch_options(v)
        if server:      # the range's export off the engine thread: the server keeps serving meanwhile
            opts = dataclasses.replace(opts, background_export=True)
        runner = ["-m", "tracestory.capture.runner", *runner_argv(sd, opts), "--", *w.target, *w.args]
        if v.get("torchrun"):
            steps.append(step("torch-profile", ["torchrun", f"--nproc_per_node={v['torchrun']}", *runner],
                              **prof_kw))
        elif server:
            steps.append(step("torch-profile", [w.python or sys.executable, *runner], **prof_kw))
        else:   # this interpreter, as the in-process capture it replaces used; shown as typed
            s = step("torch-profile", [sys.executable, *runner])
            steps.append(dataclasses.replace(s, shown=(w.python or "python", *s.shown[1:])))
    elif tool == "nsys":
        base = str(staging / name)
        graph_trace = _nsys.graph_trace_support()   # reads `nsys profile --help`; None without nsys
        tool_options = _nsys.graph_trace_options(graph_trace)[1]
        steps.append(step("nsys-profile", _nsys.profile_argv(w, v, base, sd, graph_trace), **prof_kw))
    else:
        base = str(staging / name)
        steps.append(step("ncu-profile", _ncu.profile_argv(w, v, base, sd), **prof_kw))
    if server:
        steps.append(step("load", _load.capture_load_argv(v["load"], staging), role="load"))
    if tool == "nsys":
        steps.append(step("nsys-export-sqlite", _nsys.export_argv(base)))
    elif tool == "ncu":
        rep = base + ".ncu-rep"
        steps.append(step("ncu-csv-raw", _ncu.import_argv(rep, "raw"), stdout=f"{base}_raw.csv"))
        steps.append(step("ncu-csv-details", _ncu.import_argv(rep, "details"),
                          stdout=f"{base}_details.csv"))
    return CapturePlan(tool, name, folder, staging, final, w, st, tuple(steps), tuple(inv),
                       tool_options)


def check_tools(p: CapturePlan) -> None:
    """Raise ToolNotFound for the first program the plan needs and this machine lacks."""
    hints = {"nsys": _nsys.INSTALL_HINT, "ncu": _ncu.INSTALL_HINT, "torchrun": TORCHRUN_HINT}
    if p.tool == "torch" and importlib.util.find_spec("torch") is None:
        raise ToolNotFound("torch", "install PyTorch (`pip install torch`) to capture with torch.profiler")
    for s in p.steps:
        # --profile-rank: torchrun starts ncu inside one rank (capture.one_rank)
        inside = [p.tool] if "tracestory.capture.one_rank" in s.argv else []
        for exe in (s.argv[0], *inside):
            if shutil.which(exe) is None:
                raise ToolNotFound(exe, hints.get(exe, f"`{exe}` (the workload's interpreter) is not on PATH"))


def check_workload(p: CapturePlan) -> None:
    """Refuse a workload that cannot start (missing interpreter, script or module), in one
    line, before anything is created. The torch capture's own child runs this interpreter."""
    runs_here = p.tool == "torch" and not p.values.get("torchrun") and p.values.get("load") is None
    check_startable(p.workload, interpreter=None if not runs_here or p.values.get("warmup_run")
                    else sys.executable)


def output_plan(p: CapturePlan, config: str | Path | None = None) -> OutputPlan:
    """The folders and the manifest this capture replaces, checked against its inputs (the
    workload's script, a settings file)."""
    if config is None and Path(_settings.CONFIG_FILE).is_file():
        config = _settings.CONFIG_FILE          # read by default when present
    inputs = [x for x in (p.workload.script, config) if x]
    plan = OutputPlan(inputs=inputs)
    for folder in (p.staging, p.final, p.folder / f"failed-{p.tool}", p.folder / f".old-{p.tool}"):
        plan.check_folder(folder, f"capture folder {folder.name}/")
    plan.check(p.folder / MANIFEST, "manifest")
    return plan


def _rank_statuses(staging: Path) -> list[dict[str, Any]]:
    """What each rank of a runner recorded in its status file (the files are then removed);
    an unreadable one is a status with an error."""
    out = []
    for sf in sorted(staging.glob("rank*.status.json")):
        try:
            data = json.loads(sf.read_text(encoding="utf-8"))
            out.append(data if isinstance(data, dict) else {"error": f"{sf.name}: not a JSON object"})
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            out.append({"error": f"{sf.name}: unreadable status"})
        sf.unlink(missing_ok=True)
    return out


def _profiler_blocked(record: dict[str, Any], statuses: list[dict[str, Any]]) -> None:
    """``profiler_blocked_s`` of a server step: per rank, the seconds the profiler's start and
    stop held the thread that runs the iterations (the engine's own stall, not the workload's)."""
    blocked = {str(st.get("rank")): {"start": st.get("start_blocked_s"), "stop": st.get("stop_blocked_s")}
               for st in statuses if st.get("start_blocked_s") is not None or st.get("stop_blocked_s") is not None}
    if blocked:
        record["profiler_blocked_s"] = blocked


def _rank_errors(statuses: list[dict[str, Any]]) -> list[str]:
    return [f"rank {st.get('rank')}: {str(st['error']).strip().splitlines()[-1]}"
            for st in statuses if st.get("error")]


def _judge_profiled_child(p: CapturePlan, sr: dict[str, Any], statuses: list[dict[str, Any]]) -> None:
    """Set the status and error of the torch capture's profiled step from its exit and the
    ranks' status files (see the module docstring)."""
    nranks = p.values.get("torchrun") or 1
    stop = sr.get("interrupted") or next((st["interrupted"] for st in statuses if st.get("interrupted")), None)
    killed = sr.get("signal")
    if killed in STOP_SIGNALS:
        stop, killed = stop or killed, None
    done = [st for st in statuses if st.get("complete") and st.get("trace_path") or
            (st.get("complete") and st.get("external_profiler"))]
    errors = _rank_errors(statuses)
    if killed:
        sr["status"] = "failed"
        kept = f"; complete traces written before: {len(done)} of {plural(nranks, 'rank')}" if done else ""
        sr["error"] = f"the workload was {describe_exit(sr['exit_code'])}{kept}"
    elif stop and len(done) == nranks and not errors:
        sr["status"], sr["error"], sr["stopped_by"] = "ok", None, stop
    elif stop:
        sr["status"] = "failed"
        sr["error"] = "; ".join(errors or [f"interrupted by {stop}"])
    elif errors:   # what the workload's side reported says more than an exit code
        sr["status"] = "failed"
        sr["error"] = "; ".join(errors + ([sr["error"]] if sr["error"] else []))


def execute(p: CapturePlan, *, config: str | Path | None = None) -> CaptureResult:
    """Run the plan; write the manifest first and whatever happens; raise (one line) only for
    a missing tool, a workload that cannot start, or an output that would replace an input."""
    check_tools(p)
    check_workload(p)
    output_plan(p, config)
    ensure_folder(p.folder)
    manifest = read_manifest(p.folder) or new_manifest(p.name)
    _recover_unfinished(p, manifest)
    rec: dict[str, Any] = {
        "tool": p.tool, "folder": _display(p.folder), "status": "running", "started_at": now_iso(), "duration_ns": None,
        "invocation": list(p.invocation),
        "workload": {"argv": [p.workload.python or "python", *p.workload.target, *p.workload.args],
                     "cwd": os.getcwd(), "git": None},
        "settings": _settings.to_manifest(p.settings),
        "external_profiler": external_profiler(),
        **({"tool_options": dict(p.tool_options)} if p.tool_options else {}),
        "pid": os.getpid(), "host": _HOST,
        "steps": [],
    }
    manifest["captures"].append(rec)
    t0 = time.perf_counter_ns()
    error: str | None = None
    interrupted: str | None = None

    def save() -> None:
        rec["duration_ns"] = time.perf_counter_ns() - t0
        write_manifest(p.folder, manifest)

    with interrupts_raise() as guard:
        try:
            p.staging.mkdir()
            save()                        # the manifest exists before anything runs
            manifest["environment"] = collect_environment(p.workload.path)
            rec["workload"]["git"] = manifest["environment"].get("git")
            save()
            with _telemetry(p, rec):
                error, interrupted = _run_steps(p, rec, save)
            # Under nsys/ncu the torch capture deliberately records nothing itself (no nested
            # CUPTI subscriber): the outer profiler holds the trace.
            if (error is None and p.tool == "torch" and rec["external_profiler"] is None
                    and not list(p.staging.glob("rank*.trace.json.gz"))):
                error = "torch capture wrote no trace"
        except KeyboardInterrupt as e:  # between steps: nothing runs, record it
            interrupted = signal_of(e)
            error = f"interrupted by {interrupted}"
        except Exception as e:  # never leave a half capture in place
            error = f"{type(e).__name__}: {e}"
        finally:
            guard.hold()                  # a second Ctrl-C waits until the manifest is written
        interrupted = guard.first or interrupted   # what reached the capture wins
        files, note = _finish(p, rec, error, interrupted)
        _telemetry_file(p, rec)
        save()
    return CaptureResult(p.tool, str(p.folder), rec["status"], tuple(files), str(p.folder / MANIFEST),
                         error, interrupted, note)


NCU_TELEMETRY_OFF = ("Nsight Compute capture: GPU telemetry is always off (the sampler would disturb ncu's "
                     "clock control and kernel replays)")


@contextlib.contextmanager
def _telemetry(p: CapturePlan, rec: dict[str, Any]):
    """GPU telemetry of a capture, sampled by this process while the steps run, into
    ``<staging>/telemetry.jsonl`` (moved with the tool folder). The children run with
    ``TRACESTORY_SKIP_POWER_MONITOR=1`` so that a ``tracestory serve``/``bench``/``load`` workload
    does not sample the same GPUs into the same folder. ``rec["telemetry"]`` says on or off and why."""
    if p.tool == "ncu":
        rec["telemetry"], on = {"status": "off", "reason": NCU_TELEMETRY_OFF}, False
    elif p.values.get("skip_power_monitor"):
        rec["telemetry"], on = {"status": "off", "reason": "--skip-power-monitor"}, False
    else:
        rec["telemetry"], on = {"status": "on"}, True
    why: list[str] = []
    sampler = None
    try:
        with telemetry.maybe_sampler(p.staging / telemetry.FILE_NAME, enabled=on, label=f"capture {p.tool}",
                                     why=why) as sampler:
            if sampler is None and on:
                rec["telemetry"] = {"status": "off", "reason": why[0] if why else "unavailable"}
            elif sampler is not None:
                rec["telemetry"].update(rate_hz=sampler.rate_hz, gpus=len(sampler.devices),
                                        sampled_by="the capture process")
            old = os.environ.get(telemetry.SKIP_ENV)
            os.environ[telemetry.SKIP_ENV] = "1"        # for the children, once this process samples
            try:
                yield sampler
            finally:
                if old is None:
                    os.environ.pop(telemetry.SKIP_ENV, None)
                else:
                    os.environ[telemetry.SKIP_ENV] = old
    finally:
        # a failing sampler never fails the capture (telemetry.Sampler.stop does not raise): it is
        # recorded, and the capture ends as its steps did
        reason = sampler.incomplete_reason if sampler is not None else None
        if reason is not None:
            rec["telemetry"]["incomplete"] = reason
            print(f"GPU {reason}", file=sys.stderr, flush=True)


def _telemetry_file(p: CapturePlan, rec: dict[str, Any]) -> None:
    """Where the capture's telemetry.jsonl ended up (tool folder, or failed-<tool>/)."""
    t = rec.get("telemetry")
    if not t or t.get("status") != "on":
        return
    for folder in (p.final, p.folder / f"failed-{p.tool}"):
        f = folder / telemetry.FILE_NAME
        if f.is_file() and (folder == p.final) == (rec["status"] == "complete"):
            t["file"] = f"{folder.name}/{telemetry.FILE_NAME}"
            t["bytes"] = f.stat().st_size


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _recover_unfinished(p: CapturePlan, manifest: dict[str, Any]) -> None:
    """A capture of this tool recorded as running whose process is gone (killed, machine
    stopped): mark it failed and keep its staging folder as failed-<tool>/. One still running
    is refused: two captures cannot share a staging folder."""
    recovered = []
    for old in manifest["captures"]:
        if old.get("tool") != p.tool or old.get("status") != "running":
            continue
        if _alive(old.get("pid")) and old.get("host", _HOST) == _HOST:
            raise UsageError(f"{_display(p.folder)}: expected no other {p.tool} capture running into it, "
                             f"found process {old['pid']} (started {old.get('started_at')})")
        for st in old.get("steps") or []:
            if st.get("status") == "running":
                st.update(status="failed", error="the capture process ended during this step")
        old["status"] = "failed"
        old["error"] = (f"the capture process ({old.get('pid')}) ended before it finished "
                        "(killed, or its machine stopped); found by the next capture")
        recovered.append(old)
    if p.staging.exists():
        _remove_temporaries(p.staging)
        for sf in p.staging.glob("rank*.status.json"):
            sf.unlink(missing_ok=True)
        kept = _keep_failed(p)
        if kept is not None and recovered:
            recovered[-1]["kept"] = _display(kept)


def _run_steps(p: CapturePlan, rec: dict[str, Any], save) -> tuple[str | None, str | None]:
    """Run the steps in order, recording each before and after it runs; stop at the first
    failure or interrupt. Returns (error, interrupting signal)."""
    steps = list(p.steps)
    grace = float(p.values.get("stop_timeout") or 120)
    while steps:
        s = steps.pop(0)
        before = snapshot(p.staging)
        rec["steps"].append({"name": s.name, "argv": list(s.shown), "command": s.command,
                             "status": "running", "started_at": now_iso(), "files": []})
        save()
        if s.role == "server":
            records, stopped_by_user = _run_under_load(p, s, steps.pop(0))
            interrupted = "SIGINT" if stopped_by_user else None   # the exact signal: execute()'s guard
            statuses = _rank_statuses(p.staging)
            _profiler_blocked(records[0], statuses)
            errors = _rank_errors(statuses)
            if errors:
                sr = records[0]
                sr["status"] = "failed"
                sr["error"] = "; ".join(errors + ([sr["error"]] if sr["error"] else []))
        else:
            records = [run_step(s, grace_s=grace)]
            interrupted = records[0].get("interrupted")
            statuses = _rank_statuses(p.staging)
            if s.name == "torch-profile":
                _judge_profiled_child(p, records[0], statuses)
            elif interrupted and records[0]["status"] == "ok":   # e.g. nsys writing its report on SIGINT
                records[0]["status"] = "failed"
                records[0]["error"] = f"interrupted by {interrupted} (exit code {records[0]['exit_code']})"
            else:
                errors = _rank_errors(statuses)
                if errors:
                    records[0]["status"] = "failed"
                    records[0]["error"] = "; ".join(errors + [records[0]["error"] or ""]).rstrip("; ")
        _attribute_files(p, records, new_files(before, snapshot(p.staging)))
        rec["steps"][-1:] = records
        save()
        failed = [r for r in records if r["status"] != "ok"]
        if failed:
            return "; ".join(f"step {r['name']} failed: {r['error']}" for r in failed), interrupted
        stopped = next((r["stopped_by"] for r in records if r.get("stopped_by")), None)
        if interrupted or stopped:
            return None, interrupted or stopped
    return None, None


def _finish(p: CapturePlan, rec: dict[str, Any], error: str | None,
            interrupted: str | None) -> tuple[list[tuple[str, int]], str | None]:
    """Move the staging folder into place (or keep it as failed-<tool>/) and complete the
    capture's record."""
    _remove_temporaries(p.staging)
    files: list[tuple[str, int]] = []
    note = None
    if rec["steps"] and rec["steps"][-1].get("status") == "running":   # stopped mid-step
        rec["steps"][-1].update(status="failed", error=f"interrupted by {interrupted}" if interrupted else "stopped")
    if interrupted:
        rec["interrupted"] = interrupted
    if error is None:
        old = p.folder / f".old-{p.tool}"
        if p.final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(p.final, old)
        os.replace(p.staging, p.final)
        shutil.rmtree(old, ignore_errors=True)
        files = [(f"{p.tool}/{k}", n) for k, n in snapshot(p.final).items()]
        rec["status"] = "complete"
        if interrupted:
            note = (f"the workload was stopped by {interrupted} after the capture had completed: "
                    "the trace is complete")
            rec["note"] = note
    else:
        kept = _keep_failed(p)
        for sr in rec["steps"]:   # deleted with the staging folder, or moved to failed-<tool>/
            sr["files"] = ([{**f, "path": f"{kept.name}/{f['path'].split('/', 1)[1]}"} for f in sr.get("files") or []]
                           if kept else [])
        rec["status"], rec["error"] = "failed", error
        if kept is not None:
            rec["kept"] = _display(kept)
    return files, note


def _remove_temporaries(folder: Path) -> None:
    """Temporary files of a write cut short (a trace being exported when the child died)."""
    if folder.is_dir():
        for f in folder.rglob(".tmp-*"):
            if f.is_file() and is_temporary(f.name):
                f.unlink(missing_ok=True)


def _keep_failed(p: CapturePlan) -> Path | None:
    """A failed capture's files as ``failed-<tool>/`` (replacing an older one); None when the
    staging folder held nothing."""
    if not snapshot(p.staging):
        shutil.rmtree(p.staging, ignore_errors=True)
        return None
    kept = p.folder / f"failed-{p.tool}"
    shutil.rmtree(kept, ignore_errors=True)
    os.replace(p.staging, kept)
    return kept


def _run_under_load(p: CapturePlan, server: Step, load: Step) -> tuple[list[dict[str, Any]], bool]:
    """The server step, its health check and the load step (:func:`.load.run_under_load`), as
    manifest records showing final paths, and whether a Ctrl-C stopped them."""
    v = p.values
    lc = _load.run_under_load(server.argv, load.argv, base_url=_load.url_of(v["load"]),
                              health_timeout_s=v["health_timeout"], grace_s=v["stop_timeout"],
                              env=server.env)
    for r, s in ((lc.server, server), (lc.load, load)):
        r.update(name=s.name, role=s.role, argv=list(s.shown), command=s.command,
                 env=dict(s.env_display))
    lc.health["role"] = "health"
    return [lc.server, lc.health, lc.load], lc.interrupted


def _attribute_files(p: CapturePlan, records: list[dict[str, Any]], files: list[tuple[str, int]]) -> None:
    """New files go to the record whose argv names them (the load's outputs), else to the first."""
    for r in records:
        r["files"] = []
    for f, n in files:
        if f == telemetry.FILE_NAME:     # the capture's own file, recorded in the capture's "telemetry"
            continue
        entry = {"path": f"{p.tool}/{f}", "bytes": n}
        owner = next((r for r in records[1:] if any(a.endswith("/" + f) for a in r["argv"])), records[0])
        owner["files"].append(entry)


def capture(tool: str, workload_words: Sequence[str], **flags: Any) -> CaptureResult:
    """Library verb: ``capture("torch", ["python", "x.py"], range="BENCHMARK", skip=2)``."""
    config = flags.pop("config", None)
    return execute(plan(tool, workload_words, flags, config=config), config=config)
