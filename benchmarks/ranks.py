"""Many-ranks benchmark: 64 rank traces, tracestory with 1 worker, 2 workers and
a dask LocalCluster, and Holistic Trace Analysis on the same folder, in one run.

Run from the repository root::

    python3 benchmarks/ranks.py                 # builds the data if missing, measures, prints a summary
    python3 benchmarks/ranks.py --write-doc     # also replaces the "Many ranks" section of docs/PERFORMANCE.md

What is measured
----------------
Every configuration is one child process (``python3 benchmarks/ranks.py --child ...``), run
``--reps`` times round-robin so that load from other jobs spreads over all of them:

* ``tracestory, 1 worker``: ``map_ranks(files, rank_summary, workers=1)`` (in-process) then
  ``combine(summaries)``;
* ``tracestory, 2 workers``: the same with ``workers=2`` (a spawn process pool);
* ``tracestory, dask LocalCluster``: a ``LocalCluster(n_workers=2, threads_per_worker=1,
  processes=True, host="127.0.0.1")`` started in the child, ``map_ranks(...,
  dask_address=cluster.scheduler_address)``, ``combine``, cluster closed -- all inside the time;
* ``HTA``: ``TraceAnalysis(trace_dir=DIR)`` (HTA parses every rank, with a fork pool of
  ``min(ranks, cpu_count)`` processes), then ``get_comm_comp_overlap(visualize=False)`` and
  ``get_temporal_breakdown(visualize=False)``: the analyses of HTA that read every rank.
  Run with the Python of ``benchmarks/_data/hta-venv`` (``pip install traceinsight``).

``rank_summary``/``combine`` are ``tracestory.analysis.multigpu``'s when that module exists; without
it a stand-in (kernel count and kernel time per rank, summed) is used and the results say so.
Rank files come from ``tracestory.ingest.ranks.rank_sources`` (discovery: a sniff and a peek at
each file's head for ``distributedInfo.rank``, timed as part of the run) when it exists, else the
folder's ``*.json.gz`` in name order.

Wall time is taken here, spawn to reap (so imports and pool or cluster start-up count, as for a
user). CPU time is user + system of the child and every process it waited for (GNU ``time``).
Memory, two numbers: ``peak RSS, largest process`` (GNU ``time``'s maximum resident set size: the
largest single process of the tree) and ``peak RSS, all processes``: the largest sum of RSS over
the child and all its descendants, sampled every 0.1 s with psutil (it counts pages shared
between forked processes once per process, and can miss a peak shorter than the interval).

Each child writes its own phase times and results; after the runs the tracestory results of the
three configurations are compared with each other (equal digests of every summary and of the
combined result, among runs of the same tracestory sources) and with numbers taken from the rank
files' JSON by ``make_ranks.py`` (per rank, the NCCL kernel time against ``comm_ns``; with the
stand-in, kernel counts and kernel time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "_data"
DEFAULT_DIR = DATA / "ranks64"
HTA_PY = DATA / "hta-venv" / "bin" / "python"
RESULTS = DATA / "ranks_results.json"
DOC = REPO / "docs" / "PERFORMANCE.md"
SECTION = "## Many ranks"


# --------------------------------------------------------------------------- children
def _summary_functions():
    """(rank_summary, combine, label): helper A's module when present, else the stand-in."""
    try:
        from tracestory.analysis.multigpu import combine, rank_summary
    except ImportError:
        return _standin_summary, _standin_combine, "stand-in (kernel count and time per rank)"
    return rank_summary, combine, "tracestory.analysis.multigpu.rank_summary + combine"


def _standin_summary(trace):
    return {"rank": trace.meta.rank, "kernels": len(trace.kernels), "kernel_dur_ns": int(trace.kernels.dur_ns.sum())}


def _standin_combine(summaries):
    return {"ranks": len(summaries), "kernels": sum(s["kernels"] for s in summaries),
            "kernel_dur_ns": sum(s["kernel_dur_ns"] for s in summaries)}


def _rank_files(folder: Path) -> list:
    """The folder's rank sources (``tracestory.ingest.ranks.rank_sources``), else its ``*.json.gz``."""
    try:
        from tracestory.ingest.ranks import rank_sources
    except ImportError:
        return [str(p) for p in sorted(folder.glob("*.json.gz"))]
    return rank_sources([str(folder)])


def _plain(x):
    """A JSON-able rendering of a result (dataclasses, tuples, numpy arrays and scalars)."""
    import dataclasses

    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "tolist"):  # numpy array or scalar
        return x.tolist()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def _scalars(d):
    """The scalar fields of a rendered dataclass (the per-rank numbers), without its arrays."""
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool)) or v is None} if isinstance(d, dict) else d


