"""Benchmark: Nsight Systems SQLite ingest + per-kernel breakdown, tracestory vs pandas.

Builds an export with >= 2 million kernel rows by replicating the kernel rows of the public
2024.5 CloverLeaf fixture (copy after copy, each shifted in time past the previous one and
written in start order as nsys writes them; correlation ids offset), then runs each method in
a fresh subprocess and reports wall time (the imports of tracestory or pandas included) and
memory: the bytes of the data kept (the Trace's columns; the DataFrame with its Python
strings), and ``ru_maxrss`` at the start (interpreter + numpy), after the load and at the end:

* ``tracestory``: ``load_nsys_sqlite`` (every table, all kernel columns) + ``breakdown`` with
  the llm taxonomy (classification and per-category sums);
* ``tracestory-core``: the same with ``kernel_columns="core"`` (times, names, ids; no launch shape);
* ``tracestory-sqlite``: the same as ``tracestory`` with the page reader off (every column read
  through SQLite: the fallback path);
* ``tracestory-groupby`` (not in the default list): the full load + ``np.bincount`` on the
  name codes;
* ``analyze``: ``tracestory analyze DB --json /dev/null`` end to end (every analysis, the
  findings, the JSON and the terminal tables), in the child through ``cli.main``;
* ``pandas``: ``pd.read_sql`` of (start, end, name) with a ``StringIds`` join + ``groupby``.

Methods run round-robin (A, B, A, B, ...) so that each sees the same machine load; the best and
the median of each are reported, with the CPU time (user + system, threads included) of the
child beside the wall time.

Usage: ``python benchmarks/nsys_ingest.py [--rows 2000000] [--db PATH] [--repeat 3] [--methods analyze,pandas]``.
pandas is needed for the comparison only (``pip install pandas``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO.parent / "shared" / "fixtures" / "public" / "nsys_2024.5_a100_cloverleaf.sqlite"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"


def build(db: Path, rows: int, fixture: Path = FIXTURE) -> int:
    if db.exists():
        con = sqlite3.connect(db)
        n = con.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0]
        # an older build interleaved the copies (not in start order, unlike a real export)
        back = con.execute(f"SELECT count(*) FROM (SELECT start < lag(start) OVER (ORDER BY rowid) AS b "
                           f"FROM {KERNEL}) WHERE b").fetchone()[0]
        con.close()
        if n >= rows and back == 0:
            return n
        db.unlink()
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(fixture, db)
    os.chmod(db, 0o644)
    con = sqlite3.connect(db)
    cols = [r[1] for r in con.execute(f"PRAGMA table_info({KERNEL})")]
    n0, span = con.execute(f"SELECT count(*), max(end) - min(start) + 1000 FROM {KERNEL}").fetchone()
    corr = con.execute("SELECT max(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    copies = -(-rows // n0)
    con.execute("CREATE TEMP TABLE reps (i INTEGER)")
    con.executemany("INSERT INTO reps VALUES (?)", [(i,) for i in range(1, copies)])

    def shifted(c):
        if c in ("start", "end"):
            return f"{c} + reps.i * {span}"
        return f"{c} + reps.i * {corr}" if c == "correlationId" else c

    # copy after copy, each in the fixture's (start) order: the rows stay in start order
    con.execute(f"INSERT INTO {KERNEL} SELECT {', '.join(map(shifted, cols))} FROM temp.reps, {KERNEL} "
                f"ORDER BY reps.i, {KERNEL}.rowid")
    con.commit()
    n = con.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0]
    con.close()
    return n


def _nbytes(data) -> int:
    """Bytes held by a DataFrame (Python strings included) or by a Trace's columns."""
    if data is None:
        return 0
    if hasattr(data, "memory_usage"):
        return int(data.memory_usage(deep=True).sum())
    tables = [getattr(data, t) for t in ("kernels", "memops", "api", "ops", "ranges", "memory")]
    return sum(t[c].nbytes for t in tables for c in t.columns)


