"""Capture settings from flags, ``TRACESTORY_<OPTION>`` environment variables and
``tracestory.toml``, with the source of every value kept for the manifest.

Precedence (first wins): command-line flag > environment variable > file > built-in default.
The environment variable of option ``launch_count`` is ``TRACESTORY_LAUNCH_COUNT`` (the capture runbook's
``TRACE_DURATION=90 ./capture.sh`` habit). The file is ``tracestory.toml`` in the
current folder (or ``--config FILE``)::

    [capture]            # every tool
    warmup_run = true
    [capture.ncu]        # one tool; wins over [capture]
    launch_count = 20

Values are typed by the option table :data:`OPTIONS`; a value of the wrong type (in the
environment or the file) is a :class:`~tracestory.errors.UsageError` naming where it came
from, never silently ignored.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError

TOOLS = ("torch", "nsys", "ncu")
ENV_PREFIX = "TRACESTORY_"
CONFIG_FILE = "tracestory.toml"


@dataclass(frozen=True)
class Option:
    name: str            # python name; flag is --name-with-dashes
    type: str            # "str" | "int" | "bool" | "list"
    default: Any
    tools: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str          # "flag" | "env TRACESTORY_X" | "file PATH" | "default"


_ALL = TOOLS
OPTIONS: tuple[Option, ...] = (
    Option("name", "str", None, _ALL, "artifact name: artifacts/<name>/ (default: the script's stem)"),
    Option("out", "str", "artifacts", _ALL, "root folder of artifact folders"),
    Option("warmup_run", "bool", False, _ALL,
           "run the workload once without any profiler first (compile/autotune warm-up)"),
    Option("torchrun", "int", None, _ALL, "wrap the workload in torchrun --nproc_per_node=N"),
    Option("range", "str", None, _ALL,
           "region (tracestory.region / NVTX range) name that bounds the capture; regions named "
           "'NAME <suffix>' (the server's 'iteration 17') count as NAME"),
    Option("skip", "int", 0, _ALL, "occurrences of --range to skip before capturing"),
    Option("count", "int", 1, ("torch",), "occurrences of --range to capture (torch)"),
    Option("load", "str", None, _ALL,
           "the workload is a server: once GET <url>/health answers 200, run this load (arguments of "
           "`tracestory load`, or a whole command), then stop the server with SIGINT"),
    Option("health_timeout", "int", 300, _ALL, "with --load: seconds to wait for the server's /health"),
    Option("stop_timeout", "int", 120, _ALL,
           "seconds a stopped workload gets to exit after SIGINT (and again after SIGTERM) before the "
           "next signal: the server after the load, or any profiled command after a Ctrl-C; the "
           "profiler writes its trace then"),
    Option("skip_power_monitor", "bool", False, _ALL,
           "no GPU telemetry (by default the capture samples NVML at 20 Hz while the workload runs, into "
           "<tool>/telemetry.jsonl; always off for ncu, whose clock control and replays it would disturb)"),
    Option("wait", "int", None, ("torch",),
           "ProfilerStep schedule: steps to wait (a step ends with each --range region, "
           "or each outermost region without --range)"),
    Option("warmup", "int", None, ("torch",), "ProfilerStep schedule: warm-up steps"),
    Option("active", "int", None, ("torch",), "ProfilerStep schedule: recorded steps"),
    Option("with_shapes", "bool", False, ("torch",), "record op input shapes"),
    Option("memory", "bool", False, ("torch",), "record allocator events (profile_memory)"),
    Option("flops", "bool", False, ("torch",), "estimate FLOPs of matmul/conv ops"),
    Option("stack", "bool", False, ("torch",), "record Python stacks"),
    Option("trace", "str", "cuda,nvtx,osrt", ("nsys",), "nsys --trace list"),
    Option("mpi", "bool", False, ("nsys",), "add mpi to the nsys --trace list"),
    Option("sample", "str", "none", ("nsys",), "nsys --sample"),
    Option("cuda_memory_usage", "bool", True, ("nsys",), "nsys --cuda-memory-usage"),
    Option("set", "str", "full", ("ncu",), "ncu --set (ignored when --sections is given)"),
    Option("sections", "list", None, ("ncu",), "ncu sections, comma separated (replaces --set)"),
    Option("launch_skip", "int", None, ("ncu",), "ncu --launch-skip"),
    Option("launch_count", "int", None, ("ncu",), "ncu --launch-count"),
    Option("kernel_name", "str", None, ("ncu",), "ncu --kernel-name, a regex"),
    Option("kernel_name_base", "str", None, ("ncu",), "ncu --kernel-name-base (function|demangled|mangled)"),
    Option("profile_rank", "int", None, ("ncu",),
           "with --torchrun N: profile rank R only (ncu wraps that rank's process, the other ranks run "
           "plain) and never its NCCL kernels (a replayed collective would wait for the other ranks)"),
    Option("clock_control", "str", "none", ("ncu",), "ncu --clock-control"),
    Option("target_processes", "str", "all", ("ncu",), "ncu --target-processes"),
)
OPTION_BY_NAME = {o.name: o for o in OPTIONS}


def options_for(tool: str) -> tuple[Option, ...]:
    return tuple(o for o in OPTIONS if tool in o.tools)


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def convert(opt: Option, raw: Any, where: str) -> Any:
    """``raw`` (a string from the environment or a TOML value) as the option's type."""
    try:
        if opt.type == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError
        if opt.type == "int":
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, int):
                return raw
            if isinstance(raw, str):
                return int(raw.strip())
            raise ValueError
        if opt.type == "list":
            if isinstance(raw, str):
                return [s.strip() for s in raw.split(",") if s.strip()]
            if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
                return list(raw)
            raise ValueError
        if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
            return str(raw)
        raise ValueError
    except ValueError:
        raise UsageError(f"{where}: expected {opt.type} for option {opt.name!r}, found {raw!r}") from None


