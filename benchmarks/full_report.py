"""Full-report benchmark: ``tracestory analyze`` and ``tracestory report`` on the same trace, the
``zcat`` floor beside them, and HTA's load + kernel breakdown on the ~100 MB trace.

Run from the repository root (the checkout's ``src`` is what runs: ``python3 -m tracestory.cli``
in a child that inherits ``PYTHONPATH``)::

    PYTHONPATH=$PWD/src python3 benchmarks/full_report.py --data /tmp/tracestory-bench

What it does
------------
1. Builds (once; reused while the files match) the replicated Kineto traces of
   :mod:`make_kineto` under ``--data`` (never inside the repository): the large one (default
   1024 MiB of JSON) and the small one (default 100 MiB), ``.json.gz`` each.
2. Runs each command as its own child process, ``--reps`` rounds round-robin (so load from other
   jobs on a shared machine spreads over all of them); wall time on a monotonic clock, peak RSS
   and CPU time (user + system) from GNU ``time`` (:func:`ingest.measure`):

   * large trace: ``zcat FILE.json.gz``; ``tracestory analyze FILE.json.gz --json /dev/null``;
     ``tracestory report FILE.json.gz -o OUT.md`` (Markdown, no plots);
   * small trace: ``zcat``; ``tracestory analyze``; HTA's ``TraceAnalysis`` +
     ``get_gpu_kernel_breakdown`` (``hta_run.py`` in a venv with ``traceinsight``).
3. Prints the table and the targets and writes the raw numbers
   to ``DATA/full_report_results.json``. Ratios are given per round too: both commands of a
   ratio ran back to back in the same round, which cancels slow drifts of the machine's load.

Targets: report wall <= 1.3x analyze wall and report peak RSS <= 2x the JSON size (large
trace); analyze wall <= 5x zcat (large); HTA wall >= 10x analyze wall (small).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ingest
import make_kineto

MIB = 1 << 20


def tracestory(*args: str) -> list[str]:
    return [sys.executable, "-m", "tracestory.cli", *args]


def run_rounds(commands: dict[str, list[str]], reps: int) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {k: [] for k in commands}
    for i in range(reps):
        for k, cmd in commands.items():
            r = ingest.measure(cmd)
            runs[k].append(r)
            rss = (r["maxrss_bytes"] or 0) / MIB
            print(f"  round {i + 1} {k}: rc {r['rc']} wall {r['wall_s']:.2f} s cpu {r['cpu_s']} s rss {rss:.0f} MiB "
                  f"load1 {r['load1_before']:.1f}", file=sys.stderr, flush=True)
            if r["rc"] != 0:
                print(r["stderr_tail"], file=sys.stderr)
    return runs


def per_round(runs: dict, num: str, den: str, key: str = "wall_s") -> list[float]:
    return [a[key] / b[key] for a, b in zip(runs[num], runs[den]) if a["rc"] == 0 and b["rc"] == 0 and b[key]]


def table(runs: dict, json_bytes: int) -> list[str]:
    lines = ["| command | wall s: median (min-max) | CPU s: median | peak RSS MiB | RSS / JSON size | load1 before |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for k, rs in runs.items():
        s = ingest.summarize(rs)
        if not s["ok"]:
            lines.append(f"| {k} | failed (rc {rs[0]['rc']}) | | | | |")
            continue
        rss = s["maxrss_bytes"] or 0
        loads = ", ".join(f"{r['load1_before']:.1f}" for r in rs)
        lines.append(f"| {k} | {s['wall_s']:.2f} ({s['wall_min_s']:.2f}-{s['wall_max_s']:.2f}) | {s['cpu_s']:.2f} | "
                     f"{rss / MIB:,.0f} | {rss / json_bytes:.2f}x | {loads} |")
    return lines


def ratio_line(label: str, runs: dict, num: str, den: str, target: str) -> str:
    med = lambda key: ingest.summarize(runs[num])[key] / ingest.summarize(runs[den])[key]
    rounds = ", ".join(f"{x:.2f}" for x in per_round(runs, num, den))
    cpu_rounds = ", ".join(f"{x:.2f}" for x in per_round(runs, num, den, "cpu_s"))
    return (f"- {label}: **{med('wall_s'):.2f}x** median wall (per round {rounds}); CPU {med('cpu_s'):.2f}x "
            f"(per round {cpu_rounds}); target {target}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="analyze vs report vs zcat vs HTA on replicated Kineto traces.")
    p.add_argument("--data", type=Path, default=Path("/tmp/tracestory-bench"),
                   help="folder for the built traces and outputs (default /tmp/tracestory-bench)")
    p.add_argument("--large-mib", type=float, default=1024)
    p.add_argument("--small-mib", type=float, default=100)
    p.add_argument("--source", type=Path, default=make_kineto.DEFAULT_SOURCE)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--hta-venv", type=Path, default=None, help="venv with traceinsight (default DATA/hta-venv)")
    p.add_argument("--skip-hta", action="store_true")
    p.add_argument("--skip-large", action="store_true")
    a = p.parse_args(argv)

    a.data.mkdir(parents=True, exist_ok=True)
    ingest.DATA = a.data  # measure() keeps its GNU time files there
    results: dict = {"machine": ingest.machine(), "reps": a.reps}
    out_lines: list[str] = []

    if not a.skip_large:
        stem = a.data / f"kineto_a100_{int(a.large_mib)}mib"
        facts = ingest.ensure_trace(stem, a.large_mib, a.source)
        gz = stem.with_suffix(".json.gz")
        subprocess.run(["cat", str(gz)], stdout=subprocess.DEVNULL, check=True)
        report_md = a.data / "report_large.md"
        runs = run_rounds({
            "zcat": ["zcat", str(gz)],
            "analyze": tracestory("analyze", str(gz), "--json", "/dev/null"),
            "report": tracestory("report", str(gz), "-o", str(report_md)),
        }, a.reps)
        results["large"] = {"facts": facts, "runs": runs}
        out_lines += [f"### large: {stem.name}.json.gz ({facts['json_bytes']:,} bytes of JSON, {facts['events']:,} events)",
                      "", *table(runs, facts["json_bytes"]), "",
                      ratio_line("report / analyze", runs, "report", "analyze", "<= 1.3x"),
                      ratio_line("analyze / zcat", runs, "analyze", "zcat", "<= 5x")]
        rss = ingest.summarize(runs["report"])["maxrss_bytes"]
        if rss:
            out_lines.append(f"- report peak RSS / JSON size: **{rss / facts['json_bytes']:.2f}x**; target <= 2x")
        out_lines.append("")

    stem = a.data / f"kineto_a100_{int(a.small_mib)}mib"
    facts = ingest.ensure_trace(stem, a.small_mib, a.source)
    gz = stem.with_suffix(".json.gz")
    subprocess.run(["cat", str(gz)], stdout=subprocess.DEVNULL, check=True)
    commands = {"zcat": ["zcat", str(gz)], "analyze": tracestory("analyze", str(gz), "--json", "/dev/null")}
    if not a.skip_hta:
        py_hta = ingest.hta_python(a.hta_venv or a.data / "hta-venv")
        hta_dir = a.data / f"hta_{stem.name}"
        hta_dir.mkdir(exist_ok=True)
        link = hta_dir / gz.name
        if not link.exists():
            link.symlink_to(gz)
        commands["hta"] = [str(py_hta), str(HERE / "hta_run.py"), str(hta_dir), str(a.data / "hta_small.json")]
    runs = run_rounds(commands, a.reps)
    results["small"] = {"facts": facts, "runs": runs}
    out_lines += [f"### small: {stem.name}.json.gz ({facts['json_bytes']:,} bytes of JSON, {facts['events']:,} events)",
                  "", *table(runs, facts["json_bytes"]), "",
                  ratio_line("analyze / zcat", runs, "analyze", "zcat", "(none at this size)")]
    if "hta" in runs:
        out_lines.append(ratio_line("HTA / analyze", runs, "hta", "analyze", ">= 10x"))
    (a.data / "full_report_results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print("\n".join(out_lines))
    print(f"\nmedian of {a.reps} rounds; load average at the end {os.getloadavg()[0]:.1f}; "
          f"raw numbers in {a.data / 'full_report_results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
