"""The Markdown story report: structure, widths, determinism, golden files, numbers in prose.

Golden files live in tests/golden/; rewrite them with TRACESTORY_UPDATE_GOLDEN=1.
"""

import dataclasses
import gzip
import json
import os
import re
from functools import lru_cache
from pathlib import Path

import msgspec
import numpy as np
import pytest
from conftest import H200_LLAMA, KINETO_FIXTURES, REPO

from tracestory.analysis.results import AnalysisOptions, analyze_inputs
from tracestory.ingest import load_inputs
from tracestory.render.markdown import SECTION_TITLES, render_report
from tracestory.analysis.story import best_repeat, fold
from tracestory.render.md import short_name

GOLDEN = REPO / "tests" / "golden"


def _results(path, **options):
    """The results of one trace, listed in the report under its file name only."""
    inputs = dataclasses.replace(load_inputs([path]), paths=(path.name,))
    return analyze_inputs(inputs, AnalysisOptions(**options))


@lru_cache(maxsize=None)
def _run(path):
    return _results(path, command=f"tracestory report {path.name} -o report.md")


def _analysis(path):
    return _run(path).analyses[0]


@lru_cache(maxsize=None)
def _report(path):
    return render_report(_run(path))


def _fenced_blocks(text):
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if cur is None:
                cur = []
            else:
                blocks.append(cur)
                cur = None
        elif cur is not None:
            cur.append(line)
    return blocks, cur is None


def _section(text, name):
    m = re.search(rf"^## {re.escape(name)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1)


ids = [p.name[:20] for p in KINETO_FIXTURES]


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=ids)
def test_golden(path):
    text = _report(path)
    golden = GOLDEN / (path.name.split(".")[0] + ".md")
    if os.environ.get("TRACESTORY_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.read_text(encoding="utf-8") == text


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=ids)
def test_headings_exact_and_in_order(path):
    text = _report(path)
    lines = text.splitlines()
    assert lines[0] == f"# Hands-On Learning Report: {_analysis(path).trace.label}"
    blocks_ok = []
    inside = False
    for line in lines:  # headings outside code fences only
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("## "):
            blocks_ok.append(line[3:])
    assert blocks_ok == list(SECTION_TITLES)


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=ids)
def test_fences_closed_and_charts_within_100_columns(path):
    blocks, closed = _fenced_blocks(_report(path))
    assert closed
    assert len(blocks) >= 5   # actions, story, bar chart, timeline, histogram, commands
    for block in blocks:
        assert all(len(line) <= 100 for line in block), max(block, key=len)


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=ids)
def test_tables_well_formed(path):
    text = _report(path)
    _, _ = _fenced_blocks(text)
    inside = False
    table: list[str] = []
    tables = []
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            inside = not inside
        if not inside and line.startswith("|"):
            table.append(line)
        elif table:
            tables.append(table)
            table = []
    assert tables
    for t in tables:
        cols = [len(re.findall(r"(?<!\\)\|", row)) for row in t]
        assert len(set(cols)) == 1, t
        assert re.fullmatch(r"\|( -+:? \|)+", t[1].replace("---:", "---:")), t[1]


def test_deterministic():
    r = _run(H200_LLAMA)
    assert render_report(r) == render_report(r)


def test_goal_questions_and_plots():
    r = _results(H200_LLAMA, goal="Why is decode slow?", questions=("Is attention the bottleneck?",))
    text = render_report(r, plots=[Path("out/r_timeline.png")])
    assert "![r_timeline](r_timeline.png)" in _section(text, "Visualizations")
    goal = _section(text, "Goal Interpretation")
    assert "**Original Goal**: Why is decode slow?" in goal
    assert "1. Is attention the bottleneck?" in goal
    # without extras the hardware section says why it has no counters
    assert _section(_report(H200_LLAMA), "Hardware Behavior Analysis").strip().startswith(
        "n/a: no Nsight Compute input")


