"""The serving report a colleague would read: the iteration log folded with its exceptions shown, the
profiler's own start and stop not counted as engine stalls, advice that names what held the
requests (token budget, KV blocks, the sequence limit, or nothing: the load), a log-only report without empty sections, and the serving PNGs.
Expected values come from plain JSON readings of the fixtures (or the hand log's own table)."""

from __future__ import annotations

import gzip
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from conftest import TEST_DATA
from tracestory.analysis.batching import STALL_MIN_NS, STALL_RATIO, analyze_batching, read_scheduler_log
from tracestory.analysis.results import analyze_inputs
from tracestory.analysis.serving_story import MAX_ROWS
from tracestory.cli import main as cli_main
from tracestory.ingest import load_inputs
from tracestory.render import plots_serving
from tracestory.render.markdown import render_report

sys.path.insert(0, str(Path(__file__).parent))
from test_batch_story import write_log  # noqa: E402  (the hand log and its table)

TP = TEST_DATA / "tp_serve_gpu"
TP_LOG = TP / "torch" / "serve.sched.jsonl.gz"


def _lines(path):
    with gzip.open(path, "rt") as fh:
        return [json.loads(x) for x in fh if x.strip()]


def _kind(it) -> str:
    p = sum(m["tokens"] for m in it["members"] if m["phase"] == "prefill")
    d = sum(1 for m in it["members"] if m["phase"] == "decode")
    return "empty" if not p and not d else "decode-only" if not p else "prefill-only" if not d else "mixed"


def test_folded_log_covers_every_iteration_once():
    its = [x for x in _lines(TP_LOG) if x["type"] == "iteration"]
    r = analyze_batching(read_scheduler_log(TP_LOG))
    rows = r.story.rows
    assert len(rows) <= MAX_ROWS
    # contiguous, each iteration once
    assert rows[0].first_iter == its[0]["iter"] and rows[-1].last_iter == its[-1]["iter"]
    assert all(b.first_iter == a.last_iter + 1 for a, b in zip(rows, rows[1:]))
    assert sum(row.count for row in rows) == len(its)
    kinds: dict[str, int] = {}
    for it in its:
        kinds[_kind(it)] = kinds.get(_kind(it), 0) + 1
    folded: dict[str, int] = {}
    for row in rows:
        for k, n in row.kinds.items():
            folded[k] = folded.get(k, 0) + n
    assert folded == kinds
    # the exceptions are rows of their own: the first iteration and the two long ones (log only: no manifest)
    alone = {row.first_iter: row.exception for row in rows if row.exception}
    assert alone[its[0]["iter"]] == "first iteration"
    assert {s.iter for s in r.stalls} <= set(alone)
    text = render_report(analyze_inputs(load_inputs([TP_LOG])))
    table = [x for x in text.splitlines() if re.match(r"\| \d+(-\d+)? \| ", x)]
    assert len(table) == len(rows)


