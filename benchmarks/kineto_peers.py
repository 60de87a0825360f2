"""Kineto traces side by side: the ``zcat`` floor, ``tracestory analyze`` and ``report``, and the
peers HTA (HolisticTraceAnalysis from PyPI) and TraceLens (from source), in the same run.

    PYTHONPATH=$PWD/src python3 benchmarks/kineto_peers.py --reps 2 \\
        --hta-python /tmp/hta-venv/bin/python --tracelens-python /tmp/tl-venv/bin/python \\
        --trace big=/tmp/k/k256.json.gz --trace big-1line=/tmp/k/k256_1line.json.gz \\
        --trace peers=/tmp/k/k100.json.gz --peers-on peers

Traces come from :mod:`make_kineto` (``--one-line`` for the one-line layout). Every command is a
child process measured by :func:`ingest.measure` (wall; CPU and peak RSS from GNU ``time``); the
commands of one trace run round-robin, ``--reps`` rounds, so the two sides of each ratio ran back
to back under the same load, and the ratios are given per round (wall and CPU). The peers run
only on the traces named by ``--peers-on`` (they take minutes on big traces).

* ``zcat FILE.json.gz``: the floor (inflating the text);
* ``tracestory analyze FILE --json /dev/null`` and ``tracestory report FILE -o OUT.md``;
* HTA: ``benchmarks/hta_run.py`` (``TraceAnalysis`` + ``get_gpu_kernel_breakdown``);
* TraceLens: ``benchmarks/tracelens_run.py`` (``TreePerfAnalyzer.from_file`` +
  ``get_df_gpu_timeline`` + ``get_df_kernels``).

``--one-process`` adds ``analyze 1p`` (``TRACESTORY_KINETO_WORKERS=1``) and ``analyze before``
(that and ``TRACESTORY_INFLATE=zlib``: the read before ISA-L and worker processes) to the rounds;
``--plain`` adds ``cat`` and ``analyze`` of the plain ``.json`` beside the ``.json.gz``. For the
tracestory commands the whole process tree's memory is sampled too (worker processes included:
``tree PSS``; GNU time's peak RSS is one process's).

Writes the raw runs to ``--out`` (JSON) and prints a Markdown table per trace.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ingest  # noqa: E402

MIB = 1 << 20
WORKERS_ENV = "TRACESTORY_KINETO_WORKERS"  # tracestory.ingest.kineto_workers; "1": one process
INFLATE_ENV = "TRACESTORY_INFLATE"  # tracestory.ingest.kineto_text; "zlib": not ISA-L


def _tracestory(*args: str) -> list[str]:
    return [sys.executable, "-m", "tracestory.cli", *args]


def _json_bytes(gz: Path) -> int:
    facts = Path(str(gz).replace(".json.gz", ".facts.json"))
    if facts.exists():
        return int(json.loads(facts.read_text())["json_bytes"])
    return gz.with_suffix("").stat().st_size


def commands(label: str, gz: Path, work: Path, a) -> dict[str, list[str]]:
    cmds = {"zcat": ["zcat", str(gz)]}
    if a.one_process:
        cmds["analyze before"] = _tracestory("analyze", str(gz), "--json", os.devnull)
        cmds["analyze 1p"] = _tracestory("analyze", str(gz), "--json", os.devnull)
    cmds["analyze"] = _tracestory("analyze", str(gz), "--json", os.devnull)
    if a.plain:
        cmds["cat"] = ["cat", str(gz.with_suffix(""))]
        if a.one_process:
            cmds["analyze .json 1p"] = _tracestory("analyze", str(gz.with_suffix("")), "--json", os.devnull)
        cmds["analyze .json"] = _tracestory("analyze", str(gz.with_suffix("")), "--json", os.devnull)
    if not a.no_report:
        cmds["report"] = _tracestory("report", str(gz), "-o", str(work / f"{label}.md"))
    if label in a.peers_on:
        if a.hta_python:
            d = work / f"hta_{label}"
            d.mkdir(exist_ok=True)
            link = d / gz.name
            if not link.exists():
                link.symlink_to(gz)
            cmds["HTA"] = [a.hta_python, str(HERE / "hta_run.py"), str(d), str(work / f"hta_{label}.json")]
        if a.tracelens_python:
            cmds["TraceLens"] = [a.tracelens_python, str(HERE / "tracelens_run.py"), str(gz),
                                 str(work / f"tracelens_{label}.json")]
    return cmds


def ratios(runs: dict, num: str, den: str, key: str) -> list[float]:
    return [x[key] / y[key] for x, y in zip(runs[num], runs[den]) if x["rc"] == 0 and y["rc"] == 0 and y[key]]


def table(label: str, gz: Path, runs: dict) -> list[str]:
    jb = _json_bytes(gz)
    out = [f"#### {label}: {gz.name} ({jb / MIB:,.0f} MiB of JSON)", "",
           "| command | wall s: median (min-max) | CPU s: median | peak RSS MiB | RSS / JSON | tree PSS MiB "
           "| tree PSS / JSON | tree RSS sum MiB | load1 before |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for k, rs in runs.items():
        s = ingest.summarize(rs)
        if not s["ok"]:
            out.append(f"| {k} | failed (rc {rs[0]['rc']}: {rs[0]['stderr_tail'][-200:]!r}) | | | | |")
            continue
        rss = s["maxrss_bytes"] or 0
        loads = ", ".join(f"{r['load1_before']:.1f}" for r in rs)
        # the process tree (worker processes included), sampled; at least the largest process's peak
        pss = max([r.get("tree_pss_bytes", 0) for r in rs if r["rc"] == 0] + [rss]) if k.startswith(("analyze", "report")) else 0
        tree = max([r.get("tree_rss_bytes", 0) for r in rs if r["rc"] == 0] + [rss]) if pss else 0
        out.append(f"| {k} | {s['wall_s']:.2f} ({s['wall_min_s']:.2f}-{s['wall_max_s']:.2f}) | {s['cpu_s']:.2f} | "
                   f"{rss / MIB:,.0f} | {rss / jb:.2f}x | {pss / MIB:,.0f} | {pss / jb:.2f}x | {tree / MIB:,.0f} | {loads} |")
    out.append("")
    for num, den in (("analyze", "zcat"), ("analyze 1p", "zcat"), ("analyze before", "zcat"), ("analyze", "analyze 1p"),
                     ("analyze", "analyze before"), ("analyze 1p", "analyze before"), ("analyze .json", "cat"),
                     ("analyze .json", "analyze .json 1p"), ("report", "analyze"), ("HTA", "analyze"),
                     ("TraceLens", "analyze")):
        if num in runs and den in runs:
            w, c = ratios(runs, num, den, "wall_s"), ratios(runs, num, den, "cpu_s")
            if w:
                out.append(f"- {num} / {den}: wall {statistics.median(w):.2f}x (per round "
                           f"{', '.join(f'{x:.2f}' for x in w)}), CPU {statistics.median(c):.2f}x "
                           f"(per round {', '.join(f'{x:.2f}' for x in c)})")
    out.append("")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", action="append", required=True, metavar="LABEL=FILE.json.gz")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--hta-python", help="python of a venv with HolisticTraceAnalysis")
    p.add_argument("--tracelens-python", help="python of a venv with TraceLens")
    p.add_argument("--peers-on", default="", help="comma-separated labels the peers run on")
    p.add_argument("--one-process", action="store_true",
                   help=f"also run analyze with {WORKERS_ENV}=1 (the one-process read: '1p') and with "
                        f"{INFLATE_ENV}=zlib too ('before': the read before worker processes and ISA-L)")
    p.add_argument("--plain", action="store_true", help="also cat and analyze the plain .json beside FILE.json.gz")
    p.add_argument("--no-report", action="store_true", help="leave out tracestory report")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "kineto_peers.json")
    a = p.parse_args(argv)
    a.peers_on = set(filter(None, a.peers_on.split(",")))
    work = Path(tempfile.mkdtemp(prefix="kineto_peers_"))
    ingest.DATA = work
    results: dict = {"machine": ingest.machine(), "reps": a.reps, "traces": {}}
    lines: list[str] = []
    for spec in a.trace:
        label, path = spec.split("=", 1)
        gz = Path(path).resolve()
        cmds = commands(label, gz, work, a)
        runs: dict[str, list[dict]] = {k: [] for k in cmds}
        for i in range(a.reps):
            for k, cmd in cmds.items():
                env = ({**os.environ, WORKERS_ENV: "1"} if k.endswith(" 1p") else
                       {**os.environ, WORKERS_ENV: "1", INFLATE_ENV: "zlib"} if k.endswith(" before") else None)
                r = ingest.measure(cmd, env=env, tree=k.startswith(("analyze", "report")))
                runs[k].append(r)
                print(f"  {label} round {i + 1} {k}: rc {r['rc']} wall {r['wall_s']:.2f} s cpu {r['cpu_s']} s "
                      f"rss {(r['maxrss_bytes'] or 0) / MIB:.0f} MiB load1 {r['load1_before']:.1f}",
                      file=sys.stderr, flush=True)
        results["traces"][label] = {"file": str(gz), "json_bytes": _json_bytes(gz), "runs": runs}
        lines += table(label, gz, runs)
        a.out.write_text(json.dumps(results, indent=1, default=str))
    print("\n".join(lines))
    for f in sorted(work.glob("*.json")):
        print(f"{f.name}: {f.read_text()[:600]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
