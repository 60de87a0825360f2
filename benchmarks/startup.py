"""Start-up of the command line: the wall time of ``tracestory --version`` (the package and the
command dispatcher, no command) and, optionally, of a second source tree side by side.

Each run is a fresh interpreter (``python3 -c 'from tracestory.cli import main; main([...])'``,
what the ``tracestory`` script does); the trees are run in turn, interleaved with a bare
``python3 -c pass`` so that all three see the same machine load. Prints the median and minimum
of ``--runs`` runs, and the modules each tree's ``--version`` leaves in ``sys.modules``.

    PYTHONPATH=src python3 benchmarks/startup.py --runs 20 --other /path/to/other/src
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VERSION = "import sys; from tracestory.cli import main; sys.exit(main(['--version']))"
COUNT = "import sys; from tracestory.cli import main\ntry: main(['--version'])\nexcept SystemExit: pass\nprint(len(sys.modules))"


def _run(cmd: list[str], src: str | None) -> float:
    env = dict(os.environ, PYTHONPATH=src) if src else dict(os.environ)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--other", metavar="SRC", help="a second source tree (its src/ folder) timed alongside")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = {"this tree": here, **({"other tree": args.other} if args.other else {})}
    times: dict[str, list[float]] = {k: [] for k in (*trees, "python3 -c pass")}
    for _ in range(args.runs):
        for name, src in trees.items():
            times[name].append(_run([sys.executable, "-c", VERSION], src))
        times["python3 -c pass"].append(_run([sys.executable, "-c", "pass"], None))
    for name, vals in times.items():
        mods = ""
        if name in trees:
            env = dict(os.environ, PYTHONPATH=trees[name])
            n = subprocess.run([sys.executable, "-c", COUNT], env=env, capture_output=True, text=True).stdout.split()[-1]
            mods = f", {n} modules"
        print(f"{name:16} median {statistics.median(vals):.3f} s, min {min(vals):.3f} s (n={len(vals)}{mods})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
