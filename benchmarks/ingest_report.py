"""Rendering of the ingest benchmark's results (``benchmarks/ingest.py``) as the
``## Kineto ingest`` section of ``docs/PERFORMANCE.md``: tables, target verdicts,
cross-checks and the profile. Pure functions of the results dict, so the section can be
re-rendered from ``benchmarks/_data/ingest_results.json`` without measuring again.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "PERFORMANCE.md"
SECTION = "## Kineto ingest"
MIB = 1 << 20


def _mib(b):
    return b / MIB


def _num(v, fmt: str) -> str:
    """A measured value, or "n/a" when it is unknown (None)."""
    return "n/a" if v is None else format(v, fmt)


def _fmt_tool_row(name: str, s: dict, zcat: dict | None, ts: dict | None) -> str:
    if not s.get("ok"):
        r = s["runs"][-1]
        why = "timed out" if r["timed_out"] else f"exit {r['rc']}"
        rss = f"{_mib(r['maxrss_bytes']):,.0f}" if r["maxrss_bytes"] is not None else "n/a (killed)"
        return f"| {name} | failed ({why}) after {r['wall_s']:.1f} | {rss} | | | | 1 |"
    vs_floor = f"{s['wall_s'] / zcat['wall_s']:.1f}x" if zcat and zcat.get("ok") else ""
    vs_ts = f"{s['wall_s'] / ts['wall_s']:.1f}x" if ts and ts.get("ok") else ""
    spread = f" ({s['wall_min_s']:.2f}-{s['wall_max_s']:.2f})" if s["n"] > 1 else ""
    rss = None if s["maxrss_bytes"] is None else _mib(s["maxrss_bytes"])
    return (f"| {name} | {s['wall_s']:.2f}{spread} | {_num(rss, ',.0f')} | {_num(s['cpu_s'], '.2f')} | "
            f"{vs_floor} | {vs_ts} | {s['n']} |")


def section(results: dict) -> str:
    m = results["machine"]
    lines = [SECTION, "",
             f"Measured {m['date']} by `python3 benchmarks/ingest.py` (one run; raw numbers in "
             "`benchmarks/_data/ingest_results.json`, not committed).", "",
             "### Machine", "", "```", m["cpu"], f"nproc: {m['nproc']}", m["free_g"],
             f"Linux {m['kernel']}, Python {m['python']}", "```", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) + ".", "",
             "The machine is shared with other jobs (see `load1`, the 1-minute load average before each "
             "run, in the raw results), so wall times carry noise; CPU time (user + system of the child) "
             "is given beside them.", "",
             "### Data", "",
             "Built by `benchmarks/make_kineto.py` from the real A100 NCCL fixture "
             "(`kineto_a100_nccl_allreduce_rank0of2.json.gz`, 40,573 events, 9.8 MB of JSON): copy *k* "
             "of its events has `ts` shifted by *k* x (trace span + 20..200 us of jitter) and every id "
             "(correlation, External id, Record function id, Ev Idx, Sequence number, flow id) shifted "
             "by *k* x (max id + 1), `ProfilerStep#N` renumbered; metadata and the profiler span "
             "appear once; top-level keys (deviceProperties, distributedInfo, ...) kept. Streamed to "
             "`.json` and gzip (level 6) `.json.gz`.", "",
             "| trace | copies | events | kernels | memcpy + memset | JSON bytes | gzip bytes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in results["traces"]:
        f = t["facts"]
        lines.append(f"| `{Path(f['source']).name}` x{f['copies']} ({t['label']}) | {f['copies']} | {f['events']:,} | "
                     f"{f['kernels']:,} | {f['memcpy'] + f['memset']:,} | {f['json_bytes']:,} "
                     f"({_mib(f['json_bytes']):,.0f} MiB) | {f['gz_bytes']:,} ({_mib(f['gz_bytes']):,.0f} MiB) |")
    lines += ["", "### Commands", "", "```",
              "zcat FILE.json.gz > /dev/null                                     # floor, gzip",
              "cat FILE.json > /dev/null                                         # floor, plain JSON",
              "tracestory analyze FILE.json.gz --json /dev/null > /dev/null      # tracestory, end to end",
              "tracestory analyze FILE.json --json /dev/null > /dev/null",
              "benchmarks/_data/hta-venv/bin/python benchmarks/hta_run.py DIR OUT.json",
              "    # HTA: TraceAnalysis(trace_dir=DIR) + get_gpu_kernel_breakdown(visualize=False),",
              "    # DIR holds only a link to FILE.json.gz; pip install traceinsight (import hta)",
              "```", "",
              "Each command runs as its own child process; wall = spawn to reap on a monotonic clock; "
              "peak RSS = maximum resident set size from GNU `time` wrapped around the command; CPU s = its user + system time. Files are read once before timing "
              "(warm page cache). Fast commands: median of "
              f"{results['args']['reps']} round-robin repetitions, (min-max) beside it.", ""]
    for t in results["traces"]:
        tools = t["tools"]
        f = t["facts"]
        zc, ts = tools.get("floor_zcat_gz"), tools.get("tracestory_gz")
        lines += [f"### {t['label']} trace: {_mib(f['json_bytes']):,.0f} MiB JSON, {f['events']:,} events", "",
                  "| tool | wall s (median, min-max) | peak RSS MiB | CPU s | wall vs zcat | wall vs tracestory .gz | runs |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        names = {"floor_zcat_gz": "floor: `zcat` .json.gz", "floor_cat_json": "floor: `cat` .json",
                 "tracestory_gz": "tracestory .json.gz", "tracestory_json": "tracestory .json",
                 "hta_gz": "HTA .json.gz"}
        for k, label in names.items():
            if k in tools:
                lines.append(_fmt_tool_row(label, tools[k], zc, ts))
        lines += [""]
        lines += targets_lines(t)
        lines += checks_lines(t)
        lines += [""]
    lines += profile_lines(results.get("profile"))
    return "\n".join(lines).rstrip() + "\n"


def _ratio(a, b):
    """a / b, or None when either is unknown (a run whose RSS/CPU could not be read)."""
    return None if a is None or b is None or b == 0 else a / b


def targets(t: dict) -> dict:
    tools, f = t["tools"], t["facts"]
    out = {}
    ts, zc, hta = tools.get("tracestory_gz"), tools.get("floor_zcat_gz"), tools.get("hta_gz")
    if ts and ts.get("ok"):
        out["rss_over_json"] = _ratio(ts["maxrss_bytes"], f["json_bytes"])
        if zc and zc.get("ok"):
            out["wall_over_zcat"] = ts["wall_s"] / zc["wall_s"]
            out["cpu_over_zcat"] = _ratio(ts["cpu_s"], zc["cpu_s"])
        if hta and hta.get("ok"):
            out["hta_over_tracestory_wall"] = hta["wall_s"] / ts["wall_s"]
            out["hta_over_tracestory_cpu"] = _ratio(hta["cpu_s"], ts["cpu_s"])
            out["hta_over_tracestory_rss"] = _ratio(hta["maxrss_bytes"], ts["maxrss_bytes"])
    return out


def _x(v, fmt=".1f") -> str:
    return "n/a" if v is None else f"{v:{fmt}}x"


def _verdict(v, limit: float, at_least: bool) -> str:
    if v is None:
        return "unknown (not measured)"
    if at_least:
        return "holds" if v >= limit else f"fails (needs {limit / v:.1f}x more)"
    return "holds" if v <= limit else f"fails by {v / limit:.2f}x"


def targets_lines(t: dict) -> list[str]:
    r = targets(t)
    hta = t["tools"].get("hta_gz")
    lines = ["Targets (tracestory on the .json.gz):", ""]
    if "hta_over_tracestory_wall" in r:
        v = r["hta_over_tracestory_wall"]
        lines.append(f"- faster than HTA >= 10x: **{v:.1f}x** -> {_verdict(v, 10, True)}"
                     f" (CPU time {_x(r['hta_over_tracestory_cpu'])}; HTA peak RSS {_x(r['hta_over_tracestory_rss'])} tracestory's)")
    elif hta is not None:
        run = hta["runs"][-1]
        rss = "n/a" if run["maxrss_bytes"] is None else f"{_mib(run['maxrss_bytes']):,.0f} MiB"
        why = (f"stopped by the {t.get('hta_timeout_s', 0):.0f} s limit" if run["timed_out"]
               else f"exited {run['rc']} after {run['wall_s']:.0f} s (peak RSS {rss}): "
               f"`{run['stderr_tail'].strip().splitlines()[-1] if run['stderr_tail'].strip() else ''}`")
        lines.append(f"- faster than HTA >= 10x: HTA did not finish: {why}")
    if "rss_over_json" in r:
        v = r["rss_over_json"]
        lines.append(f"- peak RSS <= 2x the JSON size: **{_x(v, '.2f')}** -> {_verdict(v, 2, False)}")
    tj = t["tools"].get("tracestory_json")
    if tj and tj.get("ok"):
        v = _ratio(tj["maxrss_bytes"], t["facts"]["json_bytes"])
        lines.append(f"- (same target, tracestory on the plain .json: **{_x(v, '.2f')}** -> {_verdict(v, 2, False)})")
    if "wall_over_zcat" in r:
        v = r["wall_over_zcat"]
        lines.append(f"- within 5x of the floor (`zcat`): **{v:.1f}x** -> {_verdict(v, 5, False)}"
                     f" (CPU time {_x(r['cpu_over_zcat'])})")
    return lines + [""]


def checks_lines(t: dict) -> list[str]:
    c = t["checks"]
    lines = ["Same numbers (untimed runs):", ""]
    if "tracestory" in c:
        ts, src = c["tracestory"], c["source_sums"]
        lines.append(f"- tracestory `gpu.kernel_count` {ts['kernel_count']:,}, `kernel_time_ns` {ts['kernel_time_ns']:,}, "
                     f"`memop_count` {ts['memop_count']:,}, `memop_time_ns` {ts['memop_time_ns']:,}; "
                     f"sums straight from the source JSON x copies: {src['kernel_count']:,}, {src['kernel_time_ns']:,}, "
                     f"{src['memop_count']:,}, {src['memop_time_ns']:,} -> "
                     f"{'equal' if c['tracestory_equals_source_sums'] else 'DIFFERENT'}.")
    else:
        lines.append(f"- tracestory check run failed: `{c.get('tracestory_stderr', '').strip()[-300:]}`")
    if "hta_gpu_time_ns" in c:
        lines.append(f"- HTA (`HTA_DISABLE_NS_ROUNDING=1`, `include_last_profiler_step=True`): {c['hta_gpu_events']:,} GPU "
                     f"events, {c['hta_gpu_time_ns']:,} ns of kernel + memory-op time; tracestory: "
                     f"{c['tracestory_gpu_events']:,} and {c['tracestory_gpu_time_ns']:,} ns -> "
                     f"{'equal' if c['hta_equals_tracestory'] else 'DIFFERENT'}.")
    elif "hta_check_rc" in c:
        lines.append(f"- HTA check run failed (exit {c['hta_check_rc']}).")
    if "hta_default_output" in t:
        rank = t["hta_default_output"]["per_rank"]["0"]
        exp = t["hta_default_expected_gpu_events"]
        lines.append(f"- HTA with its defaults (the timed run) keeps {rank['gpu_events']:,} GPU events "
                     f"({rank['gpu_dur_sum_us'] * 1000:,.0f} ns): it drops kernels launched in the last ProfilerStep "
                     f"and rounds each event inward to whole microseconds (`ceil(ts)`, `floor(ts + dur)`). The count "
                     f"its filter should keep, from the source JSON: {exp:,} -> "
                     f"{'equal' if exp == rank['gpu_events'] else 'DIFFERENT'}.")
    return lines


NOTES_BEGIN, NOTES_END = "<!-- notes: kept when the benchmark rewrites this section -->", "<!-- /notes -->"


def write_doc(text: str) -> None:
    """Replace our section of docs/PERFORMANCE.md (other sections stay). A hand-written block
    between NOTES_BEGIN and NOTES_END inside the old section is carried over to the new one."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    if DOC.exists():
        old = DOC.read_text()
        start = old.find(SECTION)
        if start >= 0:
            nxt = old.find("\n## ", start + len(SECTION))
            old_section = old[start:nxt + 1] if nxt >= 0 else old[start:]
            a, b = old_section.find(NOTES_BEGIN), old_section.find(NOTES_END)
            if 0 <= a < b:
                text = text.rstrip() + "\n\n" + old_section[a:b + len(NOTES_END)] + "\n"
            new = old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
        else:
            new = old.rstrip() + "\n\n" + text
    else:
        new = "# Performance\n\n" + text
    DOC.write_text(new)


def profile_lines(p: dict | None) -> list[str]:
    if not p:
        return []
    lines = ["### Where tracestory's time goes", ""]
    if p["rc"] != 0:
        return lines + [f"cProfile run failed: `{p['stderr'].strip()[-300:]}`", ""]
    lines += [f"cProfile of `tracestory analyze {Path(p['file']).name} --json /dev/null` "
              f"({p['total_s']:.1f} s under the profiler, which inflates Python-level code; read shares).", "",
              "Own time (top functions):", "", "| function | own s | share | cumulative s |", "| --- | ---: | ---: | ---: |"]
    for r in p["own"]:
        lines.append(f"| `{r['func']}` | {r['own_s']:.2f} | {100 * r['own_s'] / p['total_s']:.0f}% | {r['cum_s']:.2f} |")
    lines += ["", "Cumulative time of tracestory functions:", "", "| function | cumulative s | share |", "| --- | ---: | ---: |"]
    for r in p["cumulative"]:
        lines.append(f"| `{r['func']}` | {r['cum_s']:.2f} | {100 * r['cum_s'] / p['total_s']:.0f}% |")
    return lines + [""]
