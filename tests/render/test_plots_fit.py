"""The PNG figures show what they claim: every GPU burst of the trace is drawn (counted in the
rendered pixels against a plain reading of the Kineto JSON), no legend sits over data, and the
roofline's axes fit its points."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import numpy as np
import pytest

from conftest import A100_NCCL, H100_BERT, H200_LLAMA
from tracestory.analysis.results import analyze_inputs
from tracestory.ingest import load_inputs
from tracestory.render import memory, plots, plots_timeline
from tracestory.render.plots import ROOF_MARGIN, write_hardware_plots, write_plots

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _json_ops(path):
    """(stream, start us, end us) of every GPU op, read straight from the Kineto JSON."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return [
        (e["args"]["stream"], e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    ]


def _runs(cols: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """Runs of True in ``cols`` (first and last column), joined across gaps under ``gap`` columns."""
    out: list[list[int]] = []
    for c in np.flatnonzero(cols):
        if out and c - out[-1][1] <= gap:
            out[-1][1] = int(c)
        else:
            out.append([int(c), int(c)])
    return [(a, b) for a, b in out]


@pytest.mark.parametrize("path", [H200_LLAMA, A100_NCCL, H100_BERT])
def test_every_burst_is_drawn(path):
    """Bursts in the trace at the figure's scale (runs of the pixel columns the ops of one stream
    touch, from the JSON and the axes' transform) = runs of painted pixels in the rendered lane, at
    the same columns. So no burst is narrower than a pixel or missing."""
    run = analyze_inputs(load_inputs([path])).runs[0]
    fig = plots_timeline.draw_timeline(run.facts)
    ax = fig.axes[0]
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
    height = img.shape[0]
    ops = _json_ops(path)
    t0 = min(s for _, s, _ in ops)
    by_stream = defaultdict(list)
    for stream, s, e in ops:
        by_stream[stream].append(((s - t0) / 1e3, (e - t0) / 1e3))
    palette = [
        int(r * 255 + 0.5) * 65536 + int(g * 255 + 0.5) * 256 + int(b * 255 + 0.5)
        for r, g, b, _ in (h.get_facecolor() for h in ax.get_legend().legend_handles)
    ]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert sorted(labels) == sorted(f"GPU 0 stream {s}" for s in by_stream)
    x_left, x_right = (
        int(round(v)) for v in ax.transData.transform([(ax.get_xlim()[0], 0), (ax.get_xlim()[1], 0)])[:, 0]
    )
    for y, lab in enumerate(labels):
        stream = int(lab.rsplit(" ", 1)[1])
        row = height - 1 - int(ax.transData.transform((0, y))[1])
        pixels = img[row, x_left:x_right]
        painted = np.isin(pixels @ [65536, 256, 1], palette)  # the legend's colours, exactly (no anti-aliasing)
        drawn = _runs(painted, 1)
        # the trace's bursts at this scale: the pixel columns each op touches (its first to the one
        # holding its end), runs of touched columns
        touched = np.zeros(len(pixels), dtype=bool)
        for s, e in by_stream[stream]:
            a = ax.transData.transform((s, 0))[0] - x_left
            b = ax.transData.transform((e, 0))[0] - x_left
            touched[int(np.floor(a)) : max(int(np.ceil(b)), int(np.floor(a)) + 1)] = True
        bursts = _runs(touched, 1)
        assert len(drawn) == len(bursts), (lab, len(drawn), len(bursts))
        assert drawn == bursts, lab
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.fixture
def figures(monkeypatch):
    """Every figure the plot functions save, kept open for inspection."""
    kept = []

    def keep(fig, path):
        fig.canvas.draw()
        kept.append((path.name, fig))
        return path

    monkeypatch.setattr(plots, "_save", keep)
    monkeypatch.setattr(plots_timeline, "_save", keep)
    monkeypatch.setattr(memory, "save", keep)
    yield kept
    import matplotlib.pyplot as plt

    for _, fig in kept:
        plt.close(fig)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("path", [H200_LLAMA, A100_NCCL, H100_BERT])
def test_no_legend_over_data(tmp_path, figures, path):
    """The legend's box intersects no bar, no point and no lane of the axes it explains."""
    results = analyze_inputs(load_inputs([path]))
    write_plots(results.runs, tmp_path, stem="r")
    write_hardware_plots(None, results.runs, tmp_path, stem="r")
    names = {n for n, _ in figures}
    assert "r_timeline.png" in names and (path == H100_BERT or "r_phases.png" in names)  # bert has no phases
    checked = 0
    for name, fig in figures:
        for ax in fig.axes:
            leg = ax.get_legend()
            if leg is None:
                continue
            box = leg.get_window_extent()
            data = [p.get_window_extent() for p in ax.patches if p.get_width() > 0]
            for coll in ax.collections:
                data += [p.get_extents().transformed(coll.get_transform()) for p in coll.get_paths()]
                if len(coll.get_offsets()):
                    pts = ax.transData.transform(coll.get_offsets())
                    assert not np.any(
                        (pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1)
                    ), name
            assert data, name
            assert not any(_overlaps(box, d) for d in data), name
            assert not _overlaps(box, ax.get_window_extent()), name  # outside the axes altogether
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("path", [H200_LLAMA, H100_BERT])
def test_roofline_axes_fit_the_points(tmp_path, figures, path):
    """Every point of the estimated roofline (from the report's JSON) lies inside the axes, and the
    axes reach at most ROOF_MARGIN decades (plus rounding) past the points, or past the roof above
    them at the top."""
    from tracestory.cli import main as cli_main

    assert (
        cli_main(["report", str(path), "-o", str(tmp_path / "r.md"), "--plots", "--json", str(tmp_path / "r.json")])
        == 0
    )
    doc = json.loads((tmp_path / "r.json").read_text())
    est = doc["traces"][0]["roofline_estimate"]
    pts = [p for p in est["points"] if p.get("arithmetic_intensity") and p.get("achieved_flops_per_s")]
    pts = sorted(pts, key=lambda p: (-(p.get("duration_ns") or 0), str(p.get("label"))))[:12]
    fig = dict(figures)["r_roofline.png"]
    ax = fig.axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    ai = np.log10([p["arithmetic_intensity"] for p in pts])
    fl = np.log10([p["achieved_flops_per_s"] for p in pts])
    assert np.log10(x0) < ai.min() and ai.max() < np.log10(x1)
    assert np.log10(y0) < fl.min() and fl.max() < np.log10(y1)
    tol = ROOF_MARGIN + 0.01
    assert ai.min() - np.log10(x0) <= tol and np.log10(x1) - ai.max() <= tol
    assert fl.min() - np.log10(y0) <= tol
    roof_top = max(min(p["peak_flops_per_s"], x1 * p["peak_flops_per_s"] / p["ridge_flop_per_byte"]) for p in pts)
    assert np.log10(y1) - max(fl.max(), np.log10(roof_top)) <= tol
