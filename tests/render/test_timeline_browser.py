"""The interactive timeline of ``report --html`` in a real headless Chromium (Debian's).

Driven through the DevTools protocol with the small client of ``test_html.py`` (real input
events: a mouse wheel, a drag, a hover and clicks dispatched by the browser, not calls into the
page's functions). A missing Chromium fails the test with a clear message (``tools/test-deps.sh``
installs it). What is checked:

* the page loads with no console error, exception or CSP violation;
* the canvas is drawn: in a screenshot of the lane area, the steps and idle lanes are nearly
  full, and at the pixel column of every kernel, copy and memset of the trace file (914, read
  from the JSON here) the stream lane is coloured: decimation merges, it loses nothing (the
  static PNG showed 7 of 17 GPU bursts, issue 26);
* a wheel zooms around the pointer, a drag pans by the dragged distance, a hover over a step
  reads that step out (its name from the trace file);
* a click on a finding link (in the report's Observations, the link the page adds to the
  finding's heading) moves the view to the finding's gaps, whose total equals the finding's own
  evidence ("idle time in them"), and highlights its kernel.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import H200_LLAMA
from test_html import _chromium, _console_errors, _DevTools
from tracestory.cli import main as cli_main

WIDTH, HEIGHT = 1280, 1000


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("timeline")
    assert cli_main(["report", str(H200_LLAMA), "-o", str(out / "report.md"), "--html"]) == 0
    return out / "report.html"


def _data(page: Path) -> dict:
    text = page.read_text()
    m = re.search(r'<script type="application/json" id="ts-timeline-data">(.*?)</script>', text, re.DOTALL)
    assert m, "no timeline data block in the page"
    return json.loads(m.group(1))


def _gpu_ops_from_trace_file() -> list[tuple[float, float]]:
    """(ts, dur) in us of the trace file's kernels, copies and memsets."""
    with gzip.open(H200_LLAMA, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [(e["ts"], e["dur"]) for e in events
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def _steps_from_trace_file() -> list[tuple[str, float, float]]:
    """(name, ts, end) in us of the trace file's CPU user annotations: the report's steps."""
    with gzip.open(H200_LLAMA, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted((e["name"], e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and e.get("cat") == "user_annotation")


class _Page:
    def __init__(self, dt: _DevTools):
        self.dt = dt

    def eval(self, expr: str):
        r = self.dt.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def frame(self) -> None:  # wait until the page has drawn the last change
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))")

    def view(self) -> list[float]:
        return self.eval("window.tracestoryTimeline.view()")

    def mouse(self, kind: str, x: float, y: float, **kw) -> None:
        self.dt.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **kw)

    def click(self, x: float, y: float) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, button="left", clickCount=1)
        self.mouse("mouseReleased", x, y, button="left", clickCount=1)
        self.frame()

    def canvas_box(self) -> dict:
        return self.eval("(() => { const c = document.querySelector('#ts-timeline canvas');"
                         " c.scrollIntoView({block: 'center'}); const r = c.getBoundingClientRect();"
                         " return {x: r.left, y: r.top, w: r.width, h: r.height, sx: scrollX, sy: scrollY}; })()")

    def shot(self, box: dict, path: Path) -> np.ndarray:
        import matplotlib.image as mpimg

        png = base64.b64decode(self.dt.call(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True,
            clip={"x": box["x"] + box["sx"], "y": box["y"] + box["sy"], "width": box["w"], "height": box["h"],
                  "scale": 1})["data"])
        path.write_bytes(png)
        return (mpimg.imread(path)[:, :, :3] * 255).round().astype(int)


def _coloured(pixels: np.ndarray) -> np.ndarray:
    """Pixels that are neither the white nor the banded (#f6f8fb) lane background."""
    white = (pixels == 255).all(axis=2)
    band = (pixels == (246, 248, 251)).all(axis=2)
    return ~(white | band)


