"""Benchmark: does the report's cost grow linearly with the trace? (issue: no per-step scan over all ops)

Builds two Kineto traces from the same real capture with ``make_kineto.build`` (copies of it shifted in
time, steps renumbered): one of ``--mb`` MiB and one twice that, then times ``tracestory report`` on each
in a fresh subprocess (best of ``--repeat``). A report that scans every op once per step costs four
times as much on the doubled trace; a linear one about twice. Prints both times and their ratio, and
exits 1 when the ratio exceeds ``--max-ratio`` (default 2.3: twice the work plus noise).

Usage: ``python benchmarks/report_scaling.py [--mb 40] [--repeat 2] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_kineto import build  # noqa: E402


def _time_report(trace: Path, out: Path, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tracestory.cli", "report", str(trace), "-o", str(out)],
                       check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=40)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--max-ratio", type=float, default=2.3)
    p.add_argument("--keep", type=Path, default=None, help="folder for the built traces (default: a temporary one)")
    a = p.parse_args(argv)
    folder = a.keep or Path(tempfile.mkdtemp(prefix="report_scaling_"))
    folder.mkdir(parents=True, exist_ok=True)
    times = {}
    for mult in (1, 2):
        stem = folder / f"trace_{mult}x"
        if not Path(f"{stem}.json.gz").exists():
            build(stem, int(a.mb * mult * (1 << 20)))
        times[mult] = _time_report(Path(f"{stem}.json.gz"), folder / f"report_{mult}x.md", a.repeat)
    ratio = times[2] / times[1]
    print(json.dumps({"mb": a.mb, "report_s_1x": round(times[1], 2), "report_s_2x": round(times[2], 2),
                      "ratio": round(ratio, 3), "max_ratio": a.max_ratio, "machine": platform.node(),
                      "cpus": os.cpu_count(), "python": platform.python_version()}))
    return 0 if ratio <= a.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
