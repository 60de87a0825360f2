"""Start-up of the command line: the wall time of ``tracestory --version`` (the package and the
command dispatcher, no command) and, optionally, of a second source tree side by side; with
``--analyze FILE``, of ``tracestory analyze FILE > /dev/null`` (terminal tables) instead.

Each run is a fresh interpreter (``python3 -c 'import sys; sys.argv = [...]; from tracestory.cli
import main; sys.exit(main())'``, what the ``tracestory`` script does: ``main()`` of the process's
own command line, which freezes the garbage collector's objects at exit); the trees are run in turn, interleaved with a bare
``python3 -c pass`` so that all three see the same machine load. Prints the median and minimum
of ``--runs`` runs, and the modules each tree's ``--version`` leaves in ``sys.modules``.

    PYTHONPATH=src python3 benchmarks/startup.py --runs 20 --other /path/to/other/src
    PYTHONPATH=src python3 benchmarks/startup.py --runs 20 --analyze tests/data/public/kineto_h100_bert-small_1rank.json.gz
    python3 benchmarks/startup.py --records     # what a record type costs to create, per class and per instance
                                                # (frozen dataclass, dataclass, NamedTuple, msgspec.Struct, __slots__)
    PYTHONPATH=src python3 benchmarks/startup.py --runs 15 --where tests/data/public/kineto_h100_bert-small_1rank.json.gz

Byte-compiled modules are what an installed package runs from; in a process started with
``PYTHONDONTWRITEBYTECODE=1`` every tracestory module of a source tree is compiled again at each
start (~0.15 s for ``analyze``). The script therefore unsets it in its children, points their
byte code at a folder of its own (``PYTHONPYCACHEPREFIX``, so that no source tree is written to)
and runs each command once, untimed, before the timed rounds.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNT = ("import sys, io, contextlib; from tracestory.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    try: main(ARGV)\n    except SystemExit: pass\nprint(len(sys.modules))")


PYCACHE = os.path.join(tempfile.gettempdir(), "tracestory-startup-pycache")


def _env(src: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    if src:
        env["PYTHONPATH"] = src
    return env


def _run(cmd: list[str], src: str | None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system of the child) of one run."""
    env = _env(src)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# One `analyze FILE` in a fresh interpreter, timed by stage: numpy + msgspec (with tracestory.cli,
# which says how numpy's OpenBLAS starts), rich, tracestory's modules (of which creating frozen
# dataclasses, counted), reading the inputs, computing the results, printing the tables. Prints
# one JSON line of seconds; where() adds the interpreter's start and exit (the wall seen from
# outside less the stages).
WHERE = r"""
import contextlib, dataclasses, importlib, io, json, sys, time
t0 = time.perf_counter()
made = [0, 0.0]
_process = dataclasses._process_class
def _timed(*a, **k):
    t = time.perf_counter(); r = _process(*a, **k); made[0] += 1; made[1] += time.perf_counter() - t; return r
dataclasses._process_class = _timed
import tracestory.cli
getattr(tracestory.cli, "_one_blas_thread", lambda: None)()   # numpy as `analyze` loads it
import numpy, msgspec
t1 = time.perf_counter()
import rich.console, rich.table
t2 = time.perf_counter()
before = list(made)
from tracestory.cli import COMMANDS, main
sys.argv = ["tracestory", "analyze", sys.argv[1]]
mod = importlib.import_module("tracestory.cli." + {n: m for n, m, _ in COMMANDS}["analyze"])
t3 = time.perf_counter()
dc = [made[0] - before[0], made[1] - before[1]]
stage = {"read": 0.0, "results": 0.0, "print": 0.0}
def wrap(obj, name, key):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); stage[key] += time.perf_counter() - t; return r
    setattr(obj, name, w)
wrap(mod, "load_inputs", "read"); wrap(mod, "analyze_inputs", "results"); wrap(rich.console.Console, "print", "print")
with contextlib.redirect_stdout(io.StringIO()):
    main()
t4 = time.perf_counter()
print(json.dumps({"numpy + msgspec": t1 - t0, "rich": t2 - t1, "tracestory modules": t3 - t2,
                  "of which dataclasses": dc[1], "dataclasses": dc[0], **stage, "analyze in all": t4 - t3,
                  "after the interpreter": t4 - t0, "tracestory modules loaded": sum(m.startswith("tracestory") for m in sys.modules)}))
"""