def test_profiler_start_and_stop_are_charged_and_no_stall(tmp_path):
    """The fixture (re-captured on 2026-11-28 from main at 7d0a226) traced iterations
    skip..skip+count-1; its log marks the profiler's start and stop on iterations 200 and 207
    (``profiler_ns``: 3,868,108 and 22,853,445 ns, read from the file with gzip + json) and its
    manifest says how long they held rank 0 (3.9 / 22.9 ms). With overlapped scheduling each hold
    is in the wall time of the iteration before: 199 took 8.72 ms, 206 25.96 ms (median 3.18 ms).
    Stalls are the iterations over the limit once the holds are taken out (none here: the limit is
    the 50 ms floor and the longest iteration, 1401, took 35.7 ms). The same log without its marks
    falls back to the manifest's numbers."""
    manifest = json.loads((TP / "manifest.json").read_text())
    cap = manifest["captures"][0]
    skip, count = cap["settings"]["skip"]["value"], cap["settings"]["count"]["value"]
    blocked = next(s["profiler_blocked_s"]["0"] for s in cap["steps"] if "profiler_blocked_s" in s)
    lines = _lines(TP_LOG)
    assert lines[0]["overlap"] is True
    its = [x for x in lines if x["type"] == "iteration"]
    marks = {x["iter"]: x["profiler_ns"] for x in its if x.get("profiler_ns")}
    assert sorted(marks) == [skip, skip + count - 1]
    assert abs(marks[skip] - blocked["start"] * 1e9) < 1e6
    assert abs(marks[skip + count - 1] - blocked["stop"] * 1e9) < 1e6
    held = {skip - 1: marks[skip], skip + count - 2: marks[skip + count - 1]}
    dur = [x["t_end_ns"] - x["t_start_ns"] for x in its]
    limit = max(STALL_RATIO * statistics.median(dur), STALL_MIN_NS)
    expected = [x["iter"] for x, d in zip(its, dur) if d - held.get(x["iter"], 0) >= limit]

    # rank 1's stop took longer than rank 0's (manifest: 37.8 against 22.9 ms), and iteration 208's plan
    # send, rank 0 waiting for rank 1, took 31.6 ms (log) against a median send of well under 1 ms
    ranks = next(s["profiler_blocked_s"] for s in cap["steps"] if "profiler_blocked_s" in s)
    assert ranks["1"]["stop"] > ranks["0"]["stop"] and ranks["1"]["start"] < ranks["0"]["start"]
    after = next(x for x in its if x["iter"] == skip + count)
    sends = sorted(x["plan_send_ns"] for x in its if x.get("plan_send_ns"))
    assert after["plan_send_ns"] > 5 * sends[len(sends) // 2] and after["plan_send_ns"] > 1e6
    held[skip + count - 1] = after["plan_send_ns"]
    expected = [x["iter"] for x, d in zip(its, dur) if d - held.get(x["iter"], 0) >= limit]

    r = analyze_inputs(load_inputs([TP])).batching
    assert [s.iter for s in r.stalls] == expected
    holds = {(h.iter, h.what, h.charged_iter, h.source) for h in r.story.profiler}
    assert holds == {(skip, "start", skip - 1, "event log"), (skip + count - 1, "stop", skip + count - 2, "event log"),
                     (skip + count, "stop on rank 1", skip + count - 1, "event log and capture manifest")}
    follower = next(h for h in r.story.profiler if h.what == "stop on rank 1")
    assert follower.held_ns == after["plan_send_ns"]
    text = render_report(analyze_inputs(load_inputs([TP])))
    stop = marks[skip + count - 1] / 1e6  # 22.85 ms
    assert f"| {skip + count - 2} | " in text
    assert f"**profiler stop**: {stop:.1f} ms of iteration {skip + count - 1}'s launch" in text

    # the log without profiler_ns: the holds come from the manifest
    folder = tmp_path / "tp"
    (folder / "torch").mkdir(parents=True)
    for f in (TP / "torch").iterdir():
        if f.name != "serve.sched.jsonl.gz":
            (folder / "torch" / f.name).write_bytes(f.read_bytes())
    (folder / "manifest.json").write_text((TP / "manifest.json").read_text())
    with gzip.open(folder / "torch" / "serve.sched.jsonl.gz", "wt") as fh:
        for x in lines:
            x.pop("profiler_ns", None)
            fh.write(json.dumps(x) + "\n")
    r = analyze_inputs(load_inputs([folder])).batching
    holds = {(h.iter, h.what, h.charged_iter, h.source) for h in r.story.profiler}
    assert holds == {(skip, "start", skip - 1, "capture manifest"),
                     (skip + count - 1, "stop", skip + count - 2, "capture manifest"),
                     (skip + count, "stop on rank 1", skip + count - 1, "event log and capture manifest")}
    assert [s.iter for s in r.stalls] == expected


@pytest.mark.parametrize("overlap, stalls", [(True, []), (False, [5])])
def test_profiler_mark_is_charged_to_the_iteration_that_ran_it(tmp_path, overlap, stalls):
    """Iteration 5 of the hand log made 50 ms longer and iteration 6 marked with ``profiler_ns`` = 50 ms:
    with overlapped scheduling 6's launch ran inside 5, so 5 is no stall; without, 5 stays one."""
    path = write_log(tmp_path / "sched.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[0]["overlap"] = overlap
    extra = 50_000_000
    it5 = next(x for x in lines if x.get("type") == "iteration" and x["iter"] == 5)
    for x in lines:
        if x.get("type") == "iteration" and x["iter"] >= 5:
            x["t_end_ns"] += extra
            if x["iter"] > 5:
                x["t_start_ns"] += extra
            if x["iter"] == 6:
                x["profiler_ns"] = extra
        elif x.get("type") in ("first_token", "finish") and x["t_ns"] >= it5["t_start_ns"]:
            x["t_ns"] += extra
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = analyze_batching(read_scheduler_log(path))
    assert [s.iter for s in r.stalls] == stalls
    assert [(h.iter, h.charged_iter) for h in r.story.profiler] == [(6, 5 if overlap else 6)]


def _variant(tmp_path, wait_reason: str, chunk: bool):
    """The hand log without its preemption (which would call for KV blocks), its waits given
    ``wait_reason``, its chunk decision kept or dropped."""
    path = write_log(tmp_path / f"sched_{chunk}.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for x in lines:
        if x.get("type") == "iteration":
            x["decisions"] = [
                d | ({"reason": wait_reason} if d["action"] == "wait" else {})
                for d in x["decisions"]
                if d["action"] != "preempt" and (chunk or d["action"] != "chunk")
            ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize(
    "reason, chunk, advice",
    [
        ("token budget of 256 used by earlier members", False, "Requests were held by the token budget"),
        # 1 prompt split by the budget against 2 waits on the sequences: the sequence limit held them
        ("max_num_seqs 4 requests running", True, "Recommendation: raise --max-num-seqs"),
        ("max_num_seqs 4 requests running", False, "Recommendation: raise --max-num-seqs"),
        ("needs 40 blocks, 12 free", False, "Requests waited for KV-cache blocks"),
    ],
)
def test_the_advice_names_what_held_the_requests(tmp_path, reason, chunk, advice):
    text = render_report(analyze_inputs(load_inputs([_variant(tmp_path, reason, chunk)])))
    summary = text.split("## Environment")[0]
    others = {"Requests were held by the token budget", "Recommendation: raise --max-num-seqs",
              "Requests waited for KV-cache blocks", "No request waited for a sequence slot"} - {advice}
    assert advice in summary and not any(o in summary for o in others)


def test_a_run_nobody_waited_in_is_called_load_bound(tmp_path):
    """The TP=2 capture: no wait decision in its log and at most 14 sequences of 32 in an iteration
    (read below with plain json): no flag is advised, the batch is the load's."""
    lines = [json.loads(x) for x in gzip.open(TP_LOG, "rt")]
    its = [x for x in lines if x["type"] == "iteration"]
    waits = [d for x in its for d in x["decisions"] if d["action"] == "wait"]
    peak, limit = max(len(x["members"]) for x in its), lines[0]["max_num_seqs"]
    assert waits == [] and (peak, limit) == (14, 32)
    md = tmp_path / "r.md"
    assert cli_main(["report", str(TP_LOG), "-o", str(md)]) == 0
    summary = md.read_text().split("## Environment")[0]
    assert f"the batch (at most {peak} sequences of --max-num-seqs {limit}) was set by the offered load" in summary
    assert "No flag change is advised" in summary and "raise --max-num-seqs" not in summary


def test_log_only_report_has_no_empty_section(tmp_path):
    md = tmp_path / "report.md"
    summary = TP / "torch" / "load.summary.json"
    assert cli_main(["report", str(TP_LOG), str(summary), "-o", str(md), "--plots", "--html"]) == 0
    text = md.read_text()
    heads = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert heads == ["Executive Summary", "Environment", "Execution Story", "Reproduction Guide", "Appendix"]
    assert not re.search(r"^n/a", text, flags=re.MULTILINE)
    assert "**Limitations**" in text and "timeline trace: no GPU timeline" in text
    meta = _lines(TP_LOG)[0]
    assert f"| KV cache | {meta['num_blocks']} blocks x {meta['block_size']} tokens |" in text
    # the three serving PNGs, each shown once; the KV ASCII chart names its twin and is not in the page
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["report_serving_batch.png", "report_serving_kv.png", "report_serving_latency.png"]
    assert sorted(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)) == pngs
    page = md.with_suffix(".html").read_text()
    assert page.count("<img ") == 3 and "```text png=report_serving_kv.png" in text
    kv_chart = text.split("```text png=report_serving_kv.png\n")[1].split("```")[0]
    assert kv_chart.splitlines()[0].split("┤")[1] not in page


def test_serving_plots_fit_their_data_and_keep_legends_outside(tmp_path, monkeypatch):
    kept = []

    def keep(fig, path):
        fig.canvas.draw()
        kept.append((path.name, fig))
        return path

    monkeypatch.setattr(plots_serving, "_save", keep)
    r = analyze_batching(read_scheduler_log(TP_LOG))
    plots_serving.write_serving_plots(r, tmp_path, stem="r")
    assert [n for n, _ in kept] == ["r_serving_batch.png", "r_serving_kv.png", "r_serving_latency.png"]
    its = [x for x in _lines(TP_LOG) if x["type"] == "iteration"]
    peak_kv = max(x["kv"]["in_use"] for x in its)
    peak_seqs = max(len(x["members"]) for x in its)
    figs = dict(kept)
    assert figs["r_serving_kv.png"].axes[0].get_ylim()[1] >= peak_kv
    assert figs["r_serving_kv.png"].axes[0].get_ylim()[1] <= 1.2 * peak_kv  # the 12,226-block pool is not drawn
    assert figs["r_serving_batch.png"].axes[0].get_ylim()[1] >= peak_seqs
    for name, fig in kept:
        for ax in fig.axes:
            leg = ax.get_legend()
            if leg is None:
                continue
            a, b = leg.get_window_extent(), ax.get_window_extent()
            assert a.x0 >= b.x1 or a.y1 <= b.y0 or a.y0 >= b.y1, name  # outside the axes
    import matplotlib.pyplot as plt

    for _, fig in kept:
        plt.close(fig)


def test_one_split_prompt_among_160_is_not_requests_held_by_the_budget():
    """The TP=2 capture's log, read here: the token budget split one prompt and made nobody wait
    (one ``chunk`` decision, no ``wait`` on the budget, 160 arrivals), so the summary does not
    say the budget held the requests nor tell to raise it."""
    lines = _lines(TP_LOG)
    held = {d["request_id"] for x in lines if x["type"] == "iteration" for d in x["decisions"]
            if d["action"] == "chunk" or (d["action"] == "wait" and d["reason"].startswith("token"))}
    arrivals = sum(1 for x in lines if x["type"] == "arrival")
    assert (len(held), arrivals) == (1, 160)
    summary = render_report(analyze_inputs(load_inputs([TP]))).split("## Environment")[0]
    assert "held by the token budget" not in summary and "raise --max-num-batched-tokens" not in summary