def load_config(path: str | Path | None, tool: str) -> tuple[dict[str, Any], str | None]:
    """Values for ``tool`` from ``[capture]`` and ``[capture.<tool>]`` of a TOML file.

    ``path=None`` reads ./tracestory.toml when present. Returns (values, file path or None).
    """
    explicit = path is not None
    p = Path(path) if explicit else Path(CONFIG_FILE)
    if not p.is_file():
        if explicit:
            raise UsageError(f"{p}: expected a tracestory.toml settings file, found no such file")
        return {}, None
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: expected TOML, found a syntax error ({e})") from None
    cap = data.get("capture", {})
    if not isinstance(cap, dict):
        raise UsageError(f"{p}: expected a [capture] table, found {type(cap).__name__}")
    values: dict[str, Any] = {}
    for scope in (cap, cap.get(tool, {})):
        for key, raw in scope.items():
            if key in TOOLS and isinstance(raw, dict):
                continue  # another tool's table
            name = key.replace("-", "_")
            opt = OPTION_BY_NAME.get(name)
            if opt is None or tool not in opt.tools:
                raise UsageError(f"{p}: expected a {tool} capture option, found unknown key {key!r}")
            values[name] = raw
    return values, str(p)


def resolve(tool: str, flags: Mapping[str, Any], env: Mapping[str, str] | None = None,
            config: str | Path | None = None) -> dict[str, Setting]:
    """Every option of ``tool`` with its value and source.

    ``flags`` maps option names to values given on the command line; ``None`` means "not
    given" (the parser's defaults are all ``None`` so a flag is told from a default).
    """
    env = os.environ if env is None else env
    file_values, file_path = load_config(config, tool)
    out: dict[str, Setting] = {}
    for opt in options_for(tool):
        if flags.get(opt.name) is not None:
            out[opt.name] = Setting(flags[opt.name], "flag")
        elif env_var(opt.name) in env:
            var = env_var(opt.name)
            out[opt.name] = Setting(convert(opt, env[var], f"environment variable {var}"), f"env {var}")
        elif opt.name in file_values:
            out[opt.name] = Setting(convert(opt, file_values[opt.name], str(file_path)),
                                    f"file {file_path}")
        else:
            out[opt.name] = Setting(opt.default, "default")
    return out


def values(settings: Mapping[str, Setting]) -> dict[str, Any]:
    return {k: s.value for k, s in settings.items()}


def to_manifest(settings: Mapping[str, Setting]) -> dict[str, dict[str, Any]]:
    return {k: {"value": s.value, "source": s.source} for k, s in sorted(settings.items())}


def validate(tool: str, v: Mapping[str, Any]) -> None:
    """Combinations that cannot work, as one UsageError."""
    at_least_one = ("count", "torchrun", "active", "health_timeout", "stop_timeout")
    for k in ("skip", "wait", "warmup", "launch_skip", "launch_count", *at_least_one):
        if k in v and v[k] is not None and v[k] < (1 if k in at_least_one else 0):
            raise UsageError(f"option --{k.replace('_', '-')}: expected a number >= "
                             f"{1 if k in at_least_one else 0}, found {v[k]}")
    if v.get("load") is not None:
        _validate_load(tool, v)
    if tool == "torch":
        sched = [v.get(k) for k in ("wait", "warmup", "active")]
        if any(x is not None for x in sched):
            if v.get("skip") or (v.get("count") or 1) != 1:
                raise UsageError("capture torch: expected either --skip/--count or a "
                                 "--wait/--warmup/--active schedule, found both")
            if v.get("active") is None:
                raise UsageError("capture torch: a --wait/--warmup schedule needs --active N")
    if v.get("profile_rank") is not None:
        n = v.get("torchrun")
        if not n:
            raise UsageError("option --profile-rank: expected --torchrun N beside it (the rank of a torchrun job "
                             "to profile), found no --torchrun")
        if not 0 <= v["profile_rank"] < n:
            raise UsageError(f"option --profile-rank: expected a rank from 0 to {n - 1} (--torchrun {n}), "
                             f"found {v['profile_rank']}")
    if tool in ("nsys", "ncu") and v.get("skip") and not v.get("range"):
        raise UsageError(f"capture {tool}: --skip needs --range NAME")


def _validate_load(tool: str, v: Mapping[str, Any]) -> None:
    """``--load``: the workload is a server that runs until it is stopped."""
    if not str(v["load"]).strip():
        raise UsageError("option --load: expected a load command or `tracestory load` arguments, found nothing")
    if v.get("warmup_run"):
        raise UsageError("capture: --warmup-run cannot be used with --load (a server does not end by itself); "
                         "skip the warm-up iterations with --range iteration --skip K instead")
    if tool == "torch" and (not v.get("range") or v.get("active") is not None):
        raise UsageError("capture torch --load: expected --range NAME [--skip K --count M] naming the server's "
                         "per-iteration region (`iteration` for tracestory serve), found "
                         + ("a --wait/--warmup/--active schedule" if v.get("range") else "no --range")
                         + ": torch.profiler records CPU ops only on the thread that starts it, and a range "
                         "starts it on the engine thread")