def _digest(x) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(x, sort_keys=True, default=repr).encode()).hexdigest()


def _code_digest() -> str:
    """sha256 over tracestory's sources: results are compared only between runs of the same code
    (other people edit the tree while a benchmark runs)."""
    import hashlib

    import tracestory

    h = hashlib.sha256()
    root = Path(tracestory.__file__).parent
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def child_tracestory(folder: Path, mode: str, out: Path) -> None:
    t0 = time.perf_counter()
    from tracestory.parallel import map_ranks

    rank_summary, combine, label = _summary_functions()
    files = _rank_files(folder)
    t_import = time.perf_counter()
    cluster = None
    kwargs: dict = {"workers": 1} if mode == "w1" else {"workers": 2}
    if mode == "dask":
        from dask.distributed import LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None)
        kwargs = {"dask_address": cluster.scheduler_address}
    t_cluster = time.perf_counter()
    summaries = map_ranks(files, rank_summary, **kwargs)
    t_map = time.perf_counter()
    combined = combine(summaries)
    t_combine = time.perf_counter()
    if cluster is not None:
        cluster.close()
    t_end = time.perf_counter()
    result = {
        "summary_fn": label, "files": len(files), "code_sha256": _code_digest(),
        "seconds": {"import": t_import - t0, "cluster_start": t_cluster - t_import, "map": t_map - t_cluster,
                    "combine": t_combine - t_map, "cluster_close": t_end - t_combine, "total": t_end - t0},
        # Everything, as digests (equal digests = equal results); the per-rank numbers in the clear.
        "summaries_sha256": _digest(_plain(summaries)), "combined_sha256": _digest(_plain(combined)),
        "summaries": [_scalars(x) for x in _plain(summaries)],
        "combined": {k: (_scalars(v) if isinstance(v, dict) else [_scalars(y) for y in v] if k in ("per_rank",) else None)
                     for k, v in _plain(combined).items() if k in ("per_rank", "straggler", "alignment")}
        if hasattr(combined, "per_rank") else _plain(combined),
        "combined_scalars": _scalars(_plain(combined)),
    }
    out.write_text(json.dumps(result, indent=1, default=repr))


def child_hta(folder: Path, out: Path) -> None:
    import logging

    t0 = time.perf_counter()
    logging.disable(logging.WARNING)  # HTA logs per-phase timings at WARNING
    from hta.trace_analysis import TraceAnalysis

    t_import = time.perf_counter()
    analyzer = TraceAnalysis(trace_dir=str(folder))
    t_load = time.perf_counter()
    overlap = analyzer.get_comm_comp_overlap(visualize=False)
    t_overlap = time.perf_counter()
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    t_temporal = time.perf_counter()
    result = {
        "ranks": sorted(int(r) for r in analyzer.t.traces),
        "seconds": {"import": t_import - t0, "load": t_load - t_import, "comm_comp_overlap": t_overlap - t_load,
                    "temporal_breakdown": t_temporal - t_overlap, "total": t_temporal - t0},
        "comm_comp_overlap": json.loads(overlap.to_json(orient="records")),
        "temporal_breakdown": json.loads(temporal.to_json(orient="records")),
    }
    out.write_text(json.dumps(result, indent=1))


# --------------------------------------------------------------------------- measuring
CONFIGS = {
    "w1": "tracestory, 1 worker (in-process)",
    "w2": "tracestory, 2 workers (process pool)",
    "dask": "tracestory, dask LocalCluster (2 worker processes)",
    "hta": "HTA TraceAnalysis + comm/comp overlap + temporal breakdown",
}


