"""Kineto ingest benchmark: tracestory vs Holistic Trace Analysis vs the floor.

Run from the repository root::

    python3 benchmarks/ingest.py            # builds the data if missing, measures, writes docs/PERFORMANCE.md

What it does
------------
1. Builds (once; reused while the files match) two replicated Kineto traces with
   :mod:`make_kineto` from the real A100 NCCL fixture: a large one (default 1024 MiB of JSON)
   and a small one (default 100 MiB) on which HTA finishes quickly, as ``NAME.json`` and
   ``NAME.json.gz`` under ``benchmarks/_data/``.
2. For each trace, runs every tool as its own child process and takes wall time (monotonic
   clock around spawn..reap) and the command's peak RSS ("Maximum resident set size") and CPU
   time (user + system) from GNU ``time`` wrapped around it:

   * floor: ``zcat FILE.json.gz`` and ``cat FILE.json``, stdout to /dev/null;
   * tracestory: ``tracestory analyze FILE.json.gz --json /dev/null`` (the CLI end to end,
     terminal tables to /dev/null), and the same on the plain ``FILE.json``;
   * HTA: ``hta_run.py`` in a venv with ``traceinsight``: ``TraceAnalysis(trace_dir=DIR)`` on a
     folder holding only a link to ``FILE.json.gz``, then ``get_gpu_kernel_breakdown``.

   The fast tools run ``--reps`` times round-robin (so load from other processes on a shared
   machine spreads over all of them) and the median is reported; HTA is repeated only when one
   run takes under ``--hta-repeat-below`` seconds. Every file is read once before timing so all
   tools see a warm page cache. HTA runs under an address-space cap (``--hta-mem-cap-gib``) and
   a time limit (``--hta-timeout``); hitting either is recorded, not retried.
3. Cross-checks the numbers (untimed runs): tracestory's ``gpu.kernel_count``,
   ``kernel_time_ns``, ``memop_count``, ``memop_time_ns`` against sums taken straight from the
   source fixture's JSON times the copy count (:func:`make_kineto.build` facts), and against HTA
   on the small trace with HTA's ns rounding off (``HTA_DISABLE_NS_ROUNDING=1``) and its last
   profiler step kept; HTA's default kernel count is checked against the count its filter
   should keep, computed from the source JSON.
4. Writes ``benchmarks/_data/ingest_results.json`` and the section ``## Kineto ingest`` of
   ``docs/PERFORMANCE.md`` (other sections of that file are kept).

Ratios and targets: HTA wall / tracestory wall >= 10; tracestory peak RSS /
uncompressed JSON bytes <= 2; tracestory wall / ``zcat`` wall <= 5.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import make_kineto
from ingest_report import section, targets, write_doc

DATA = HERE / "_data"
MIB = 1 << 20


# --------------------------------------------------------------------------- measuring
def _tree_sampler(pid: int, stop: threading.Event, out: dict) -> None:
    """Every 20 ms, the resident memory of ``pid`` and all its descendants: the largest sum of
    RSS (shared pages counted once per process: an upper bound) and of PSS (shared pages split
    between the processes that map them) seen. A peak shorter than the period can be missed."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    while not stop.wait(0.02):
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        for p in procs:
            try:
                m = p.memory_full_info()
            except psutil.Error:
                continue
            rss += m.rss
            pss += getattr(m, "pss", m.rss)
        out["tree_rss_bytes"] = max(out.get("tree_rss_bytes", 0), rss)
        out["tree_pss_bytes"] = max(out.get("tree_pss_bytes", 0), pss)
        out["tree_procs"] = max(out.get("tree_procs", 0), len(procs))


