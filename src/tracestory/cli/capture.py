"""``tracestory capture {torch,nsys,ncu} [options] -- python script.py ARGS``.

Parses, calls :mod:`tracestory.capture.pipeline`, prints. Every option can also come from
``TRACESTORY_<OPTION>`` or ``tracestory.toml`` (see :mod:`tracestory.capture.settings`); flags
default to ``None`` here so the resolver can tell "given" from "not given".
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from ..capture import settings as _settings
from ..capture import pipeline
from ..capture.under_load import url_of
from ..errors import TracestoryError

_HELP = {
    "torch": "run the workload under torch.profiler (a child process the capture supervises)",
    "nsys": "run the workload under Nsight Systems, then export SQLite",
    "ncu": "run the workload under Nsight Compute, then export raw and details CSV",
}


def _add_options(p: argparse.ArgumentParser, tool: str) -> None:
    for opt in _settings.options_for(tool):
        flag = "--" + opt.name.replace("_", "-")
        env = _settings.env_var(opt.name)
        default = "" if opt.default is None else f"; default {opt.default}"
        help_ = f"{opt.help} (env {env}{default})"
        if opt.type == "bool":
            p.add_argument(flag, dest=opt.name, action=argparse.BooleanOptionalAction,
                           default=None, help=help_)
        elif opt.type == "int":
            p.add_argument(flag, dest=opt.name, type=int, default=None, metavar="N", help=help_)
        else:
            p.add_argument(flag, dest=opt.name, default=None, help=help_)
    p.add_argument("--config", default=None, metavar="FILE",
                   help=f"settings file (default ./{_settings.CONFIG_FILE} when present)")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands and stop")
    p.add_argument("workload", nargs=argparse.REMAINDER,
                   help="-- python script.py ARGS  |  -- python -m module ARGS  |  -- tracestory serve ARGS")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``capture`` (with ``torch``/``nsys``/``ncu``) to the top-level subparsers."""
    cap = subparsers.add_parser("capture", help="capture traces of a workload into artifacts/<name>/",
                                description=__doc__.splitlines()[0])
    tools = cap.add_subparsers(dest="capture_tool", metavar="{torch,nsys,ncu}")
    tools.required = True
    for tool in _settings.TOOLS:
        p = tools.add_parser(tool, help=_HELP[tool], description=_HELP[tool])
        _add_options(p, tool)
        p.set_defaults(func=run)
    return cap


def _flags(args: argparse.Namespace, tool: str) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for opt in _settings.options_for(tool):
        val = getattr(args, opt.name, None)
        if val is not None and opt.type == "list":
            val = _settings.convert(opt, val, "command line")
        flags[opt.name] = val
    return flags


def run(args: argparse.Namespace) -> int:
    tool = args.capture_tool
    p = pipeline.plan(tool, args.workload or [], _flags(args, tool), config=args.config)
    if p.tool_options.get("cuda_graph_trace") == "graph":   # an nsys that cannot trace graph nodes
        print(f"capture {tool}: warning: {p.tool_options['warning']}", file=sys.stderr)
    if args.dry_run:
        for s in p.steps:
            if s.name == "torch-profile" and s.role is None:
                print("# the workload under torch.profiler, in its own process group (Ctrl-C is forwarded):")
            elif s.role == "server" and p.values.get("torchrun"):
                print("# the server's ranks under torchrun, in their own process group (each rank gets SIGINT "
                      "after the load; torchrun then exits by itself):")
            elif s.role == "server":
                print("# the server, in its own process group (stopped with SIGINT after the load):")
            elif s.role == "load":
                print(f"# once GET {url_of(p.values['load']).rstrip('/')}/health answers 200:")
            print(s.command)
        return 0
    result = pipeline.execute(p, config=args.config)
    if result.status == "complete":
        print(f"capture {tool}: complete -> {result.folder}")
        for path, size in result.files:
            print(f"  {path}  ({size} bytes)")
        print("  manifest.json")
        if result.note:
            print(f"  note: {result.note}")
        return result.exit_code
    error = result.error.strip().splitlines()[-1] if result.error else "unknown"
    kept = _kept(result)
    print(f"capture {tool}: FAILED ({error}); no {tool}/ folder written"
          + (f", what it wrote is kept in {kept}" if kept else "") + f", see {result.manifest_path}",
          file=sys.stderr)
    return result.exit_code


def _kept(result) -> str | None:
    """The failed-<tool>/ folder a failed capture left, when it left one."""
    from pathlib import Path

    kept = Path(result.folder) / f"failed-{result.tool}"
    return str(kept) if kept.is_dir() else None


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m tracestory.cli.capture torch -- ...``)."""

    parser = argparse.ArgumentParser(prog="tracestory")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TracestoryError as e:
        print(f"tracestory: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
