"""GPU busy per scheduler iteration of a ``tracestory capture torch --load ... -- tracestory serve``
folder, and the host time the GPU waits for (the numbers of docs/BENCHMARKS.md, "Serving engine").

Model: the GPU work of iteration N is every kernel/memcpy/memset whose launch call (matched by
Kineto's correlation id) ran inside the CPU range ``iteration N``. Its period is the time from
its first GPU event's start to the first GPU event of iteration N+1 (so the last captured
iteration has none); busy = the union of its GPU events; idle = period - busy is the host time
the GPU waited for, inside the iteration too (kernel-to-kernel gaps of a graph replay count);
gap = the first GPU event of N+1 minus the last one of N (the host time between iterations
the GPU saw; negative when they overlap). Batch size = the iteration's members in the scheduler event log. The idle
time of decode-only iterations is fitted as ``a + b * batch`` (least squares; ``a``: the fixed
host cost per iteration the GPU sees), and so is the gap. The event log alone gives a second view: iteration time
(``t_end - t_start``) of all decode-only iterations fitted the same way (GPU work included).

Usage: python benchmarks/gpu/serve_busy.py CAPTURE_DIR [--min-batch 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
from pathlib import Path


def _open(p: Path):
    return gzip.open(p, "rt") if p.suffix == ".gz" else open(p)


def _union(iv):
    tot, end = 0.0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            tot += b - a
            end = b
        elif b > end:
            tot += b - end
            end = b
    return tot


def _fit(xs, ys):
    n = len(xs)
    if n == 0:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return {"fixed": my, "per_seq": None, "n": n}
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return {"fixed": my - b * mx, "per_seq": b, "n": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--min-batch", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    root = Path(a.folder)
    traces = sorted(root.rglob("*.trace.json*"))
    logs = sorted(root.rglob("*.sched.jsonl*"))
    if not traces or not logs:
        print(f"{root}: expected a Kineto trace and a scheduler event log, found {traces} {logs}", file=sys.stderr)
        return 2
    ev = json.load(_open(traces[0]))["traceEvents"]
    iters = {}
    for e in ev:
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("iteration "):
            iters[int(e["name"].split()[1])] = (e["ts"], e["ts"] + e["dur"])
    spans = sorted((t0, t1, n) for n, (t0, t1) in iters.items())
    corr = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            for t0, t1, n in spans:
                if t0 <= e["ts"] <= t1:
                    corr[e["args"]["correlation"]] = n
                    break
    gpu = {}
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            n = corr.get(e.get("args", {}).get("correlation"))
            if n is not None:
                gpu.setdefault(n, []).append((e["ts"], e["ts"] + e["dur"]))
    batch, kind, it_ms = {}, {}, {}
    with _open(logs[0]) as fh:
        for line in fh:
            o = json.loads(line)
            if o.get("type") == "iteration":
                n = o["iter"]
                batch[n] = len(o["members"])
                kind[n] = "decode" if all(m["phase"] == "decode" for m in o["members"]) else "mixed"
                it_ms[n] = (o["t_end_ns"] - o["t_start_ns"]) / 1e6
    rows = []
    ns = sorted(gpu)
    for n, nxt in itertools.pairwise(ns):
        if nxt != n + 1:
            continue
        start = min(s for s, _ in gpu[n])
        period = min(s for s, _ in gpu[nxt]) - start
        busy = _union(gpu[n])
        gap = min(s for s, _ in gpu[nxt]) - max(e for _, e in gpu[n])
        rows.append({"iter": n, "batch": batch.get(n), "kind": kind.get(n), "period_ms": period / 1e3,
                     "busy_ms": busy / 1e3, "idle_ms": (period - busy) / 1e3, "busy_pct": 100 * busy / period,
                     "gap_ms": gap / 1e3, "log_iteration_ms": it_ms.get(n)})
    dec = [r for r in rows if r["kind"] == "decode" and (r["batch"] or 0) >= a.min_batch]
    fit_idle = _fit([r["batch"] for r in dec], [r["idle_ms"] for r in dec])
    fit_gap = _fit([r["batch"] for r in dec], [r["gap_ms"] for r in dec])
    all_dec = [n for n in it_ms if kind[n] == "decode"]
    fit_log = _fit([batch[n] for n in all_dec], [it_ms[n] for n in all_dec])
    out = {"folder": str(root), "captured_iterations": len(iters), "rows": rows,
           "decode_min_batch": a.min_batch, "decode_rows": len(dec),
           "decode_busy_pct_mean": (sum(r["busy_pct"] for r in dec) / len(dec)) if dec else None,
           "decode_busy_pct_min": min((r["busy_pct"] for r in dec), default=None),
           "decode_period_ms_mean": (sum(r["period_ms"] for r in dec) / len(dec)) if dec else None,
           "decode_idle_ms_mean": (sum(r["idle_ms"] for r in dec) / len(dec)) if dec else None,
           "idle_fit_ms": fit_idle, "gap_fit_ms": fit_gap, "log_decode_iteration_fit_ms": fit_log,
           "log_decode_iterations": len(all_dec)}
    for r in rows:
        print(f"iter {r['iter']:6d} {r['kind'] or '?':6s} batch {r['batch']!s:>3s} period {r['period_ms']:7.3f} ms "
              f"busy {r['busy_ms']:7.3f} ms ({r['busy_pct']:5.1f}%) idle {r['idle_ms']:6.3f} ms "
              f"gap {r['gap_ms']:6.3f} ms")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