def test_executive_summary_counts_match_the_json():
    events = json.load(gzip.open(H200_LLAMA))["traceEvents"]
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    memops = sum(1 for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    summary = _section(_report(H200_LLAMA), "Executive Summary")
    assert f"holds {kernels} kernels and {memops} memory ops" in summary


def _numbers(text):
    return set(re.findall(r"\d+(?:\.\d+)?(?: ?(?:%|ms|us|ns|s|x|GiB|MiB))?", text))


def _field_values(obj):
    """The field values of a result record: a dataclass (``vars``) or a msgspec Struct, which has
    no ``__dict__`` (the leaf records, docs/ARCHITECTURE.md)."""
    if isinstance(obj, msgspec.Struct):
        return [getattr(obj, f) for f in obj.__struct_fields__]
    return list(vars(obj).values())


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=ids)
def test_numbers_in_prose_come_from_results(path):
    """Every number in the Executive Summary and in the Observations' titles and implications is
    a formatting of a value in the analysis results (breakdown, timeline, phases, findings)."""
    from tracestory.analysis.results import analyze_inputs
    from tracestory.ingest import load_inputs
    from tracestory.render.ascii import fmt_bytes, fmt_ns, fmt_pct

    a = _analysis(path)
    values = []
    for obj in (a.breakdown, a.timeline, *a.breakdown.categories, *a.phases.families,
                *a.phases.outliers, *a.phases.phases):
        values += [v for v in _field_values(obj) if isinstance(v, (int, float, np.integer, np.floating))]
    run = analyze_inputs(load_inputs([path])).runs[0]   # the findings the report prints
    for f in run.findings:
        values += [e.value for e in f.evidence if isinstance(e.value, (int, float, np.integer, np.floating))]
    values += [run.workload.gemm_ops, run.workload.small_gemm_share or 0]   # the workload's evidence
    if run.producer is not None and run.producer.graphs.graph_time_fraction is not None:
        values.append(run.producer.graphs.graph_time_fraction)
    b, tl = a.breakdown, a.timeline
    values += [b.kernel_count, b.memop_count, len(a.phases.phases)]
    if tl is not None:
        values.append(tl.busy_ns / tl.window_ns)
    allowed = set()
    for v in values:
        v = float(v)
        allowed |= {fmt_ns(v), fmt_pct(v), f"{100 * v:.1f}%", f"{v:.2f}", f"{v:.1f}x", f"{v:.2f}x",
                    str(int(v)) if v.is_integer() else "", f"{v:.1f}"}
        allowed |= {x.split(" ")[0] for x in (fmt_ns(v),)} | {fmt_bytes(v)}
    allowed |= {"2", "1", "0", "10", "16"}   # k=2 what-if, "1/1.5", "10 us" short-kernel bound
    text = _report(path)
    prose = _section(text, "Executive Summary")
    obs = _section(text, "Observations and Insights")
    prose += "\n".join(l for l in obs.splitlines() if l.startswith(("####", "**Implication")))
    prose = re.sub(r"`[^`]*`|aten::\S+|#### \d+\.|decode_\d+|ProfilerStep#\d+|sm\d+|fp8|bf16|fp16|\d+/\d+|r2", "", prose)
    missing = {n for n in _numbers(prose) if n not in allowed and n.split(" ")[0] not in allowed}
    assert not missing, missing


