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

Commands are recorded as the user would type them (final paths, not staging paths), and each
capture records ``invocation``: the ``tracestory capture`` command with every non-default
setting as a flag, which reproduces it whatever source (flag, env, file) set the values.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ToolNotFound, UsageError
from . import under_load as _load
from . import ncu as _ncu
from . import nsys as _nsys
from . import settings as _settings
from .environment import collect_environment, external_profiler
from .manifest import (Step, new_files, new_manifest, now_iso, read_manifest, run_step,
                       snapshot, write_manifest)
from .runner import build_argv as runner_argv
from .torch import TorchOptions
from .workload import Workload, parse_workload

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
    """Resolve settings and build every command of a capture; runs nothing."""
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
    steps: list[Step] = []
    if v.get("warmup_run"):
        steps.append(step("warmup-run", w.torchrun_argv(v["torchrun"]) if v.get("torchrun") else w.argv()))
    inv = invocation(tool, st, w)
    if tool == "torch":
        opts = torch_options(v)
        runner = ["-m", "tracestory.capture.runner", *runner_argv(sd, opts), "--", *w.target, *w.args]
        if v.get("torchrun"):
            steps.append(step("torch-profile", ["torchrun", f"--nproc_per_node={v['torchrun']}", *runner],
                              **prof_kw))
        elif server:
            steps.append(step("torch-profile", [w.python or sys.executable, *runner], **prof_kw))
        else:
            steps.append(Step("torch-profile", tuple(inv), tuple(inv), in_process=True))
    elif tool == "nsys":
        base = str(staging / name)
        steps.append(step("nsys-profile", _nsys.profile_argv(w, v, base, sd), **prof_kw))
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
    return CapturePlan(tool, name, folder, staging, final, w, st, tuple(steps), tuple(inv))


def check_tools(p: CapturePlan) -> None:
    """Raise ToolNotFound for the first program the plan needs and this machine lacks."""
    hints = {"nsys": _nsys.INSTALL_HINT, "ncu": _ncu.INSTALL_HINT, "torchrun": TORCHRUN_HINT}
    for s in p.steps:
        if s.in_process:
            try:
                import torch  # noqa: F401  (capture is one of the two places allowed to)
            except ImportError:
                raise ToolNotFound("torch", "install PyTorch (`pip install torch`) to capture "
                                   "with torch.profiler") from None
            continue
        exe = s.argv[0]
        if shutil.which(exe) is None:
            raise ToolNotFound(exe, hints.get(exe, f"`{exe}` (the workload's interpreter) is not on PATH"))


def _run_torch(p: CapturePlan) -> tuple[int, str | None]:
    from .torch import capture_in_process

    r = capture_in_process(p.workload, torch_options(p.values), p.staging)
    return r.exit_code, r.error


def _rank_errors(staging: Path) -> list[str]:
    """Errors the ranks of a runner reported in their status files (which are then removed)."""
    errors = []
    for sf in sorted(staging.glob("rank*.status.json")):
        try:
            data = json.loads(sf.read_text(encoding="utf-8"))
            if data.get("error"):
                errors.append(f"rank {data.get('rank')}: {data['error'].strip().splitlines()[-1]}")
        except (OSError, json.JSONDecodeError):
            errors.append(f"{sf.name}: unreadable status")
        sf.unlink()
    return errors


def execute(p: CapturePlan) -> CaptureResult:
    """Run the plan; write the manifest whatever happens; raise only for a missing tool."""
    check_tools(p)
    p.folder.mkdir(parents=True, exist_ok=True)
    if p.staging.exists():
        shutil.rmtree(p.staging)  # leftovers of an interrupted capture
    p.staging.mkdir()
    manifest = read_manifest(p.folder) or new_manifest(p.name)
    manifest["environment"] = collect_environment(p.workload.path)
    rec: dict[str, Any] = {
        "tool": p.tool, "folder": _display(p.folder), "status": "running", "started_at": now_iso(), "duration_ns": None,
        "invocation": list(p.invocation),
        "workload": {"argv": [p.workload.python or "python", *p.workload.target, *p.workload.args],
                     "cwd": os.getcwd(), "git": manifest["environment"].get("git")},
        "settings": _settings.to_manifest(p.settings),
        "external_profiler": external_profiler(),
        "steps": [],
    }
    t0 = time.perf_counter_ns()
    error: str | None = None
    interrupted: BaseException | None = None
    try:
        steps = list(p.steps)
        while steps:
            s = steps.pop(0)
            before = snapshot(p.staging)
            stopped_by_user = False
            if s.role == "server":
                records, stopped_by_user = _run_under_load(p, s, steps.pop(0))
            else:
                records = [run_step(s, in_process=(lambda: _run_torch(p)) if s.in_process else None)]
            rank_errors = _rank_errors(p.staging)
            _attribute_files(p, records, new_files(before, snapshot(p.staging)))
            sr = records[0]
            if rank_errors:   # what the workload's side reported says more than an exit code
                sr["status"] = "failed"
                sr["error"] = "; ".join(rank_errors + ([sr["error"]] if sr["error"] else []))
            rec["steps"].extend(records)
            failed = [r for r in records if r["status"] != "ok"]
            if failed:
                error = "; ".join(f"step {r['name']} failed: {r['error']}" for r in failed)
                if stopped_by_user:
                    interrupted = KeyboardInterrupt()   # re-raised once the manifest is written
                break
        # Under nsys/ncu the torch capture deliberately records nothing itself (no nested
        # CUPTI subscriber): the outer profiler holds the trace.
        if (error is None and p.tool == "torch" and rec["external_profiler"] is None
                and not list(p.staging.glob("rank*.trace.json.gz"))):
            error = "torch capture wrote no trace"
    except BaseException as e:  # KeyboardInterrupt too: never leave a half capture in place
        error = f"{type(e).__name__}: {e}"
        interrupted = e
    rec["duration_ns"] = time.perf_counter_ns() - t0
    files: list[tuple[str, int]] = []
    if error is None:
        old = p.folder / f".old-{p.tool}"
        if p.final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(p.final, old)
        os.replace(p.staging, p.final)
        shutil.rmtree(old, ignore_errors=True)
        files = [(f"{p.tool}/{k}", n) for k, n in snapshot(p.final).items()]
        rec["status"] = "complete"
    else:
        kept = _keep_failed(p)
        for sr in rec["steps"]:   # deleted with the staging folder, or moved to failed-<tool>/
            sr["files"] = [{**f, "path": f"{kept.name}/{f['path'].split('/', 1)[1]}"} for f in sr["files"]] if kept else []
        rec["status"], rec["error"] = "failed", error
        if kept is not None:
            rec["kept"] = _display(kept)
    manifest["captures"].append(rec)
    mpath = write_manifest(p.folder, manifest)
    if interrupted is not None and not isinstance(interrupted, Exception):
        raise interrupted
    return CaptureResult(p.tool, str(p.folder), rec["status"], tuple(files), str(mpath), error)


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
        entry = {"path": f"{p.tool}/{f}", "bytes": n}
        owner = next((r for r in records[1:] if any(a.endswith("/" + f) for a in r["argv"])), records[0])
        owner["files"].append(entry)


def capture(tool: str, workload_words: Sequence[str], **flags: Any) -> CaptureResult:
    """Library verb: ``capture("torch", ["python", "x.py"], range="BENCHMARK", skip=2)``."""
    config = flags.pop("config", None)
    return execute(plan(tool, workload_words, flags, config=config))
