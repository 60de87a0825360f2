"""The report's Environment, Actions Log and Reproduction Guide bodies, from a capture
``manifest.json`` (see :mod:`tracestory.capture.manifest`).

Each function returns a section BODY (no ``## `` heading line). Everything shown is read from
the manifest; a value it lacks is ``n/a`` with the reason, never a guess. Output is a pure
function of the manifest (same manifest, same bytes): times are the recorded ones, never
"now". Units are chosen here, at display time (bytes -> KiB/MiB/GiB, ns -> ms/s).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from ..units import fmt_bytes, fmt_ns

NA = "n/a"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # nvidia-smi underlines the topology header


def _v(value: Any, why: str = "not recorded") -> str:
    return NA + f" ({why})" if value in (None, "") else str(value)


def _fence(text: str, lang: str = "") -> list[str]:
    # A fence longer than any backtick run inside keeps the block closed.
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return [ticks + lang, text.rstrip("\n"), ticks]


def _gpu_line(gpus: list[Mapping[str, Any]]) -> str:
    if not gpus:
        return NA + " (no CUDA GPU visible to torch.cuda or nvidia-smi at capture time)"
    groups: dict[tuple, int] = {}
    for g in gpus:
        key = (g.get("name"), g.get("compute_capability"), g.get("memory_bytes"), g.get("sm_count"))
        groups[key] = groups.get(key, 0) + 1
    parts = []
    for (name, cc, mem, sms), n in groups.items():
        detail = [f"compute capability {_v(cc)}", f"{fmt_bytes(mem)} memory"]
        if sms:
            detail.append(f"{sms} SMs")
        parts.append(f"{n} x {_v(name)} ({', '.join(detail)})")
    return "; ".join(parts)


def _git_line(git: Mapping[str, Any] | None) -> str:
    git = git or {}
    if not git.get("repo"):
        return NA + " (the workload is not in a git repository)"
    where = git.get("remote") or git["repo"]
    if not git.get("commit"):
        return f"{where} ({NA}: the repository had no commit)"
    dirty = " + uncommitted changes" if git.get("dirty") else ""
    return f"{where} @ {git['commit']}{dirty}"


def render_environment(manifest: Mapping[str, Any]) -> str:
    env = manifest.get("environment") or {}
    gpus = env.get("gpus") or []
    rows = [
        ("GPU", _gpu_line(gpus)),
        ("GPUs on the machine", str(env.get("gpu_count", len(gpus)))),
        ("Driver", _v(env.get("driver_version"), "nvidia-smi not available")),
        ("CUDA runtime (torch)", _v(env.get("cuda_runtime"), "CPU-only torch build or no torch")),
        ("cuDNN", _v(env.get("cudnn"))),
        ("PyTorch", _v(env.get("torch"), "not installed")),
        ("Triton", _v(env.get("triton"), "not installed")),
        ("Python", _v(env.get("python"))),
        ("Nsight Systems", _v(env.get("nsys_version"), "nsys not on PATH")),
        ("Nsight Compute", _v(env.get("ncu_version"), "ncu not on PATH")),
        ("tracestory", _v(env.get("tracestory"), "not installed as a package; run from source")),
        ("Host", f"{_v(env.get('hostname'))} ({_v(env.get('os'))})"),
        ("Workload repository", _git_line(env.get("git"))),
    ]
    lines = ["Recorded by `tracestory capture` in `manifest.json`.", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]
    lines.append("")
    topo = env.get("topology")
    if topo:
        lines += ["GPU topology (`nvidia-smi topo -m`):", ""]
        lines += _fence(_ANSI.sub("", topo), "text")
    else:
        lines.append(f"GPU topology: {NA} (`nvidia-smi topo -m` was not available).")
    return "\n".join(lines) + "\n"


def _settings_lines(settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    chosen = [(k, s) for k, s in settings.items() if s.get("source") != "default"]
    if not chosen:
        return ["Settings: all at their defaults."]
    out = ["Settings (value, where it came from):", ""]
    for k, s in chosen:
        out.append(f"- `{k}` = `{s.get('value')}` ({s.get('source')})")
    return out


def _files_lines(files: Iterable[Mapping[str, Any]]) -> list[str]:
    files = list(files)
    if not files:
        return []
    return ["Output files:", ""] + [f"- `{f['path']}` ({fmt_bytes(f.get('bytes'))})" for f in files]


def render_actions_log(manifest: Mapping[str, Any]) -> str:
    captures = manifest.get("captures") or []
    if not captures:
        return f"{NA}: the manifest records no capture.\n"
    lines: list[str] = []
    for i, cap in enumerate(captures, 1):
        status = cap.get("status", NA)
        lines += [f"### Phase {i}: capture with {cap.get('tool', '?')} ({status})", ""]
        lines.append(
            f"Started {_v(cap.get('started_at'))}, took {fmt_ns(cap.get('duration_ns'))}; "
            f"working folder `{_v(cap.get('workload', {}).get('cwd'))}`."
        )
        if cap.get("external_profiler"):
            lines.append(
                f"Ran under {cap['external_profiler']}: torch.profiler was not started "
                "(no nested profilers); the outer profiler holds the trace."
            )
        lines.append("")
        lines += _settings_lines(cap.get("settings") or {})
        lines.append("")
        for j, step in enumerate(cap.get("steps") or [], 1):
            how = _ROLE.get(step.get("role"), "") or (
                " (in-process: tracestory runs the workload under torch.profiler)" if step.get("in_process") else ""
            )
            lines += [f"**Action {i}.{j}: {step.get('name')}**{how}", ""]
            lines += _fence(step.get("command") or " ".join(step.get("argv") or []), "bash")
            lines.append(
                f"Started {_v(step.get('started_at'))}, took {fmt_ns(step.get('duration_ns'))}, {_step_result(step)}."
            )
            if step.get("status") != "ok" and step.get("error"):
                err = str(step["error"]).strip().splitlines()[-1]
                lines.append(f"Failed: {err}")
            lines.append("")
            fl = _files_lines(step.get("files") or [])
            if fl:
                lines += fl + [""]
        if status != "complete":
            kept = (
                f"its partial output was kept apart in `{cap['kept']}`"
                if cap.get("kept")
                else "its partial output was discarded"
            )
            lines += [
                f"Capture failed ({_v(cap.get('error'))}); {kept}, no `{cap.get('tool')}/` folder was written by it.",
                "",
            ]
    lines += _modifications((manifest.get("environment") or {}).get("git"))
    return "\n".join(lines).rstrip("\n") + "\n"


_ROLE = {
    "server": " (the server, profiled; stopped after the load)",
    "health": " (wait until the server answers)",
    "load": " (the load against the server)",
}


def _step_result(step: dict) -> str:
    if step.get("role") == "health":
        return "answered HTTP 200" if step.get("status") == "ok" else "no HTTP 200"
    result = f"exit code {step['exit_code']}" if step.get("exit_code") is not None else NA
    if step.get("stop_signal"):
        result = f"stopped with {step['stop_signal']}, {result}"
    return result


DIFF_LINES_SHOWN = 400


def _modifications(git: Mapping[str, Any] | None) -> list[str]:
    """The workload repository's state at capture time: unmodified, or the diff and new files."""
    git = git or {}
    if not git.get("repo"):
        return []
    out = ["### Modifications", ""]
    untracked = git.get("untracked") or []
    if not git.get("commit"):
        return out + [
            "Code diff: n/a: the workload repository had no commit at capture time, so there "
            "is no base to diff against.",
            "",
        ]
    if git.get("dirty") is False and not untracked:
        files = "no untracked files" if "untracked" in git else "untracked files not recorded"
        return out + [
            f"Unmodified: the workload repository was at commit {git['commit']} with no uncommitted changes ({files}).",
            "",
        ]
    diff = git.get("diff")
    if git.get("dirty") and diff is None:
        out += [
            "Code diff: n/a: the workload repository had uncommitted changes, but this capture's "
            "manifest holds no diff of them (captured before tracestory recorded diffs).",
            "",
        ]
    elif diff:
        body = diff.rstrip("\n").splitlines()
        note = ""
        if len(body) > DIFF_LINES_SHOWN or git.get("diff_truncated"):
            note = (
                f"(first {min(len(body), DIFF_LINES_SHOWN)} lines shown; the full diff is in the "
                "manifest's environment.git.diff" + (", itself capped" if git.get("diff_truncated") else "") + ")"
            )
        out += [f"Uncommitted changes against {_v(git.get('commit'))} at capture time:", ""]
        out += _fence("\n".join(body[:DIFF_LINES_SHOWN]), "diff")
        if note:
            out.append(note)
        out.append("")
    if untracked:
        n = git.get("untracked_count", len(untracked))
        out += [
            f"Untracked files in the repository ({n}; new files are not in the diff): "
            + ", ".join(f"`{f}`" for f in untracked[:20])
            + (f", and {n - 20} more" if n > 20 else "")
            + ".",
            "",
        ]
    return out