def test_short_name():
    assert short_name("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add"
                      "<c10::BFloat16>, std::array<char*, 3> >(int, at::native::CUDAFunctor_add"
                      "<c10::BFloat16>, std::array<char*, 3>)") == "vectorized_elementwise_kernel[CUDAFunctor_add]"
    assert short_name("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2"
                      "_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8"
                      "::Params)", 80) == "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8"
    assert short_name("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16,"
                      " float>(int, float)") == "vectorized_layer_norm_kernel"
    assert short_name("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT") == "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    # nvFuser's kernels sit in an anonymous namespace that nsys demangles as "<unnamed>" (the real
    # name of tests/data/corpus/nsight/NVIDIA_Fuser__h200_phi3_cross_entropy_thunder.sqlite)
    assert short_name("<unnamed>::nvfuser_pointwise_f0_c1_r0_g0(<unnamed>::Tensor<float, (int)2, (int)2>, "
                      "<unnamed>::Tensor<float, (int)2, (int)2>)") == "nvfuser_pointwise_f0_c1_r0_g0"
    assert short_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD (Device -> Device)"


def test_fold_finds_the_layer_loop():
    # prefix 7, then the block (1 2 3 4) three times, then 9
    keys = np.array([7, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 9])
    assert best_repeat(keys) == (1, 4, 3)
    assert fold(keys, 0, len(keys)) == [("run", 0, 1), ("loop", 1, 4, 3), ("run", 13, 14)]
    assert best_repeat(np.arange(10)) is None


def test_story_shows_the_prefill_layer_loop_and_decode_steps():
    story = _section(_report(H200_LLAMA), "Execution Story")
    # 2 decoder layers in the prefill: a loop of two iterations
    assert re.search(r"LOOP \(x2 of \d+ ops", story)
    assert "PHASE 2: decode x16 steps (decode_0 .. decode_15)" in story
    assert story.count("<- MOST TIME HERE") == 2   # prefill and the representative decode step
    assert "CPU inside aten::_cudnn_attention_forward" in story
    # the prefill GEMMs take 512 rows (aten::mm input [512, 4096]), decode GEMMs 1 row
    assert "GEMM rows M: prefill 512..512 (matrix-matrix), decode 1..1" in story


def test_many_ranks_are_told_once(tmp_path, monkeypatch):
    """Above MANY_RANKS traces, the per-trace sections tell the median trace and the ones that
    differ; every trace is in the Appendix table. Run on the real 4-rank capture with the
    threshold lowered to 2 (a 64-rank folder behaves the same, only longer)."""
    import tracestory.analysis.results as results_mod
    from tracestory.analysis.results import analyze_inputs
    from tracestory.ingest import load_inputs
    from tracestory.render.markdown import render_report

    folder = REPO / "tests" / "data" / "multigpu" / "tp4_uneven"
    full = render_report(analyze_inputs(load_inputs([folder])))
    monkeypatch.setattr(results_mod, "MANY_RANKS", 2)
    res = analyze_inputs(load_inputs([folder]))
    sel = res.selection
    told = render_report(res)
    assert sel is not None and len(res.runs) == 4
    assert "traces**, told once" in told and "**Every trace**" in told
    # the per-trace story is written for the shown traces only
    assert told.count("EXECUTION STORY:") == len(sel.shown) < full.count("EXECUTION STORY:") == 4
    # every trace has its row in the Appendix table
    for run in res.runs:
        assert f"| {run.trace.label} |" in told


def test_launch_configuration_table_only_where_the_trace_records_one():
    # An AMD trace whose top kernels run in graph replays, whose kernel events carry no grid, block
    # or registers (read from the JSON below): the Hardware section says so in one line, with no
    # table of n/a cells and no claim about blocks per CU.
    path = REPO / "tests/data/corpus/tracelens_hta/AMD-AGI_TraceLens__mi300x_xdit_flux1_sage_attention.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    time_by_name: dict = {}
    for e in kernels:
        time_by_name[e["name"]] = time_by_name.get(e["name"], 0.0) + e["dur"]
    top = set(sorted(time_by_name, key=time_by_name.get, reverse=True)[:10])
    assert not any("grid" in e["args"] or "block" in e["args"] for e in kernels if e["name"] in top)
    hw = _section(_report(path), "Hardware Behavior Analysis")
    assert "The trace records no launch configuration" in hw
    assert "blocks per CU" not in hw and "| kernel (top by time) |" not in hw