def test_timeline_in_headless_chromium(page, tmp_path):
    data = _data(page)
    steps = _steps_from_trace_file()
    with _chromium(tmp_path) as endpoint:
        targets = json.load(urllib.request.urlopen(f"{endpoint}/json/list", timeout=30))
        dt = _DevTools(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
        p = _open(dt, page)
        _check_drawn(p, data, steps, tmp_path)
        _check_zoom_pan_hover(p, data, steps)
        _check_finding_link(p, data, tmp_path)
        assert _console_errors(dt.events) == []
        dt.sock.close()


def _open(dt: _DevTools, page: Path) -> _Page:
    for domain in ("Runtime", "Log", "Page"):
        dt.call(f"{domain}.enable")
    dt.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
    dt.call("Page.navigate", url=page.resolve().as_uri())
    dt.wait_for("Page.loadEventFired")
    p = _Page(dt)
    deadline = time.monotonic() + 30
    while not p.eval("!!(window.tracestoryTimeline && window.tracestoryTimeline.ready)"):
        assert time.monotonic() < deadline, "the timeline never drew"
        time.sleep(0.1)
    return p


def test_capped_page_shades_what_it_dropped(monkeypatch, tmp_path):
    """Past the span cap (lowered to 300 here) the page draws the kept spans and, under them, the
    grey full-view shading of all spans; it says so in its text."""
    import tracestory.render.timeline_data as td

    monkeypatch.setattr(td, "MAX_SPANS", 300)
    assert cli_main(["report", str(H200_LLAMA), "-o", str(tmp_path / "r.md"), "--html"]) == 0
    page = tmp_path / "r.html"
    data = _data(page)
    assert len(data["spans"]["d"]) == 300 and data["dropped"] == data["total_spans"] - 300 > 0
    assert "embeds 300 of" in page.read_text()
    with _chromium(tmp_path) as endpoint:
        targets = json.load(urllib.request.urlopen(f"{endpoint}/json/list", timeout=30))
        dt = _DevTools(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
        p = _open(dt, page)
        gutter, axis, lane_h = _geometry(p)
        box = p.canvas_box()
        px = p.shot(box, tmp_path / "capped.png")
        stream = px[axis + 2 * lane_h + 2: axis + 3 * lane_h - 2, gutter + 2: gutter + int(box["w"] - gutter - 8) - 1]
        grey = ((stream[:, :, 0] == stream[:, :, 1]) & (stream[:, :, 1] == stream[:, :, 2])
                & (stream[:, :, 0] < 240) & (stream[:, :, 0] > 100))
        assert grey.any(axis=0).sum() >= 17  # shading at least over every step's burst
        assert _console_errors(dt.events) == []
        dt.sock.close()


def _geometry(p: _Page) -> tuple[int, int, int]:
    return p.eval("window.tracestoryTimeline.gutter"), p.eval("window.tracestoryTimeline.axisHeight"), \
        p.eval("window.tracestoryTimeline.laneHeight")


def _check_drawn(p: _Page, data: dict, steps, tmp_path: Path) -> None:
    labels = [lane["label"] for lane in data["lanes"]]
    assert labels == ["steps (user_annotation)", "idle (no GPU op running)", "GPU 0 stream 7"]
    gutter, axis, lane_h = _geometry(p)
    box = p.canvas_box()
    assert box["h"] == axis + 3 * lane_h + 4
    px = p.shot(box, tmp_path / "timeline.png")
    lanes = _coloured(px[axis + 3: axis + 3 * lane_h - 3, gutter + 2: int(box["w"]) - 12])
    assert lanes.mean() > 0.3, lanes.mean()  # the steps and idle lanes are nearly full
    right = gutter + int(box["w"] - gutter - 8) - 1  # the plot's right border is drawn at this column
    rows = [_coloured(px[axis + k * lane_h + 4: axis + (k + 1) * lane_h - 4, gutter + 2: right]) for k in range(3)]
    assert rows[0].any(axis=0).mean() > 0.9 and rows[1].any(axis=0).mean() > 0.9
    # Every GPU op of the trace file lights its pixel column of the stream lane (one px of slack
    # for rounding): nothing is lost to decimation at the full view.
    plot_w = box["w"] - gutter - 8
    x = [(ts - data["t0_ns"] / 1000) / data["end"] * plot_w for ts, _ in _gpu_ops_from_trace_file()]
    lit = rows[2].any(axis=0)
    cols = np.clip(np.floor(x).astype(int) - 2, 0, lit.size - 1)  # the crop starts at gutter + 2
    dark = [c for c in cols if not lit[max(c - 1, 0): c + 2].any()]
    assert len(x) == 914 and dark == []
    merged = p.eval("document.querySelector('#ts-timeline .ts-merged').textContent")
    assert re.match(r"[\d,]+ spans merged into pixel columns", merged), merged


def _check_zoom_pan_hover(p: _Page, data: dict, steps) -> None:
    gutter, axis, lane_h = _geometry(p)
    box = p.canvas_box()
    plot_w = box["w"] - gutter - 8
    a, b = p.view()
    assert a == 0 and b == data["end"]
    # Wheel over the middle of the plot: zoom in by exp(-500 * 0.002) around the pointer.
    x = box["x"] + gutter + plot_w / 2
    y = box["y"] + axis + lane_h * 2.5
    p.mouse("mouseMoved", x, y)
    p.mouse("mouseWheel", x, y, deltaX=0, deltaY=-500)
    p.frame()
    a2, b2 = p.view()
    assert (b2 - a2) == pytest.approx((b - a) * np.exp(-1.0), rel=1e-6)
    assert (a2 + b2) / 2 == pytest.approx((a + b) / 2, rel=1e-6)  # the pointer's time stays put
    # Drag 200 px to the right: the view moves 200 px worth of time to the left.
    p.mouse("mousePressed", x, y, button="left", clickCount=1)
    p.mouse("mouseMoved", x + 100, y, button="left")
    p.mouse("mouseMoved", x + 200, y, button="left")
    p.mouse("mouseReleased", x + 200, y, button="left", clickCount=1)
    p.frame()
    a3, b3 = p.view()
    assert a3 == pytest.approx(a2 - 200 / plot_w * (b2 - a2), rel=1e-6) and b3 - a3 == pytest.approx(b2 - a2)
    # Hover over the middle of decode_3 (times from the trace file, relative to the page's t0).
    p.eval("window.tracestoryTimeline.reset()")
    p.frame()
    t0_us = data["t0_ns"] / 1000
    name, s, e = next(st for st in steps if st[0] == "decode_3")
    # The steps lane draws each step over its GPU span, inside its CPU range: aim at the span's middle.
    lane = data["lanes"][0]
    starts = np.cumsum(data["spans"]["s"][lane["off"]: lane["off"] + lane["n"]])
    durs = np.array(data["spans"]["d"][lane["off"]: lane["off"] + lane["n"]])
    k = [data["names"][j] for j in data["spans"]["n"][lane["off"]: lane["off"] + lane["n"]]].index(name)
    assert s - t0_us <= starts[k] and starts[k] + durs[k] <= e - t0_us + 50_000  # the GPU lags the CPU
    mid = starts[k] + durs[k] / 2
    hx = box["x"] + gutter + mid / data["end"] * plot_w
    p.mouse("mouseMoved", hx, box["y"] + axis + lane_h / 2)
    p.frame()
    readout = p.eval("document.querySelector('#ts-timeline .ts-readout').textContent")
    assert readout.startswith("decode_3 — steps (user_annotation) — start"), readout


def _check_finding_link(p: _Page, data: dict, tmp_path: Path) -> None:
    # Every finding with spans got a link in its report heading.
    linked = [i for i, f in enumerate(data["findings"]) if f["view"]]
    heads = p.eval("[...document.querySelectorAll('main h4 a.ts-go')].map(a => Number(a.dataset.finding))")
    assert sorted(heads) == linked
    stall = next(i for i, f in enumerate(data["findings"]) if f["rule"] == "cpu_stall")
    f = data["findings"][stall]
    rect = p.eval(f"(() => {{ const a = document.querySelector('main h4 a.ts-go[data-finding=\"{stall}\"]');"
                  " a.scrollIntoView({block: 'center'}); const r = a.getBoundingClientRect();"
                  " return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()")
    p.click(rect["x"], rect["y"])
    a, b = p.view()
    pad = (f["view"][1] - f["view"][0]) * 0.05
    assert a == pytest.approx(f["view"][0] - pad) and b == pytest.approx(f["view"][1] + pad)
    # The gaps it shows add up to the finding's own evidence (a second source: the rule's sum).
    evidence = _stall_evidence_ns()
    assert sum(w[1] - w[0] for w in f["windows"]) == pytest.approx(evidence / 1000, abs=0.001 * len(f["windows"]))
    assert all(a <= w[0] and w[1] <= b for w in f["windows"])
    # The timeline scrolled into view and draws the highlight (dark red) and the windows (amber).
    top = p.eval("document.getElementById('ts-timeline').getBoundingClientRect().top")
    assert abs(top) < 2, top
    px = p.shot(p.canvas_box(), tmp_path / "timeline_finding.png")
    red = ((px[:, :, 0] == 139) & (px[:, :, 1] == 0) & (px[:, :, 2] == 0)).sum()
    assert red > 0
    readout = p.eval("document.querySelector('#ts-timeline .ts-readout').textContent")
    assert readout.startswith(f["title"]), readout


def _stall_evidence_ns() -> float:
    """The cpu_stall finding's evidence "idle time in them" (ns), from the analysis results."""
    from tracestory.analysis.results import analyze_inputs
    from tracestory.ingest import load_inputs

    run = analyze_inputs(load_inputs([H200_LLAMA])).runs[0]
    f = next(f for f in run.findings if f.rule == "cpu_stall")
    return float(next(e.value for e in f.evidence if e.label == "idle time in them"))
