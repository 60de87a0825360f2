"""The re-audit of issue 25, as a script: generate the cases a new user would hit, run each one,
classify its outcome, print the counts table of docs/RELIABILITY.md.

    PYTHONPATH=src python3 tests/reliability/reaudit.py [--class inputs] [--json out.json]
        [--sample N] [--workers 2] [--subprocess] [--show-failures]

Classes: ``inputs`` (every reader x damage x command, :mod:`reaudit_inputs`), ``outputs`` (every
output flag x target, :mod:`reaudit_commands`; ``load``'s output flags too when ``load`` runs),
``subcommands``
(help and wrong flags), ``server`` (HTTP exchanges with ``tracestory serve --preset tiny`` on
loopback) and ``load`` (``tracestory load`` against that server, stub servers that misbehave, a
closed port, bad URLs, wrong flags; :mod:`reaudit_net`). The runner and the judge are
:mod:`reaudit_run` (outcomes and failure kinds in its docstring). ``--sample N`` runs every
N-th case of each class and the undamaged cases they are held to (the test suite's smoke test).
Exit code 1 when any case failed.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reaudit_commands  # noqa: E402
import reaudit_inputs  # noqa: E402
import reaudit_net  # noqa: E402
from reaudit_run import FAILURES, OK, REPO, Case, judge, preload, run_case  # noqa: E402

CLASSES = ("inputs", "outputs", "subcommands", "server", "load")
NET_FAILURES = ("http-500", "no-answer", "health-lost", "server-died")


def _work_env(work: Path) -> dict[str, str]:
    """The pristine files the output and subcommand cases read."""
    p = work / "pristine"
    p.mkdir(parents=True, exist_ok=True)
    inp = p / "decode.trace.json.gz"
    if not inp.exists():
        shutil.copy(reaudit_inputs.DATA / "graphs/manual_graph_decode.trace.json.gz", inp)
    peer = p / "decode_b.trace.json.gz"
    if not peer.exists():
        shutil.copy(reaudit_inputs.DATA / "compare/decode_default_b.trace.json.gz", peer)
    ranks = p / "ranks_tp2"
    if not ranks.exists():
        shutil.copytree(reaudit_inputs.DATA / "multigpu/tp2_even", ranks)
    report = p / "report.md"
    if not report.exists():
        subprocess.run([sys.executable, "-m", "tracestory.cli", "report", str(inp), "-o", str(report)], check=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "src")), stdout=subprocess.DEVNULL)
    for f in (inp, peer, report):
        f.chmod(0o644)
    return {"INPUT": str(inp), "PEER": str(peer), "REPORT": str(report), "RANKS": str(ranks)}


def _init(env: dict[str, str], work: str) -> None:
    i, w = env["INPUT"], str(Path(work) / "warm")
    preload([["report", i, "-o", w + ".md", "--json", w + ".json", "--html"], ["analyze", i, "--table", "kernels"],
             ["categories", i, "-o", w + ".c.json"], ["export", "perfetto", i, "-o", w + ".p.json.gz"],
             ["compare", i, env["PEER"], "-o", w + ".cmp.md", "--json", w + ".cmp.json"],
             ["check", env["REPORT"], "--json", w + ".chk.json"], ["ranks", env["RANKS"], "--workers", "1"],
             ["analyze", str(reaudit_inputs.DATA / "nsys_graphs/graph_whole.sqlite")],
             ["analyze", str(reaudit_inputs.DATA / "ncu/triton_rmsnorm_raw.csv.gz")]])


def _run(arg: tuple[Case, str, bool]) -> tuple[Case, dict]:
    case, root, sub = arg
    return case, run_case(case, root, sub)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--class", dest="classes", action="append", choices=CLASSES, help="only this class (repeatable)")
    ap.add_argument("--json", help="write every case with its outcome here")
    ap.add_argument("--sample", type=int, default=1, help="run every N-th case of each class")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--subprocess", action="store_true", help="a real python -m tracestory.cli per case (slower)")
    ap.add_argument("--show-failures", action="store_true", help="print each failed case with its command")
    ap.add_argument("--work", help="work folder (default: a temporary one, removed after)")
    args = ap.parse_args(argv)
    classes = args.classes or list(CLASSES)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="reaudit-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    t0 = time.monotonic()
    env = _work_env(work)
    cases: list[Case] = []
    if "inputs" in classes:
        cases += reaudit_inputs.cases(work)
    if "outputs" in classes:
        cases += reaudit_commands.output_cases(env)
    if "subcommands" in classes:
        cases += reaudit_commands.subcommand_cases(env)
    records: list[dict] = []
    procs = []
    url = None
    try:
        if "server" in classes or "load" in classes:   # load's output flags count as outputs, run with load
            srv_recs, url, srv = _server(work, "server" in classes, args.sample)
            procs.append(srv)
            records += srv_recs
            stub_proc, stubs = reaudit_net.start_stub()
            procs.append(stub_proc)
            net = reaudit_net.load_cases(url, stubs)
            cases += [c for c in net if c.cls in classes or c.cls == "outputs" and "load" in classes]
        if args.sample > 1:
            by = collections.defaultdict(list)
            for c in cases:
                by[c.cls].append(c)
            # every N-th case, and every undamaged case the damaged ones are held to
            cases = [c for cs in by.values() for i, c in enumerate(cs) if i % args.sample == 0
                     or "/pristine/" in c.name]
        runs = work / "runs"
        ctx = multiprocessing.get_context("fork")
        done = 0
        with ctx.Pool(args.workers, initializer=_init, initargs=(env, str(work))) as pool:
            for case, rec in pool.imap_unordered(_run, [(c, str(runs), args.subprocess) for c in cases]):
                rec["case"] = case
                records.append(rec)
                done += 1
                if done % 100 == 0:
                    print(f"  {done}/{len(cases)} cases, {done / (time.monotonic() - t0):.1f}/s", file=sys.stderr)
    finally:
        for p in procs:
            reaudit_net.stop(p)
    if "server" in classes:
        records += reaudit_net.server_tracebacks(work)
    _judge_all(records)
    secs = time.monotonic() - t0
    _print_table(records, classes, secs, args.subprocess)
    if args.show_failures:
        for r in sorted(records, key=lambda r: r["name"]):
            if r["outcome"] not in OK:
                argv = " ".join(r["case"].argv) if "case" in r else ""
                print(f"FAIL {r['outcome']:18} {r['name']}: {r['why']}\n     tracestory {argv}")
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k not in ("case", "stdout")}
                                               | ({"argv": r["case"].argv} if "case" in r else {})
                                               for r in records], indent=1, default=str))
    if not args.work:
        for d in work.rglob("*"):
            if d.is_dir():
                d.chmod(0o755)
            elif d.exists() and not d.is_symlink():
                d.chmod(0o644)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r["outcome"] not in OK for r in records) else 0


def _server(work: Path, run_exchanges: bool, sample: int):
    """Start the tiny server; run its exchanges when asked (every ``sample``-th one)."""
    proc, url = reaudit_net.start_server(work)
    recs = reaudit_net.run_exchanges(proc, url, reaudit_net.server_exchanges()[::sample]) if run_exchanges else []
    return recs, url, proc


def _judge_all(records: list[dict]) -> None:
    refs = {r["name"]: r for r in records if "case" in r and "/pristine/" in r["name"]}
    # analyze first: the other commands of a damaged file lean on its verdict when they have no numbers
    by_name = {}
    for r in sorted(records, key=lambda r: 0 if r["name"].endswith("/analyze") else 1):
        if "case" not in r:
            continue
        r["outcome"], r["why"] = judge(r["case"], r, refs)
        case = r["case"]
        if (r["outcome"] == "silent-wrong" and r.get("numbers") is None and case.damaged and not case.must_state
                and case.reference):
            sib = by_name.get(case.name.rsplit("/", 1)[0] + "/analyze")
            if sib is not None and sib["outcome"] == "done":
                r["outcome"], r["why"] = "done", f"numbers checked by analyze of the same file ({sib['why']})"
        by_name[r["name"]] = r


def _print_table(records: list[dict], classes: list[str], secs: float, sub: bool) -> None:
    kinds = [k for k in (*FAILURES, *NET_FAILURES) if any(r["outcome"] == k for r in records)]
    print(f"re-audit {datetime.date.today()} on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}, {platform.python_version()}), "
          f"{'python -m tracestory.cli per case' if sub else 'forked tracestory.cli.main per case'}\n")
    print("| class | tried | refused | done | done, stated | exit 1 (answer) | failed |"
          + "".join(f" {k} |" for k in kinds))
    print("| --- " + "| ---: " * (6 + len(kinds)) + "|")
    tot = collections.Counter()
    for cls in CLASSES:
        rs = [r for r in records if r["cls"] == cls]
        if not rs:
            continue
        c = collections.Counter(r["outcome"] for r in rs)
        failed = sum(v for k, v in c.items() if k not in OK)
        tot.update(c)
        tot["tried"] += len(rs)
        print(f"| {cls} | {len(rs)} | {c['refused']} | {c['done']} | {c['done-stated']} | {c['failed-1']} | "
              f"{failed} |" + "".join(f" {c[k]} |" for k in kinds))
    failed = sum(v for k, v in tot.items() if k not in OK and k != "tried")
    print(f"| all | {tot['tried']} | {tot['refused']} | {tot['done']} | {tot['done-stated']} | {tot['failed-1']} | "
          f"{failed} |" + "".join(f" {tot[k]} |" for k in kinds))
    print(f"\n{tot['tried']} cases in {secs:.0f} s ({tot['tried'] / max(secs, 1e-9):.1f} cases/s), {failed} failed.")


if __name__ == "__main__":
    sys.exit(main())