def _folder(manifest: Mapping[str, Any], cap: Mapping[str, Any] | None) -> str:
    if cap and cap.get("folder"):
        return str(cap["folder"])
    out = ((cap or {}).get("settings") or {}).get("out", {}).get("value") or "artifacts"
    return f"{out}/{manifest.get('name', '<name>')}"


def _latest_complete(captures: list[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Per tool, the last complete capture (a later capture replaces the tool's folder)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for cap in captures:
        if cap.get("status") == "complete":
            latest[cap.get("tool", "?")] = cap
    return latest


def _tree(root: str, latest: Mapping[str, Mapping[str, Any]]) -> str:
    entries = ["manifest.json"]
    by_tool: dict[str, list[Mapping[str, Any]]] = {}
    for tool, cap in sorted(latest.items()):
        for step in cap.get("steps") or []:
            by_tool.setdefault(tool, []).extend(step.get("files") or [])
    lines = [root.rstrip("/") + "/"]
    tools = sorted(by_tool)
    items: list[tuple[str, list[Mapping[str, Any]]]] = [(e, []) for e in entries] + [
        (t + "/", by_tool[t]) for t in tools
    ]
    for n, (name, files) in enumerate(items):
        last = n == len(items) - 1
        lines.append(("└── " if last else "├── ") + name)
        pad = "    " if last else "│   "
        for m, f in enumerate(sorted(files, key=lambda f: f["path"])):
            leaf = f["path"].split("/", 1)[-1]
            lines.append(pad + ("└── " if m == len(files) - 1 else "├── ") + f"{leaf}  ({fmt_bytes(f.get('bytes'))})")
    return "\n".join(lines)


def render_reproduction(manifest: Mapping[str, Any]) -> str:
    env = manifest.get("environment") or {}
    captures = list(manifest.get("captures") or [])
    latest = _latest_complete(captures)
    gpus = env.get("gpus") or []
    lines = ["### Prerequisites", ""]
    if gpus:
        g = gpus[0]
        lines.append(
            f"- GPU: {g.get('name')} or similar (compute capability "
            f"{_v(g.get('compute_capability'))}), {len(gpus)} visible"
        )
    else:
        lines.append("- GPU: none used (the capture ran on CPU)")
    lines.append(f"- Driver: {_v(env.get('driver_version'))}; CUDA runtime: {_v(env.get('cuda_runtime'))}")
    lines.append(f"- Python {_v(env.get('python'))}, PyTorch {_v(env.get('torch'))}, Triton {_v(env.get('triton'))}")
    if "ncu" in latest:
        lines.append(f"- Nsight Compute: {_v(env.get('ncu_version'))}")
    if "nsys" in latest:
        lines.append(f"- Nsight Systems: {_v(env.get('nsys_version'))}")
    lines += ["", "### Setup", ""]
    git = env.get("git") or {}
    setup: list[str] = []
    if git.get("remote"):
        setup.append(f"git clone {git['remote']} workload && cd workload")
    elif git.get("repo"):
        setup.append(f"cd {git['repo']}  # the workload's repository")
    if git.get("commit"):
        setup.append(f"git checkout {git['commit']}")
    if env.get("torch"):
        setup.append(
            f"pip install torch=={str(env['torch']).split('+')[0]}  # built for CUDA "
            f"{_v(env.get('cuda_runtime'))} on the capture machine"
        )
    setup.append(
        "pip install -e <tracestory checkout>  # tracestory "
        f"{_v(env.get('tracestory'), 'version not recorded: run from source')}"
    )
    lines += _fence("\n".join(setup), "bash")
    if git.get("dirty"):
        lines.append(
            "The working tree had uncommitted changes at capture time: the commit alone does not reproduce it."
        )
    if git.get("repo") and not git.get("commit"):
        lines.append(f"Commit: {NA} (the repository had no commit at capture time).")
    lines += ["", "### Capture", ""]
    if not latest:
        lines.append(f"{NA}: no capture in this manifest completed.")
    for tool, cap in sorted(latest.items()):
        cwd = (cap.get("workload") or {}).get("cwd")
        cmd = ([f"cd {cwd}"] if cwd else []) + [shlex.join(cap.get("invocation") or [])]
        lines += [f"{tool}:", ""] + _fence("\n".join(cmd), "bash")
        subs = [s.get("command") for s in cap.get("steps") or [] if not s.get("in_process")]
        if subs:
            intro = (
                "before its in-process profiled run, it runs:"
                if tool == "torch" and any(s.get("in_process") for s in cap.get("steps") or [])
                else "which runs:"
            )
            lines += ["", intro, ""] + _fence("\n".join(subs), "bash")
        lines.append("")
    lines += ["### Analyze", ""]
    lines += _fence(f"tracestory report {_folder(manifest, next(iter(latest.values()), None))}", "bash")
    lines += ["", "### Artifacts Location", ""]
    lines += _fence(_tree(_folder(manifest, next(iter(latest.values()), None)), latest), "text")
    return "\n".join(lines) + "\n"