def run_one(method: str, db: str) -> dict:
    import resource

    import numpy as np

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # interpreter + numpy
    t0 = time.perf_counter()
    if method in ("analyze", "analyze-base"):
        import contextlib
        import io

        from tracestory.cli import main as cli_main

        with contextlib.redirect_stdout(io.StringIO()):
            cli_main(["analyze", db, "--json", os.devnull])
        t1 = time.perf_counter()
        rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        con = sqlite3.connect(db)
        n, total = con.execute(f"SELECT count(*), sum(end - start) FROM {KERNEL}").fetchone()   # for the check
        con.close()
        kept = None
    elif method == "pandas":
        import pandas as pd

        con = sqlite3.connect(db)
        df = pd.read_sql(f"SELECT k.start, k.end, s.value AS name FROM {KERNEL} k "
                         "JOIN StringIds s ON s.id = k.demangledName", con)
        con.close()
        t1 = time.perf_counter()
        rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        per_name = (df["end"] - df["start"]).groupby(df["name"]).sum()
        n, total = len(df), int(per_name.sum())
        kept = df
    else:
        from tracestory.ingest import nsys_sqlite

        nsys_sqlite._PAGE_READER = method != "tracestory-sqlite"
        trace, = nsys_sqlite.load_nsys_sqlite(db, kernel_columns="core" if method.endswith("-core") else "all")
        t1 = time.perf_counter()
        rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if method in ("tracestory", "tracestory-core", "tracestory-sqlite"):
            from tracestory.analysis.breakdown import breakdown

            total = breakdown(trace).kernel_time_ns
        else:
            per_name = np.bincount(trace.kernels["name"], weights=trace.kernels.dur_ns, minlength=len(trace.strings))
            total = int(per_name.sum())
        n = len(trace.kernels)
        kept = trace
    t2 = time.perf_counter() if not method.startswith("analyze") else t1
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rss = ru.ru_maxrss * 1024
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "method": method, "kernels": n, "kernel_time_ns": total, "load_s": t1 - t0, "analyze_s": t2 - t1,
            "total_s": t2 - t0, "peak_rss_bytes": rss, "rss_after_load_bytes": rss_load, "kept_bytes": _nbytes(kept),
            "rss_at_start_bytes": rss0}


def _child_env(method: str, base_src: str | None) -> dict[str, str]:
    """The child's environment: byte code written (to a folder of its own), as an installed package
    runs; ``analyze-base`` with ``base_src`` first on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "tracestory-bench-pycache")
    src = base_src if method == "analyze-base" else str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--db", type=Path, default=REPO / "benchmarks" / "_data" / "nsys_2M_kernels.sqlite")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--methods", default="tracestory,tracestory-core,tracestory-sqlite,pandas")
    ap.add_argument("--fixture", type=Path, default=FIXTURE, help="export whose kernel rows are replicated")
    ap.add_argument("--base-src", help="src/ folder of another tracestory tree: method analyze-base runs it")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, str(args.db))))
        return
    n = build(args.db, args.rows, args.fixture)
    print(f"# {args.db} ({args.db.stat().st_size / 1e6:.0f} MB, {n} kernel rows)")
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| method | kernels | load (s) | analyze (s) | total (s): best (median) | CPU (s): best | kernels/s "
          "| data kept (MB) | RSS at start / after load / peak (MB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    totals = {}
    methods = args.methods.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    for _ in range(args.repeat):
        for method in methods:   # round-robin: each method sees the same load
            out = subprocess.run([sys.executable, __file__, "--one", method, "--db", str(args.db)],
                                 capture_output=True, text=True, check=True, env=_child_env(method, args.base_src))
            runs[method].append(json.loads(out.stdout))
    for method in methods:
        best = min(runs[method], key=lambda r: r["total_s"])
        totals[method] = best["kernel_time_ns"]
        med = sorted(r["total_s"] for r in runs[method])[len(runs[method]) // 2]
        cpu = min(r["cpu_s"] for r in runs[method])
        print(f"| {method} | {best['kernels']} | {best['load_s']:.2f} | {best['analyze_s']:.2f} | {best['total_s']:.2f} "
              f"(median {med:.2f}) | {cpu:.2f} | {best['kernels'] / best['total_s'] / 1e6:.2f} M | {best['kept_bytes'] / 1e6:.0f} "
              f"| {best['rss_at_start_bytes'] / 1e6:.0f} / {best['rss_after_load_bytes'] / 1e6:.0f} "
              f"/ {best['peak_rss_bytes'] / 1e6:.0f} |")
    if "analyze" in runs and "pandas" in runs:
        pairs = [p["total_s"] / a["total_s"] for a, p in zip(runs["analyze"], runs["pandas"])]
        cpu_pairs = [p["cpu_s"] / a["cpu_s"] for a, p in zip(runs["analyze"], runs["pandas"])]
        print(f"# pandas / analyze, per round: wall {', '.join(f'{x:.2f}' for x in pairs)}; "
              f"CPU {', '.join(f'{x:.2f}' for x in cpu_pairs)}")
    if len(set(totals.values())) != 1:
        raise SystemExit(f"methods disagree on the kernel time: {totals}")
    print(f"# all methods: kernel time {next(iter(totals.values()))} ns (best of {args.repeat} runs each)")


if __name__ == "__main__":
    main()