def where(path: str, trees: dict[str, str], runs: int) -> None:
    """The minimum over ``runs`` of each stage of WHERE, per tree (the trees take turns)."""
    import json

    best: dict[str, dict[str, float]] = {k: {} for k in trees}
    for _ in range(runs):
        for name, src in trees.items():
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", WHERE, path], env=_env(src), capture_output=True,
                                 text=True, check=True).stdout
            wall = time.perf_counter() - t
            stages = json.loads(out.splitlines()[-1])
            stages["start and exit"] = wall - stages["after the interpreter"]
            stages["wall"] = wall
            for k, v in stages.items():
                best[name][k] = min(best[name].get(k, v), v)
    for name, b in best.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in b.items()))


RECORD_KINDS = {
    "frozen dataclass": "@dataclasses.dataclass(frozen=True)\nclass C:\n{fields}",
    "dataclass": "@dataclasses.dataclass\nclass C:\n{fields}",
    "frozen dataclass, slots": "@dataclasses.dataclass(frozen=True, slots=True)\nclass C:\n{fields}",
    "NamedTuple": "class C(typing.NamedTuple):\n{fields}",
    "msgspec.Struct, frozen": "class C(msgspec.Struct, frozen=True):\n{fields}",
    "class with __slots__": "class C:\n    __slots__ = {names!r}\n    def __init__(self, {args}):\n{assigns}",
}


def records(n_fields: int = 8, classes: int = 200, instances: int = 20000) -> None:
    """Creation cost of one record class of ``n_fields`` fields (a module-level class statement,
    ``from __future__ import annotations`` as in tracestory), and of one instance, per kind; the
    minimum of 5 rounds, each of ``classes`` fresh classes (a class statement is compiled once)."""
    import dataclasses
    import typing

    import msgspec

    names = tuple(f"f{i}" for i in range(n_fields))
    text = {k: v.format(fields="".join(f"    {f}: int = 0\n" for f in names), names=names,
                        args=", ".join(f"{f}=0" for f in names),
                        assigns="".join(f"        self.{f} = {f}\n" for f in names))
            for k, v in RECORD_KINDS.items()}
    for kind, src in text.items():
        code = compile("from __future__ import annotations\n" + src, kind, "exec")
        per_class = per_instance = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(classes):
                ns = {"dataclasses": dataclasses, "typing": typing, "msgspec": msgspec}
                exec(code, ns)
            per_class = min(per_class, (time.perf_counter() - t) / classes)
            cls = ns["C"]
            t = time.perf_counter()
            for i in range(instances):
                cls(i, i, i)
            per_instance = min(per_instance, (time.perf_counter() - t) / instances)
        print(f"{kind:24} class {per_class * 1e3:6.3f} ms, instance {per_instance * 1e6:5.2f} us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--other", metavar="SRC", help="a second source tree (its src/ folder) timed alongside")
    ap.add_argument("--analyze", metavar="FILE", help="time `analyze FILE` (terminal tables) instead of --version")
    ap.add_argument("--records", action="store_true", help="time the creation of record classes and instances")
    ap.add_argument("--where", metavar="FILE", help="time the stages of `analyze FILE` (minimum of --runs per stage)")
    args = ap.parse_args()
    if args.records:
        records()
        return 0
    argv = ["analyze", str(Path(args.analyze).resolve())] if args.analyze else ["--version"]
    # what the `tracestory` script does: main() reads the process's own command line
    command = f"import sys; sys.argv = ['tracestory', *{argv!r}]; from tracestory.cli import main; sys.exit(main())"
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = {"this tree": here, **({"other tree": args.other} if args.other else {})}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in (*trees, "python3 -c pass")}
    for src in trees.values():   # writes the byte code
        _run([sys.executable, "-c", command], src)
    if args.where:
        where(str(Path(args.where).resolve()), trees, args.runs)
        return 0
    for _ in range(args.runs):
        for name, src in trees.items():
            times[name].append(_run([sys.executable, "-c", command], src))
        times["python3 -c pass"].append(_run([sys.executable, "-c", "pass"], None))
    for name, vals in times.items():
        mods = ""
        if name in trees:
            n = subprocess.run([sys.executable, "-c", COUNT.replace("ARGV", repr(argv))], env=_env(trees[name]),
                               capture_output=True, text=True).stdout.split()[-1]
            mods = f", {n} modules"
        wall, cpu = [v[0] for v in vals], [v[1] for v in vals]
        print(f"{name:16} wall median {statistics.median(wall):.3f} s, min {min(wall):.3f} s; "
              f"CPU median {statistics.median(cpu):.3f} s, min {min(cpu):.3f} s (n={len(vals)}{mods})")
    names = list(trees)
    if len(names) == 2:   # paired: the two trees ran back to back in each round
        per = [a[1] / b[1] for a, b in zip(times[names[0]], times[names[1]]) if b[1]]
        print(f"CPU {names[0]} / {names[1]}, median of rounds: {statistics.median(per):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