class _TreeRss:
    """Largest sum of RSS over a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ps = self._psutil
        while not self._stop.is_set():
            total = 0
            try:
                procs = [self._root, *self._root.children(recursive=True)]
            except ps.Error:
                procs = []
            for p in procs:
                try:
                    total += p.memory_info().rss
                except ps.Error:
                    pass
            self.peak_bytes = max(self.peak_bytes, total)
            self._stop.wait(self._interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_bytes


def measure(config: str, folder: Path, rep: int) -> dict:
    out = DATA / f"ranks_child_{config}_{rep}_{os.getpid()}.json"
    stats = DATA / f"ranks_time_{os.getpid()}.txt"
    out.unlink(missing_ok=True)
    py = str(HTA_PY) if config == "hta" else sys.executable
    cmd = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(stats), py, str(Path(__file__).resolve()),
           "--child", config, "--dir", str(folder), "--child-out", str(out)]
    load1 = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = _TreeRss(proc.pid)
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    tree_peak = sampler.stop()
    maxrss = cpu = None
    lines = stats.read_text().split("\n") if stats.exists() else []
    last = [ln for ln in lines if ln.strip()][-1].split() if any(ln.strip() for ln in lines) else []
    if len(last) == 3 and proc.returncode == 0:
        maxrss, cpu = int(last[0]) * 1024, float(last[1]) + float(last[2])
    stats.unlink(missing_ok=True)
    child = json.loads(out.read_text()) if out.exists() and proc.returncode == 0 else None
    out.unlink(missing_ok=True)
    return {"config": config, "rep": rep, "rc": proc.returncode, "wall_s": wall, "cpu_s": cpu,
            "maxrss_bytes": maxrss, "tree_rss_peak_bytes": tree_peak, "load_before": load1,
            "load_after": os.getloadavg(), "stderr_tail": err.decode(errors="replace")[-3000:] if proc.returncode else "",
            "child": child}


def ensure_data(folder: Path, ranks: int) -> dict:
    sys.path.insert(0, str(HERE))
    import make_ranks

    facts_file = make_ranks.facts_path(folder)
    if facts_file.exists():
        facts = json.loads(facts_file.read_text())
        if facts.get("ranks") == ranks and all((folder / p["file"]).exists() and
                                                (folder / p["file"]).stat().st_size == p["gz_bytes"]
                                                for p in facts["per_rank"]):
            return facts
    return make_ranks.build(folder, ranks)


# --------------------------------------------------------------------------- checks
def checks(runs: list[dict], facts: dict) -> list[str]:
    """Plain-language checks of the results; every line says what was compared."""
    lines = []
    ts = [r for r in runs if r["config"] != "hta" and r["child"]]
    if ts:
        ref = ts[0]["child"]
        groups: dict[str, list[dict]] = {}
        for r in ts:
            groups.setdefault(r["child"].get("code_sha256", ""), []).append(r)
        if len(groups) > 1:
            lines.append(f"tracestory's sources changed during the benchmark ({len(groups)} versions); "
                         "results are compared within each version.")
        for runs_of in groups.values():
            first = runs_of[0]["child"]
            same = all(r["child"]["summaries_sha256"] == first["summaries_sha256"]
                       and r["child"]["combined_sha256"] == first["combined_sha256"] for r in runs_of)
            kinds = ", ".join(dict.fromkeys(CONFIGS[r["config"]].removeprefix("tracestory, ") for r in runs_of))
            lines.append(f"tracestory: per-rank summaries and the combined result of {len(runs_of)} tracestory runs "
                         f"({kinds}) are {'identical' if same else 'NOT identical'} "
                         f"({first['summary_fn']}, {first['files']} files).")
        ranks = [s.get("rank") for s in ref["summaries"] if isinstance(s, dict)]
        if ranks:
            ok = ranks == list(range(facts["ranks"]))
            lines.append(f"tracestory: results come back in rank order 0..{facts['ranks'] - 1}: {'yes' if ok else 'NO: ' + str(ranks[:8])}.")
        per_rank = {p["rank"]: p for p in facts["per_rank"]}
        # comm_ns (RankSummary): the union of NCCL kernels; they all run on one stream in these
        # traces, so it equals the plain sum of their durations taken from the JSON.
        for key, fact in (("kernels", "kernels"), ("kernel_dur_ns", "kernel_dur_ns"), ("comm_ns", "nccl_kernel_dur_ns")):
            vals = [(s.get("rank"), s.get(key)) for s in ref["summaries"] if isinstance(s, dict) and key in s]
            if vals:
                bad = [(r, v, per_rank[r][fact]) for r, v in vals if r in per_rank and v != per_rank[r][fact]]
                lines.append(f"tracestory `{key}` per rank vs the rank files' JSON (make_ranks facts `{fact}`): "
                             f"{'equal for all ' + str(len(vals)) + ' ranks' if not bad else 'DIFFERENT: ' + str(bad[:3])}.")
    hta = [r for r in runs if r["config"] == "hta" and r["child"]]
    if hta:
        h = hta[0]["child"]
        lines.append(f"HTA parsed ranks {h['ranks'][0]}..{h['ranks'][-1]} ({len(h['ranks'])} ranks).")
    return lines


# --------------------------------------------------------------------------- report
def _machine() -> dict:
    def run(cmd):
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return r.stdout.strip()

    cpu = [ln for ln in run(["lscpu"]).splitlines() if ln.split(":")[0] in ("CPU(s)", "Model name")]
    return {"cpu": "; ".join(" ".join(x.split()) for x in cpu), "nproc": os.cpu_count(),
            "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(), "kernel": platform.release()}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for config in CONFIGS:
        ok = [r for r in runs if r["config"] == config and r["rc"] == 0]
        if not ok:
            out[config] = None
            continue
        out[config] = {
            "n": len(ok), "wall_s": [round(r["wall_s"], 2) for r in ok],
            "wall_median_s": statistics.median(r["wall_s"] for r in ok),
            "wall_min_s": min(r["wall_s"] for r in ok),
            "cpu_median_s": statistics.median(r["cpu_s"] for r in ok if r["cpu_s"] is not None),
            "maxrss_max_bytes": max(r["maxrss_bytes"] for r in ok if r["maxrss_bytes"] is not None),
            "tree_rss_max_bytes": max(r["tree_rss_peak_bytes"] for r in ok),
            "load1_before": [round(r["load_before"][0], 2) for r in ok],
            "phases_median_s": {k: statistics.median(r["child"]["seconds"][k] for r in ok)
                                for k in ok[0]["child"]["seconds"]},
        }
    return out


def markdown(result: dict) -> str:
    s, f, m = result["summary"], result["facts"], result["machine"]
    mib = 1 << 20
    lines = [SECTION, "",
             f"Measured {result['when']} by `python3 benchmarks/ranks.py --reps {result['reps']}` "
             f"(raw numbers in `benchmarks/_data/ranks_results.json`, not committed).", "",
             f"Machine: {m['cpu']}; {m['mem_total_gib']} GiB; Linux {m['kernel']}, Python {m['python']}. "
             "Shared with other jobs: the 1-minute load average before each run is in the table "
             "(2 cores, so a load of 2 means the machine was already full).", "",
             f"Data: `benchmarks/make_ranks.py` wrote {f['ranks']} rank traces into `{result['folder']}/`, "
             f"each a copy of the real A100 NCCL fixture (40,573 events, 2,700 kernels of which 21 NCCL) with "
             f"its own `distributedInfo` rank/world size, device, clock shift (0..520 us) and compute stretch "
             f"(1..2%, rank {f['slow_rank']} x{f['slow_factor']}): {f['events']:,} events, {f['kernels']:,} kernels, "
             f"{f['json_bytes'] / mib:,.0f} MiB of JSON, {f['gz_bytes'] / mib:,.0f} MiB gzip'ed.", "",
             "| configuration | wall s: median, min (runs) | CPU s (median) | peak RSS, largest process MiB | "
             "peak RSS, all processes MiB | load1 before | HTA / this: median wall, min wall, CPU |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    hta = s.get("hta")
    for config, label in CONFIGS.items():
        c = s.get(config)
        if c is None:
            lines.append(f"| {label} | failed | | | | | |")
            continue
        ratio = (f"{hta['wall_median_s'] / c['wall_median_s']:.1f}x, {hta['wall_min_s'] / c['wall_min_s']:.1f}x, "
                 f"{hta['cpu_median_s'] / c['cpu_median_s']:.1f}x") if hta and config != "hta" else "1.0x"
        lines.append(f"| {label} | {c['wall_median_s']:.1f}, {c['wall_min_s']:.1f} ({', '.join(f'{w:.1f}' for w in c['wall_s'])}) | "
                     f"{c['cpu_median_s']:.1f} | {c['maxrss_max_bytes'] / mib:,.0f} | {c['tree_rss_max_bytes'] / mib:,.0f} | "
                     f"{', '.join(f'{x:.1f}' for x in c['load1_before'])} | {ratio} |")
    lines += ["", "Phases (median seconds, inside the child):", ""]
    for config, label in CONFIGS.items():
        c = s.get(config)
        if c:
            lines.append(f"- {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in c["phases_median_s"].items()))
    w1, w2, dk = s.get("w1"), s.get("w2"), s.get("dask")
    if w1 and w2 and dk:
        for key, what in (("wall_median_s", "median wall"), ("wall_min_s", "min wall")):
            lines += ["", f"Ratios ({what}): 1 worker / 2 workers = {w1[key] / w2[key]:.2f}x; "
                          f"1 worker / LocalCluster = {w1[key] / dk[key]:.2f}x; "
                          f"LocalCluster / 2 workers = {dk[key] / w2[key]:.2f}x."]
        paired = [(r1["wall_s"] / r2["wall_s"]) for r1 in result["runs"] for r2 in result["runs"]
                  if r1["config"] == "w1" and r2["config"] == "w2" and r1["rep"] == r2["rep"] and not r1["rc"] and not r2["rc"]]
        if paired:
            lines += ["", "1 worker / 2 workers within each round (the two runs back to back): "
                          + ", ".join(f"{x:.2f}x" for x in paired) + "."]
    lines += _side_by_side(result)
    lines += ["", "Checks:", ""] + [f"- {c}" for c in result["checks"]]
    return "\n".join(lines) + "\n"


def _side_by_side(result: dict) -> list[str]:
    """The same per-rank questions answered by both tools, for a few ranks (not a check: the
    definitions differ, see the notes under the table)."""
    ts = next((r["child"] for r in result["runs"] if r["config"] != "hta" and r["child"]), None)
    hta = next((r["child"] for r in result["runs"] if r["config"] == "hta" and r["child"]), None)
    if not ts or not hta or not ts["summaries"] or "overlap_ns" not in ts["summaries"][0]:
        return []
    by_rank = {s["rank"]: s for s in ts["summaries"]}
    ov = {int(x["rank"]): x for x in hta["comm_comp_overlap"]}
    tb = {int(x["rank"]): x for x in hta["temporal_breakdown"]}
    slow = result["facts"].get("slow_rank")
    out = ["", "Per-rank numbers of both tools (first run of each; ms):", "",
           "| rank | HTA comm/comp overlap % | tracestory overlap / comm % | HTA compute | tracestory compute "
           "| HTA idle | tracestory idle |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted({0, 1, slow} - {None}):
        if r not in by_rank or r not in ov or r not in tb:
            continue
        t, o, b = by_rank[r], ov[r], tb[r]
        pct = 100 * t["overlap_ns"] / t["comm_ns"] if t["comm_ns"] else float("nan")
        out.append(f"| {r} | {o['comp_comm_overlap_pctg']:.2f} | {pct:.2f} | {b['compute_time(us)'] / 1e3:.1f} | "
                   f"{t['compute_ns'] / 1e6:.1f} | {b['idle_time(us)'] / 1e3:.1f} | {t['idle_ns'] / 1e6:.1f} |")
    return out


def write_doc(text: str) -> None:
    """Replace this benchmark's section of docs/PERFORMANCE.md (up to the next ``## `` heading), or append it."""
    doc = DOC.read_text()
    start = doc.find(SECTION)
    if start < 0:
        DOC.write_text(doc.rstrip("\n") + "\n\n" + text)
        return
    nxt = doc.find("\n## ", start + len(SECTION))
    # Keep hand-written notes that follow the generated part (marked like the ingest section's).
    notes_at = doc.find("<!-- many-ranks notes -->", start)
    end = notes_at if notes_at >= 0 and (nxt < 0 or notes_at < nxt) else (nxt + 1 if nxt >= 0 else len(doc))
    DOC.write_text(doc[:start] + text + ("\n" if end < len(doc) else "") + doc[end:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--configs", default="w1,w2,dask,hta")
    p.add_argument("--write-doc", action="store_true")
    p.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child == "hta":
        child_hta(a.dir, a.child_out)
        return 0
    if a.child:
        child_tracestory(a.dir, a.child, a.child_out)
        return 0

    facts = ensure_data(a.dir, a.ranks)
    for f in sorted(a.dir.glob("*.json.gz")):  # warm the page cache
        f.read_bytes()
    configs = a.configs.split(",")
    runs = []
    for rep in range(a.reps):
        for config in configs:
            r = measure(config, a.dir, rep)
            runs.append(r)
            print(f"rep {rep} {config}: rc {r['rc']} wall {r['wall_s']:.1f}s cpu {r['cpu_s']} "
                  f"maxrss {r['maxrss_bytes']} tree {r['tree_rss_peak_bytes']} load {r['load_before'][0]:.1f}"
                  + (f"\n{r['stderr_tail']}" if r["rc"] else ""), flush=True)
    result = {"when": time.strftime("%Y-%m-%d %H:%M"), "reps": a.reps, "machine": _machine(),
              "folder": os.path.relpath(a.dir, REPO),
              "facts": {k: v for k, v in facts.items() if k != "per_rank"}, "runs": runs,
              "summary": summarize(runs), "checks": checks(runs, facts)}
    RESULTS.write_text(json.dumps(result, indent=1, default=repr))
    text = markdown(result)
    print(text)
    if a.write_doc:
        write_doc(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
