"""The stalls of each server and phase of benchmarks/gpu/numa_ab.sh.

Splits each event log (``x.sched.jsonl``, ``y.sched.jsonl``) at its idle gaps of over 2 s into the
load phases (a, b), writes each phase as its own folder (the meta line, the phase's lines, the
phase's load summary) and runs benchmarks/gpu/serve_table.py on it. Prints one line per server and
phase (iterations, decode/mixed p50, over 3x the median, their clusters' interval) and writes the
rows to ``--json``.

Usage: python benchmarks/gpu/numa_ab_table.py DIR [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

GAP_NS = 2_000_000_000


def phases(lines: list[dict]) -> list[list[dict]]:
    """The log's non-meta lines cut where two iterations are more than GAP_NS apart."""
    out: list[list[dict]] = [[]]
    last = None
    for x in lines[1:]:
        t = x.get("t_start_ns")
        if x.get("type") == "iteration" and last is not None and t - last > GAP_NS:
            out.append([])
        if x.get("type") == "iteration":
            last = x["t_end_ns"]
        out[-1].append(x)
    return [p for p in out if any(x.get("type") == "iteration" for x in p)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = {}
    table = Path(__file__).with_name("serve_table.py")
    for srv in ("x", "y"):
        log = args.dir / f"{srv}.sched.jsonl"
        lines = [json.loads(s) for s in log.read_text().splitlines() if s.strip()]
        for name, part in zip("ab", phases(lines), strict=False):
            d = args.dir / f"{srv}_{name}"
            d.mkdir(exist_ok=True)
            (d / "serve.sched.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [lines[0], *part]))
            (d / "load.summary.json").write_text((args.dir / f"{srv}_{name}.summary.json").read_text())
            p = subprocess.run(
                [sys.executable, str(table), str(d), "--gpus", "2", "--json", str(d / "row.json")],
                capture_output=True,
                text=True,
            )
            if p.returncode:
                print(f"{srv} {name}: serve_table failed: {p.stderr.strip()[-300:]}")
                continue
            r = json.loads((d / "row.json").read_text())
            rows[f"{srv}_{name}"] = r
            c = r.get("stall_clusters") or {}
            print(
                f"{srv} {name}: {r['iterations']} iterations, decode p50 {r['iteration_p50_ms']['decode']:.2f} ms, "
                f"mixed p50 {r['iteration_p50_ms']['mixed']:.1f} ms, longest {r['longest_ms']:.1f} ms, "
                f"over 3x {r['over_3x_median']} (cluster interval p50 {c.get('interval_p50_s')} s)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