def measure(cmd: list[str], *, env: dict | None = None, timeout_s: float | None = None,
            mem_cap_bytes: int | None = None, tree: bool = False) -> dict:
    """Run ``cmd`` once: wall time, and peak RSS and CPU time of the command alone.

    Peak RSS and CPU come from GNU ``time`` wrapped around the command, not from ``os.wait4`` on
    a child of this process: a child forked from this Python process is charged this process's
    resident pages until it execs, which would put tens of MiB on ``zcat``. ``prlimit --as``
    applies the address-space cap; the command gets its own session so a timeout can kill all of it.
    GNU time's CPU includes the children the command waited for (its worker processes); its peak
    RSS is one process's. ``tree``: also sample the whole process tree's memory
    (:func:`_tree_sampler`: ``tree_rss_bytes``, ``tree_pss_bytes``).
    """
    # Per-process names: two benchmark runs at once must not read each other's GNU time output.
    stats_path = DATA / f"time_{os.getpid()}.txt"
    err_path = DATA / f"stderr_{os.getpid()}.txt"
    stats_path.unlink(missing_ok=True)
    wrapped = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(stats_path)]
    if mem_cap_bytes:
        wrapped += ["prlimit", f"--as={mem_cap_bytes}", "--"]
    wrapped += cmd
    load1 = os.getloadavg()[0]
    with open(err_path, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(wrapped, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
        sampled: dict = {}
        stop = threading.Event()
        sampler = threading.Thread(target=_tree_sampler, args=(proc.pid, stop, sampled), daemon=True)
        if tree:
            sampler.start()
        try:
            rc = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            timed_out = True
        wall = time.monotonic() - t0
        stop.set()
        if tree:
            sampler.join()
    maxrss_bytes, cpu = None, None  # unknown (not 0) when the run was killed, GNU time with it
    lines = stats_path.read_text().strip().splitlines() if stats_path.exists() else []
    if lines:
        last = lines[-1].split()
        maxrss_bytes, cpu = int(last[0]) * 1024, float(last[1]) + float(last[2])
    stderr_tail = err_path.read_bytes()[-2000:].decode(errors="replace")
    stats_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return {
        "cmd": cmd, "rc": rc, "timed_out": timed_out, "wall_s": wall,
        "maxrss_bytes": maxrss_bytes, "cpu_s": cpu,
        "load1_before": load1, "stderr_tail": stderr_tail if rc else "", **sampled,
    }


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["rc"] == 0]
    if not ok:
        return {"ok": False, "runs": runs}
    return {
        "ok": True, "n": len(ok), "runs": runs,
        "wall_s": statistics.median(r["wall_s"] for r in ok),
        "wall_min_s": min(r["wall_s"] for r in ok), "wall_max_s": max(r["wall_s"] for r in ok),
        "cpu_s": statistics.median(cpus) if (cpus := [r["cpu_s"] for r in ok if r["cpu_s"] is not None]) else None,
        "maxrss_bytes": max(rss) if (rss := [r["maxrss_bytes"] for r in ok if r["maxrss_bytes"] is not None]) else None,
    }


# --------------------------------------------------------------------------- inputs
def ensure_trace(stem: Path, mib: float, source: Path) -> dict:
    """Build ``stem.json``/``.json.gz`` unless files from an earlier run still match."""
    target = int(mib * MIB)
    facts_path = stem.with_suffix(".facts.json")
    if facts_path.exists():
        facts = json.loads(facts_path.read_text())
        js, gz = stem.with_suffix(".json"), stem.with_suffix(".json.gz")
        if (Path(facts.get("source", "")).name == source.name and js.exists() and gz.exists()
                and js.stat().st_size == facts["json_bytes"] and gz.stat().st_size == facts["gz_bytes"]
                and target <= facts["json_bytes"] < target * 1.2):
            return facts
    return make_kineto.build(stem, target, source)


def hta_python(venv: Path) -> Path:
    """The venv's python with ``traceinsight`` (import name ``hta``), created on first use."""
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if subprocess.run([str(py), "-c", "import hta"], check=False, capture_output=True).returncode != 0:
        subprocess.run([str(py), "-m", "pip", "install", "-q", "traceinsight"], check=True)
    return py


def pkg_version(py: Path | str, dist: str) -> str | None:
    r = subprocess.run([str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                       check=False, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def hta_default_expected_count(source: Path, copies: int) -> int:
    """GPU events HTA's default filter keeps, computed from the source JSON alone.

    HTA keeps a GPU event (one with a ``stream`` arg) only if a CPU-side event with the same
    ``args.correlation`` starts before the last ``ProfilerStep`` of the trace starts. In the
    replicated trace only the last copy holds the last step, so every other copy keeps all GPU
    events with a CPU-side partner, and the last copy keeps those launched before its last step.
    """
    with gzip.open(source, "rb") as f:
        events = json.load(f)["traceEvents"]
    last_step = max(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    cpu_ts: dict[int, float] = {}
    gpu_corr = []
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") != "X" or "correlation" not in args:
            continue
        if "stream" in args:
            gpu_corr.append(args["correlation"])
        else:
            c = args["correlation"]
            cpu_ts[c] = min(cpu_ts.get(c, e["ts"]), e["ts"])
    with_cpu = sum(1 for c in gpu_corr if c in cpu_ts)
    before_last = sum(1 for c in gpu_corr if c in cpu_ts and cpu_ts[c] < last_step)
    return (copies - 1) * with_cpu + before_last


# --------------------------------------------------------------------------- one trace
def bench_trace(label: str, facts: dict, stem: Path, py_hta: Path, a) -> dict:
    js, gz = stem.with_suffix(".json"), stem.with_suffix(".json.gz")
    ts_bin = [sys.executable, "-m", "tracestory.cli"]  # this checkout's code (PYTHONPATH), not an installed one
    hta_dir = DATA / f"hta_{stem.name}"
    hta_dir.mkdir(exist_ok=True)
    link = hta_dir / gz.name
    if not link.exists():
        link.symlink_to(os.path.relpath(gz, hta_dir))

    for f in (gz, js):  # warm the page cache: every tool reads from memory, none from disk
        subprocess.run(["cat", str(f)], stdout=subprocess.DEVNULL, check=True)

    fast = {
        "floor_zcat_gz": ["zcat", str(gz)],
        "floor_cat_json": ["cat", str(js)],
        "tracestory_gz": [*ts_bin, "analyze", str(gz), "--json", "/dev/null"],
        "tracestory_json": [*ts_bin, "analyze", str(js), "--json", "/dev/null"],
    }
    runs: dict[str, list] = {k: [] for k in fast}
    for _ in range(a.reps):  # round-robin
        for k, cmd in fast.items():
            runs[k].append(measure(cmd))
    result = {"label": label, "facts": facts, "tools": {k: summarize(v) for k, v in runs.items()}}

    if not a.skip_hta:
        hta_out = DATA / f"hta_result_{stem.name}.json"
        cmd = [str(py_hta), str(HERE / "hta_run.py"), str(hta_dir), str(hta_out)]
        hta_runs = [measure(cmd, timeout_s=a.hta_timeout, mem_cap_bytes=int(a.hta_mem_cap_gib * (1 << 30)))]
        if hta_runs[0]["rc"] == 0 and hta_runs[0]["wall_s"] < a.hta_repeat_below:
            hta_runs += [measure(cmd, timeout_s=a.hta_timeout, mem_cap_bytes=int(a.hta_mem_cap_gib * (1 << 30)))
                         for _ in range(a.reps - 1)]
        result["tools"]["hta_gz"] = summarize(hta_runs)
        if hta_runs[-1]["rc"] == 0:
            result["hta_default_output"] = json.loads(hta_out.read_text())
            result["hta_default_expected_gpu_events"] = hta_default_expected_count(Path(facts["source"]), facts["copies"])
    result["checks"] = checks(stem, facts, py_hta, hta_dir, with_hta=a.hta_check and not a.skip_hta and label == "small")
    return result


def checks(stem: Path, facts: dict, py_hta: Path, hta_dir: Path, with_hta: bool) -> dict:
    """Untimed runs whose numbers are compared with independent sums."""
    out_json = DATA / f"tracestory_{stem.name}.json"
    r = subprocess.run([sys.executable, "-m", "tracestory.cli", "analyze", str(stem.with_suffix(".json.gz")), "--json", str(out_json)],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    c: dict = {"tracestory_rc": r.returncode, "tracestory_stderr": r.stderr[-2000:]}
    if r.returncode == 0:
        gpu = json.loads(out_json.read_text())["traces"][0]["gpu"]
        c["tracestory"] = {k: gpu.get(k) for k in ("kernel_count", "kernel_time_ns", "memop_count", "memop_time_ns", "busy_ns")}
        c["source_sums"] = {
            "kernel_count": facts["kernels"], "kernel_time_ns": facts["kernel_time_ns"],
            "memop_count": facts["memcpy"] + facts["memset"], "memop_time_ns": facts["memop_time_ns"],
        }
        c["tracestory_equals_source_sums"] = all(c["tracestory"][k] == v for k, v in c["source_sums"].items())
    if with_hta:
        hta_out = DATA / f"hta_check_{stem.name}.json"
        env = {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"}
        h = subprocess.run([str(py_hta), str(HERE / "hta_run.py"), str(hta_dir), str(hta_out),
                            "--include-last-profiler-step"], check=False, env=env, capture_output=True, text=True)
        c["hta_check_rc"] = h.returncode
        if h.returncode == 0:
            rank = json.loads(hta_out.read_text())["per_rank"]["0"]
            c["hta_no_rounding_all_steps"] = rank
            if "tracestory" in c:
                ts = c["tracestory"]
                ts_total_ns = ts["kernel_time_ns"] + ts["memop_time_ns"]
                c["hta_gpu_time_ns"] = round(rank["gpu_dur_sum_us"] * 1000)
                c["tracestory_gpu_time_ns"] = ts_total_ns
                c["hta_gpu_events"] = rank["gpu_events"]
                c["tracestory_gpu_events"] = ts["kernel_count"] + ts["memop_count"]
                # HTA sums float microseconds; one ns of slack covers that float sum.
                c["hta_equals_tracestory"] = (abs(c["hta_gpu_time_ns"] - ts_total_ns) <= 1
                                              and rank["gpu_events"] == c["tracestory_gpu_events"])
        else:
            c["hta_check_stderr"] = h.stderr[-2000:]
    return c


# --------------------------------------------------------------------------- profile
_PROFILE_SNIPPET = """
import cProfile, sys
from tracestory.cli import main
sys.argv = ["tracestory", "analyze", sys.argv[1], "--json", "/dev/null"]
cProfile.run("main()", {out!r})
"""


def profile_tracestory(gz: Path) -> dict:
    """cProfile of ``tracestory analyze FILE --json /dev/null`` (untimed; cProfile slows Python-level
    code, so read the shares, not the seconds): own time per function and cumulative time of the
    tracestory functions."""
    import pstats

    out = DATA / "profile_tracestory.prof"
    code = _PROFILE_SNIPPET.format(out=str(out))
    r = subprocess.run([sys.executable, "-c", code, str(gz)], check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return {"rc": r.returncode, "stderr": r.stderr[-2000:]}
    st = pstats.Stats(str(out))
    total = st.total_tt

    def where(func):
        file, line, name = func
        if file.startswith("~") or file == "<built-in>":
            return name  # a builtin or C method, e.g. "<method 'decode' of 'msgspec.json.Decoder' objects>"
        parts = Path(file).parts
        short = "/".join(parts[parts.index("tracestory"):]) if "tracestory" in parts else Path(file).name
        return f"{short}:{line} {name}"

    rows = [(where(f), v[2], v[3]) for f, v in st.stats.items()]  # (name, tottime, cumtime)
    own = sorted(rows, key=lambda r: -r[1])[:12]
    cum = sorted((r for r in rows if r[0].startswith("tracestory/")), key=lambda r: -r[2])[:14]
    return {"rc": 0, "file": str(gz), "total_s": total,
            "own": [{"func": n, "own_s": t, "cum_s": c} for n, t, c in own],
            "cumulative": [{"func": n, "own_s": t, "cum_s": c} for n, t, c in cum]}


# --------------------------------------------------------------------------- environment
def machine() -> dict:
    def sh(cmd):
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, shell=True)
        return r.stdout.strip()

    return {
        "cpu": sh("lscpu | grep -E '^(Model name|Architecture|CPU\\(s\\)|Thread|Core|Socket)' | sed 's/  */ /g'"),
        "nproc": sh("nproc"),
        "free_g": sh("free -g"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Kineto ingest benchmark: tracestory vs HTA vs the floor.")
    p.add_argument("--large-mib", type=float, default=1024)
    p.add_argument("--small-mib", type=float, default=100)
    p.add_argument("--source", type=Path, default=make_kineto.DEFAULT_SOURCE)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--hta-timeout", type=float, default=1200, help="seconds (default 1200)")
    p.add_argument("--hta-mem-cap-gib", type=float, default=16, help="address-space cap for HTA (default 16)")
    p.add_argument("--hta-repeat-below", type=float, default=120,
                   help="repeat HTA --reps times only if one run is faster than this many seconds")
    p.add_argument("--hta-venv", type=Path, default=DATA / "hta-venv")
    p.add_argument("--skip-hta", action="store_true")
    p.add_argument("--no-hta-check", dest="hta_check", action="store_false")
    p.add_argument("--no-doc", action="store_true", help="do not touch docs/PERFORMANCE.md")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip the cProfile run of tracestory on the large trace")
    p.add_argument("--profile-only", action="store_true",
                   help="only (re)do the profile, reusing benchmarks/_data/ingest_results.json, and rewrite the doc")
    a = p.parse_args(argv)

    if a.profile_only:
        results_path = DATA / "ingest_results.json"
        results = json.loads(results_path.read_text())
        stem = DATA / f"kineto_a100_{int(a.large_mib)}mib"
        results["profile"] = profile_tracestory(stem.with_suffix(".json.gz"))
        results_path.write_text(json.dumps(results, indent=1) + "\n")
        text = section(results)
        if not a.no_doc:
            write_doc(text)
        print(text)
        return 0

    DATA.mkdir(parents=True, exist_ok=True)
    # A trial run with --no-doc must not overwrite the results the doc was rendered from.
    results_path = DATA / ("ingest_results.nodoc.json" if a.no_doc else "ingest_results.json")
    py_hta = None if a.skip_hta else hta_python(a.hta_venv)
    versions = {"tracestory": pkg_version(sys.executable, "tracestory"), "msgspec": pkg_version(sys.executable, "msgspec"),
                "numpy": pkg_version(sys.executable, "numpy")}
    if py_hta:
        versions |= {"traceinsight (HTA)": pkg_version(py_hta, "traceinsight"), "pandas (HTA)": pkg_version(py_hta, "pandas")}
    results = {"machine": machine(), "versions": versions, "args": {k: str(v) for k, v in vars(a).items()}, "traces": []}
    results["args"]["reps"] = a.reps
    for label, mib in (("large", a.large_mib), ("small", a.small_mib)):
        stem = DATA / f"kineto_a100_{int(mib)}mib"
        print(f"[{label}] data {stem.name} ...", file=sys.stderr, flush=True)
        facts = ensure_trace(stem, mib, a.source)
        print(f"[{label}] measuring ...", file=sys.stderr, flush=True)
        t = bench_trace(label, facts, stem, py_hta, a)
        t["hta_timeout_s"] = a.hta_timeout
        t["targets"] = targets(t)
        results["traces"].append(t)
        results_path.write_text(json.dumps(results, indent=1) + "\n")
    if a.profile:
        print("[large] profiling tracestory ...", file=sys.stderr, flush=True)
        results["profile"] = profile_tracestory((DATA / f"kineto_a100_{int(a.large_mib)}mib").with_suffix(".json.gz"))
        results_path.write_text(json.dumps(results, indent=1) + "\n")
    text = section(results)
    if not a.no_doc:
        write_doc(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
