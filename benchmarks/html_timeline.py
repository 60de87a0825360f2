"""The interactive HTML report on big traces: its size and its open time in headless Chromium.

Run from the repository root (the checkout's ``src`` is what runs)::

    PYTHONPATH=$PWD/src python3 benchmarks/html_timeline.py --data /tmp/tracestory-bench --mib 100 --mib 1024

What it does, per ``--mib`` size
--------------------------------
1. Builds (once; reused while the files match, :func:`ingest.ensure_trace`) the replicated Kineto
   trace of :mod:`make_kineto` under ``--data`` (never inside the repository): each copy of the
   A100 NCCL fixture adds 2,700 kernels and 1,074 memops (and as many idle gaps), so 400 MiB of
   JSON is about 100 k kernels (37 copies) and 1 GiB about 270 k; with the idle gaps and steps
   both pass the page's cap of 200 k embedded spans.
2. ``tracestory report FILE.json.gz -o DATA/html_MIB/report.md --html``, timed (wall, CPU, peak
   RSS by GNU ``time``, :func:`ingest.measure`), and the same without ``--html`` for the cost of
   the page alone.
3. The page's size and its timeline data block's size.
4. Opens the page ``--reps`` times in Debian's headless Chromium (DevTools protocol, the client of
   ``tests/render/test_html.py``; ``--disable-gpu``: software rasterisation) and reads
   ``window.tracestoryTimeline.firstDrawMs``: ``performance.now()`` at the end of the first draw,
   i.e. milliseconds from navigation start to the first drawn timeline (parsing the page and its
   JSON, decoding the spans, the draw). Then the draw time (JavaScript, ``stats.lastDrawMs``) at
   the full view and zoomed to 1% of it, median of 5 draws each.

Prints a Markdown table and writes the raw numbers to ``DATA/html_timeline_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "render"))
import ingest  # noqa: E402
import make_kineto  # noqa: E402
from test_html import _chromium, _DevTools  # noqa: E402

MIB = 1 << 20


def tracestory(*args: str) -> list[str]:
    return [sys.executable, "-m", "tracestory.cli", *args]


def _eval(dt: _DevTools, expr: str):
    r = dt.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
    if "exceptionDetails" in r:
        raise RuntimeError(r["exceptionDetails"])
    return r["result"].get("value")


def open_times(page: Path, reps: int) -> dict:
    """First-draw time of ``page`` over ``reps`` navigations, and draw times at two zooms."""
    out: dict = {"first_draw_ms": [], "load_event_ms": [], "full_view_draw_ms": [], "zoom_1pct_draw_ms": []}
    with tempfile.TemporaryDirectory() as tmp, _chromium(Path(tmp)) as endpoint:
        targets = json.load(urllib.request.urlopen(f"{endpoint}/json/list", timeout=30))
        dt = _DevTools(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
        dt.call("Page.enable")
        dt.call("Emulation.setDeviceMetricsOverride", width=1280, height=1000, deviceScaleFactor=1, mobile=False)
        for _ in range(reps):
            dt.events.clear()
            dt.call("Page.navigate", url=page.resolve().as_uri())
            dt.wait_for("Page.loadEventFired", timeout_s=300)
            deadline = time.monotonic() + 300
            while not _eval(dt, "!!(window.tracestoryTimeline && window.tracestoryTimeline.ready)"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the timeline never drew")
                time.sleep(0.05)
            out["first_draw_ms"].append(_eval(dt, "window.tracestoryTimeline.firstDrawMs"))
            out["load_event_ms"].append(_eval(dt, "performance.getEntriesByType('navigation')[0].loadEventEnd"))
            for key, view in (("full_view_draw_ms", "t.reset()"),
                              ("zoom_1pct_draw_ms", "t.setView(t.view()[1] * 0.495, t.view()[1] * 0.505)")):
                ms = []
                for _ in range(5):
                    _eval(dt, f"(() => {{ const t = window.tracestoryTimeline; {view}; }})()")
                    _eval(dt, "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))")
                    ms.append(_eval(dt, "window.tracestoryTimeline.stats.lastDrawMs"))
                out[key].append(statistics.median(ms))
        out["merged_at_full_view"] = _eval(
            dt, "window.tracestoryTimeline.reset(), document.querySelector('#ts-timeline .ts-merged').textContent")
        dt.sock.close()
    return out


def one_size(data: Path, mib: float, source: Path, reps: int) -> dict:
    stem = data / f"kineto_{int(mib)}mib"
    facts = ingest.ensure_trace(stem, mib, source)
    trace = stem.with_suffix(".json.gz")
    out = data / f"html_{int(mib)}"
    out.mkdir(parents=True, exist_ok=True)
    for p in out.glob("report*"):
        p.unlink()
    print(f"{trace}: report --html ...", file=sys.stderr, flush=True)
    with_html = ingest.measure(tracestory("report", str(trace), "-o", str(out / "report.md"), "--html"))
    (out / "report.md").unlink()
    page_bytes = (out / "report.html").stat().st_size
    (out / "report.html").rename(out / "page.html")
    without = ingest.measure(tracestory("report", str(trace), "-o", str(out / "report.md")))
    text = (out / "page.html").read_text()
    block = re.search(r'<script type="application/json" id="ts-timeline-data">(.*?)</script>', text, re.DOTALL)
    data_json = json.loads(block.group(1))
    print(f"{trace}: opening the page {reps} times ...", file=sys.stderr, flush=True)
    return {
        "trace": str(trace), "json_bytes": facts["json_bytes"], "gz_bytes": facts["gz_bytes"],
        "kernels": facts["kernels"], "memops": facts["memcpy"] + facts["memset"],
        "report_html": with_html, "report_md_only": without, "page_bytes": page_bytes,
        "data_block_bytes": len(block.group(1).encode()), "spans_total": data_json["total_spans"],
        "spans_embedded": len(data_json["spans"]["d"]), "lanes": len(data_json["lanes"]),
        "browser": open_times(out / "page.html", reps),
    }


def chromium_version() -> str:
    exe = "chromium"
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError:
        return "chromium not found"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Size and open time of the interactive HTML report.")
    p.add_argument("--data", type=Path, default=Path("/tmp/tracestory-bench"))
    p.add_argument("--mib", type=float, action="append", help="trace size in MiB of JSON (repeatable; default 100)")
    p.add_argument("--source", type=Path, default=make_kineto.DEFAULT_SOURCE)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    ingest.DATA = args.data
    results = {"machine": f"{os.cpu_count()} CPUs, load1 {os.getloadavg()[0]:.1f}", "chromium": chromium_version(),
               "sizes": [one_size(args.data, mib, args.source, args.reps) for mib in (args.mib or [100.0])]}
    (args.data / "html_timeline_results.json").write_text(json.dumps(results, indent=1) + "\n")
    med = statistics.median
    print(f"{results['chromium']}; {results['machine']}")
    print("| trace JSON | kernels + memops | spans: all lanes (embedded) | lanes | report --html wall s (without) | "
          "page MiB (data block) | first draw ms, median (min-max) | draw ms full / 1% view |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in results["sizes"]:
        b = s["browser"]
        fd = b["first_draw_ms"]
        print(f"| {s['json_bytes'] / MIB:,.0f} MiB | {s['kernels']:,} + {s['memops']:,} | "
              f"{s['spans_total']:,} ({s['spans_embedded']:,}) | {s['lanes']} | "
              f"{s['report_html']['wall_s']:.1f} ({s['report_md_only']['wall_s']:.1f}) | "
              f"{s['page_bytes'] / MIB:.1f} ({s['data_block_bytes'] / MIB:.1f}) | "
              f"{med(fd):,.0f} ({min(fd):,.0f}-{max(fd):,.0f}) | "
              f"{med(b['full_view_draw_ms']):.1f} / {med(b['zoom_1pct_draw_ms']):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
