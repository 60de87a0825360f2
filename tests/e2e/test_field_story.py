"""End to end: `tracestory report FILE -o out.md --json out.json` on every real trace in tests/data
(field/, graphs/, public/, and the H200 eager decode), with the headline claims pinned to values
derived here from the trace itself with plain json/gzip/sqlite3 code, never from tracestory.

What is derived here, and how:
- GPU op time: the summed durations of kernel, memcpy and memset events (Kineto ``dur`` in us,
  nsys ``end - start`` in ns).
- Top category and its share: each kernel name is read by hand (``CATEGORY_RULES`` below, an
  ordered substring table written from the libraries' naming conventions); kernels no rule
  names are "unread" and widen the accepted share range instead of being guessed.
- Graph share: kernels whose ``correlation`` equals that of a ``*GraphLaunch`` runtime call.
- Phase coverage: share of kernel time whose launch call (same ``correlation``) starts inside a
  step range; the range is named per trace (ProfilerStep, or the annotation that holds the step).
- Communication: union of communication-kernel intervals, and its intersection with the union
  of the other kernels' intervals.
- Producer: PyTorch ops (``aten::``), engine from op/annotation/kernel names, training from
  backward ops, ROCm from ``hip*`` launch calls, compiled from Inductor ``triton_`` kernel names.

One report per trace (module-scoped cache): about 1 s each on one core.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path

import pytest

from conftest import A100_NCCL, H100_BERT, H200_LLAMA, NSYS_2022, NSYS_2024, TEST_DATA
from tracestory.cli import main

FIELD = TEST_DATA / "field"
GRAPHS = TEST_DATA / "graphs"
B200_VLLM = FIELD / "AMD-AGI_TraceLens__b200_vllm_moe_mxfp4_prefill_rank0of8.json.gz"
H100_QWEN = FIELD / "AMD-AGI_TraceLens__h100_hf_qwen1.5-0.5b_chat.json.gz"
MI300X_QWEN = FIELD / "AMD-AGI_TraceLens__mi300x_hf_qwen1.5-0.5b_chat.json.gz"
MI300X_SGLANG = FIELD / "AMD-AGI_TraceLens__mi300x_sglang_qwen3-8b_decode_hipgraph.json.gz"
EXTRAP_C = FIELD / "extra-p_extrap__a100_exgpu_s10_old_nsys.sqlite"
RESNET_2021 = FIELD / "pytorch_kineto__v100_resnet50_tb_plugin_sample.pt.trace.json.gz"
REDUCE_OVERHEAD = GRAPHS / "reduce_overhead_decode.trace.json.gz"
MANUAL_GRAPH = GRAPHS / "manual_graph_decode.trace.json.gz"
MIXED_GRAPH = GRAPHS / "mixed_graph_eager.trace.json.gz"
FLEX = GRAPHS / "flex_prefill_decode.trace.json.gz"

# Ordered (substring, category) rules, first match wins, written from the libraries' naming
# conventions for the kernels that carry the time in these traces.
CATEGORY_RULES = [
    # communication: NCCL/RCCL kernels, symmetric-memory all-reduce (torch SymmetricMemory)
    ("nccl", "communication"),
    ("multimem_all_reduce", "communication"),
    # Inductor pointwise kernels stay element-wise even when the fused op names attention
    # (FlexAttention block-mask preparation, SDPA input reshapes)
    ("triton_poi", "elementwise"),
    # MoE routing and the finalize (un-permute + weighted sum) of TRT-LLM's MoE: routing work,
    # not GEMMs, although the finalize's template parameters name cutlass types
    ("moe::dev::routing", "moe_routing"),
    ("moe::dev::finalize", "moe_routing"),
    # attention: FlashAttention (pytorch_flash::flash_fwd), TRT-LLM FMHA (fmhaSm100a), Triton
    # attn_fwd (ROCm SDPA), vLLM/ROCm paged attention, cuDNN SDPA (and its lean_reduction
    # helper, launched inside the attention op), FlexAttention templates.
    ("flash_fwd", "attention"),
    ("fmhaSm100", "attention"),
    ("attn_fwd", "attention"),
    ("paged_attention", "attention"),
    ("native_sdpa", "attention"),
    ("lean_reduction_kernel", "attention"),
    ("flex_attention", "attention"),
    # GEMM and convolution: trtllm-gen bmm_* (MXFP4/FP8 expert GEMMs are GEMMs), cuBLAS nvjet,
    # sm90_xmma, hipBLASLt/Tensile Cijk_*, CUTLASS, volta sgemm/scudnn, cuDNN conv engines
    # (implicit_convolve, dgrad/wgrad), cuBLASLt split-K reduction (the GEMM's epilogue).
    ("bmm_", "gemm"),
    ("nvjet", "gemm"),
    ("xmma_gemm", "gemm"),
    ("implicit_gemm", "gemm"),
    ("winograd", "gemm"),
    ("Cijk_", "gemm"),
    ("cutlass", "gemm"),
    ("sgemm", "gemm"),
    ("scudnn", "gemm"),
    ("implicit_convolve", "gemm"),
    ("dgrad", "gemm"),
    ("wgrad", "gemm"),
    ("splitKreduce", "gemm"),
    # normalisation: layer/RMS/batch norm kernels
    ("layer_norm", "norm"),
    ("rms_norm", "norm"),
    ("rmsnorm", "norm"),
    ("bn_fw", "norm"),
    ("bn_bw", "norm"),
    # element-wise: ATen elementwise/copy/cat kernels, Inductor pointwise
    ("elementwise", "elementwise"),
    ("CatArrayBatchedCopy", "elementwise"),
    # cuDNN layout transposes and the optimizers' multi-tensor (foreach) updates are copies and
    # element-wise arithmetic
    ("nchwToNhwc", "elementwise"),
    ("nhwcToNchw", "elementwise"),
    ("multi_tensor_apply", "elementwise"),
    # reductions: ATen reduce_kernel; softmax, top-k, sort and scan reduce along a dimension
    ("reduce_kernel", "reduction"),
    ("SoftMax", "reduction"),
    ("mbtopk", "reduction"),
    ("radixSort", "reduction"),
    ("Scan", "reduction"),
]


def read_category(name: str) -> str | None:
    for sub, cat in CATEGORY_RULES:
        if sub in name:
            return cat
    return None


# --------------------------------------------------------------------- plain derivations


def load_kineto(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def intersection_length(a, b):
    """Length of the intersection of two sorted lists of disjoint intervals."""
    i = j = 0
    total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def kineto_facts(path: Path, step_range=None) -> dict:
    """Plain reading of a Kineto trace. ``step_range(event) -> bool`` picks the CPU-side ranges
    that hold the steps (for phase coverage)."""
    doc = load_kineto(path)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    cat = lambda e: (e.get("cat") or "").lower()  # noqa: E731
    kernels = [e for e in events if cat(e) == "kernel"]
    memops = [e for e in events if cat(e) in ("gpu_memcpy", "gpu_memset", "memcpy", "memset")]
    runtime = [e for e in events if cat(e) in ("cuda_runtime", "cuda_driver", "runtime")]
    ops = [e["name"] for e in events if cat(e) in ("cpu_op", "operator")]
    annotations = [e["name"] for e in events if cat(e) == "user_annotation"]
    pyfuncs = [e["name"] for e in events if cat(e) == "python_function"]

    kernel_us = sum(e["dur"] for e in kernels)
    gpu_op_us = kernel_us + sum(e["dur"] for e in memops)
    by_cat: dict[str, float] = {}
    unread = 0.0
    for e in kernels:
        c = read_category(e["name"])
        if c is None:
            unread += e["dur"]
        else:
            by_cat[c] = by_cat.get(c, 0.0) + e["dur"]
    for e in memops:
        c = "memcpy" if "cpy" in cat(e) else "memset"
        by_cat[c] = by_cat.get(c, 0.0) + e["dur"]

    corr = lambda e: (e.get("args") or {}).get("correlation")  # noqa: E731
    graph_launches = [e for e in runtime if e["name"].endswith("GraphLaunch")]
    graph_corr = {corr(e) for e in graph_launches}
    graph_kernels = [e for e in kernels if corr(e) in graph_corr]
    launch_ts = {corr(e): e["ts"] for e in runtime if corr(e) is not None}

    coverage = None
    if step_range is not None:
        ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events if step_range(e)]
        assert ranges, f"{path.name}: no step range matched"
        inside = sum(
            e["dur"] for e in kernels
            if corr(e) in launch_ts and any(s <= launch_ts[corr(e)] <= t for s, t in ranges)
        )
        coverage = inside / kernel_us

    gpu_u = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels + memops])

    comm = [e for e in kernels if read_category(e["name"]) == "communication"]
    comm_u = union([(e["ts"], e["ts"] + e["dur"]) for e in comm])
    compute_u = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels
                       if read_category(e["name"]) != "communication"])
    comm_busy = sum(t - s for s, t in comm_u)

    launch_names = {e["name"] for e in runtime if "Launch" in e["name"]}
    return {
        "kernel_count": len(kernels),
        "memop_count": len(memops),
        "gpu_op_us": gpu_op_us,
        "kernel_us": kernel_us,
        "by_cat": by_cat,
        "unread_us": unread,
        "graph_launches": len(graph_launches),
        "graph_kernels": len(graph_kernels),
        "graph_share": sum(e["dur"] for e in graph_kernels) / kernel_us,
        "coverage": coverage,
        "gpu_busy_us": sum(t - s for s, t in gpu_u),
        "gpu_window_us": gpu_u[-1][1] - gpu_u[0][0],
        "comm_share": sum(e["dur"] for e in comm) / gpu_op_us,
        "comm_busy_us": comm_busy,
        "comm_overlapped_us": intersection_length(comm_u, compute_u),
        # ProfilerStep#N ranges are written only by torch.profiler's schedule
        "pytorch": any(n.startswith("aten::") for n in ops)
        or any(n.startswith("ProfilerStep#") for n in annotations),
        "vllm": any("vllm" in n for n in ops + pyfuncs),
        "sglang": any("sglang" in n for n in pyfuncs) or any("sgl_" in e["name"] for e in kernels),
        "training": any("backward" in n.lower() for n in ops),
        "rocm": any(n.startswith("hip") for n in launch_names),
        "cuda": any(n.startswith("cu") for n in launch_names),
        "compiled": any(e["name"].startswith("triton_") for e in kernels),
        "ops_with_shapes": sum(1 for e in events if cat(e) == "cpu_op"
                               and any((e.get("args") or {}).get("Input Dims") or [])),
        "world_size": (doc.get("distributedInfo") or {}).get("world_size"),
        "annotations": annotations,
    }


def nsys_facts(path: Path) -> dict:
    """Plain SQL reading of an Nsight Systems export."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    per_kernel = dict(con.execute(
        "SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName GROUP BY s.value"))
    kernel_ns = sum(per_kernel.values())
    mem_ns = 0
    for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if t in tables:
            mem_ns += con.execute(f"SELECT COALESCE(SUM(end - start), 0) FROM {t}").fetchone()[0]
    runtime_names = [r[0] for r in con.execute(
        "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
        "ON s.id = r.nameId")]
    con.close()
    top_name, top_ns = max(per_kernel.items(), key=lambda kv: kv[1])
    return {
        "gpu_op_ns": kernel_ns + mem_ns,
        "top_kernel": top_name,
        "top_share": top_ns / (kernel_ns + mem_ns),
        "graph_launches": sum("GraphLaunch" in n for n in runtime_names),
        "launch_names": [n for n in runtime_names if "Launch" in n],
    }


# --------------------------------------------------------------------- the reports

_CACHE: dict[Path, tuple[str, dict]] = {}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """report(path) -> (markdown text, JSON document), made once per trace."""
    def make(path: Path):
        if path not in _CACHE:
            out = tmp_path_factory.mktemp(path.name.split(".")[0])
            md, js = out / "out.md", out / "out.json"
            rc = main(["report", str(path), "-o", str(md), "--json", str(js)])
            assert rc == 0
            _CACHE[path] = (md.read_text(), json.loads(js.read_text()))
        return _CACHE[path]
    return make


def executive_summary(md: str) -> str:
    start = md.index("## Executive Summary")
    end = md.index("\n## ", start + 5)
    return md[start:end]


def top_category(facts):
    return max(facts["by_cat"].items(), key=lambda kv: kv[1])


def assert_top_category(facts, trace, summary):
    """The report's top category is the one read here, and its share lies in the range the hand
    reading allows (its kernels, up to all unread kernels added)."""
    name, us = top_category(facts)
    lo = us / facts["gpu_op_us"]
    hi = (us + facts["unread_us"]) / facts["gpu_op_us"]
    # nothing unread may be large enough to change which category is on top
    others = sorted(facts["by_cat"].values(), reverse=True)
    if len(others) > 1:
        assert others[1] + facts["unread_us"] < us
    cats = sorted(trace["categories"], key=lambda c: -c["time_ns"])
    assert cats[0]["name"] == name
    assert lo - 0.002 <= cats[0]["percent"] / 100 <= hi + 0.002
    title = f"{name} dominates GPU op time ({cats[0]['percent']:.1f}%)"
    titles = finding_titles(trace)
    if name == "communication" and (trace["source"].get("world_size") or 1) > 1:
        # one rank of a larger job: the collective time includes waiting for the ranks not given
        title = f"{name} kernels hold {cats[0]['percent']:.1f}% of GPU op time, waiting for other ranks included"
    assert title in titles
    # the Executive Summary's key insight carries the first two findings
    if titles.index(title) < 2:
        assert title in summary


def assert_producer(facts, trace, summary, *, engine=None):
    # the engine written in the case table is my reading; the names in the trace must agree
    assert engine == ("vLLM" if facts["vllm"] else "SGLang" if facts["sglang"] else None)
    p = trace["producer"]
    assert p["framework"] == ("pytorch" if facts["pytorch"] else "none")
    assert p["engine"] == engine
    assert p["mode"] == ("training" if facts["training"] else "inference")
    assert p["platform"] == ("ROCm" if facts["rocm"] else "CUDA")
    assert p["compiled"] is facts["compiled"]
    words = ["training" if facts["training"] else "inference"]
    if facts["compiled"]:
        words.append("torch.compile")
    head = "Made by a PyTorch program" + (f" ({engine})" if engine else "") + ":"
    assert head + " " + ", ".join(words) in summary
    assert ("ROCm." if facts["rocm"] else "CUDA.") in summary


def assert_graphs(facts, trace):
    g = trace["producer"]["graphs"]
    assert g["kernel_count"] == facts["kernel_count"]
    assert g["graph_launches"] == facts["graph_launches"]
    assert g["graph_kernels"] == facts["graph_kernels"]
    assert g["graph_time_fraction"] == pytest.approx(facts["graph_share"], abs=1e-6)
    assert g["replays_graphs"] is (facts["graph_kernels"] > 0)


def assert_coverage(facts, trace, doc):
    cov = trace["phase_coverage"]
    assert cov["share_of_kernel_time"] == pytest.approx(facts["coverage"], abs=1e-4)
    phase_lines = [lim["reason"] for lim in doc["limitations"] if lim["analysis"] == "phases"]
    if facts["coverage"] < 0.9:
        assert any(f"cover {facts['coverage']:.1%} of kernel time" in r for r in phase_lines)
    else:
        assert not any("of kernel time" in r for r in phase_lines)


def assert_no_graph_capture_advice(md):
    assert "mode='reduce-overhead'" not in md
    assert "capture the step in CUDA Graphs" not in md
    assert "Eager run" not in md


def assert_exposure_comm(facts, trace):
    e = trace["exposure"]
    assert e["comm_busy_ns"] == pytest.approx(facts["comm_busy_us"] * 1000, rel=1e-6, abs=2)
    assert e["comm_overlapped_ns"] == pytest.approx(facts["comm_overlapped_us"] * 1000,
                                                    rel=1e-6, abs=2)


def finding_titles(trace):
    return [f["title"] for f in trace["findings"]]


def is_step(e):
    return e["name"].startswith("ProfilerStep#") and (e.get("cat") or "").lower() in (
        "user_annotation", "operator", "cpu_op")


# --------------------------------------------------------------------- Kineto traces

def step_annotation(prefix):
    """CPU-side user_annotation ranges whose name starts with ``prefix``."""
    return lambda e: e.get("cat") == "user_annotation" and e["name"].startswith(prefix)


# path, the step ranges used for phase coverage, the engine read from op/annotation names
KINETO_CASES = {
    # the lone outermost vLLM annotation `execute_context_1(888_788544)_generation` holds the step
    "b200_vllm": (B200_VLLM, step_annotation("execute_context"), "vLLM"),
    "h100_qwen": (H100_QWEN, is_step, None),
    "mi300x_qwen": (MI300X_QWEN, is_step, None),
    # SGLang's `execute_32_context_0(...)` annotation holds the decode step
    "mi300x_sglang": (MI300X_SGLANG, step_annotation("execute_32_context"), "SGLang"),
    # 2021 Kineto: ProfilerStep#N in category `Operator`
    "resnet_2021": (RESNET_2021, is_step, None),
    "reduce_overhead": (REDUCE_OVERHEAD, is_step, None),
    "manual_graph": (MANUAL_GRAPH, is_step, None),
    "mixed_graph": (MIXED_GRAPH, is_step, None),
    "flex": (FLEX, is_step, None),
    "a100_nccl": (A100_NCCL, is_step, None),
    "h100_bert": (H100_BERT, is_step, None),
    # no ProfilerStep: `prefill` and `decode_N` record_function ranges
    "h200_llama": (H200_LLAMA, lambda e: e.get("cat") == "user_annotation"
                   and re.fullmatch(r"prefill|decode_\d+", e["name"]) is not None, None),
}

_FACTS: dict[str, dict] = {}


def facts_for(key):
    if key not in _FACTS:
        path, step_range, _ = KINETO_CASES[key]
        _FACTS[key] = kineto_facts(path, step_range)
    return _FACTS[key]


@pytest.mark.parametrize("key", list(KINETO_CASES))
def test_kineto_headline_matches_plain_reading(key, report):
    path, _, engine = KINETO_CASES[key]
    facts = facts_for(key)
    md, doc = report(path)
    trace = doc["traces"][0]
    summary = executive_summary(md)
    n, m = facts["kernel_count"], facts["memop_count"]
    assert f"The capture holds {n} kernel{'s' * (n != 1)} and {m} memory op{'s' * (m != 1)} " in summary
    assert_top_category(facts, trace, summary)
    assert_producer(facts, trace, summary, engine=engine)
    assert_graphs(facts, trace)
    assert_coverage(facts, trace, doc)
    assert_exposure_comm(facts, trace)
    # busy time is the union of GPU op intervals; the critical path spans the GPU window
    assert trace["exposure"]["busy_ns"] == pytest.approx(facts["gpu_busy_us"] * 1000, rel=1e-5)
    cp = trace["critical_path"]
    assert cp["scope"] == "the whole trace"
    assert cp["span_ns"] == pytest.approx(facts["gpu_window_us"] * 1000, rel=1e-6)
    assert 0 < cp["gpu_ops_on_path"] <= facts["kernel_count"] + facts["memop_count"]
    assert "Phases from 'none'" not in md


@pytest.mark.parametrize("key", ["mi300x_sglang", "reduce_overhead", "manual_graph",
                                 "mixed_graph"])
def test_graph_replays_get_no_graph_capture_advice(key, report):
    facts = facts_for(key)
    md, doc = report(KINETO_CASES[key][0])
    assert facts["graph_kernels"] > 0
    assert_no_graph_capture_advice(md)
    n = facts["graph_launches"]
    summary = executive_summary(md)
    assert (f"{facts['graph_share']:.1%} of kernel time replayed from {n} graph launch"
            in summary)
    titles = finding_titles(doc["traces"][0])
    assert any(t.startswith(f"Graph replays: {facts['graph_share']:.1%} of kernel time is replayed from {n} "
                            f"graph launch") and f"({facts['graph_kernels']} of "
               f"{facts['kernel_count']} kernels)" in t for t in titles)


def test_sglang_decode_story_is_not_an_eager_run(report):
    md, doc = report(MI300X_SGLANG)
    assert "Eager run" not in md
    assert "small unfused ops" not in md


def test_sglang_launch_latency_not_measured_from_the_graph_launch(report):
    facts = facts_for("mi300x_sglang")
    md, _ = report(MI300X_SGLANG)
    # 544 of the 555 kernels have no launch of their own: a latency over all 558 GPU ops
    # (555 kernels + 3 memcpy) is the time since the one hipGraphLaunch
    assert facts["kernel_count"] + facts["memop_count"] == 558
    assert "(558 ops)" not in md


def test_b200_low_precision_gemms_are_gemms_and_symmetric_memory_is_communication(report):
    facts = facts_for("b200_vllm")
    md, doc = report(B200_VLLM)
    assert "quantization dominates" not in md
    trace = doc["traces"][0]
    # communication: the multimem all-reduce plus one NCCL AllGather, none overlapped by
    # compute on this single stream
    assert facts["comm_busy_us"] > 0 and facts["comm_overlapped_us"] == 0
    titles = finding_titles(trace)
    assert (f"Communication is {facts['comm_share']:.1%} of GPU op time, 0.0% of it overlapped "
            "with compute") in titles
    # rank 0 of a world of 8 (distributedInfo): the partial input is stated
    assert facts["world_size"] == 8
    assert any(lim["analysis"] == "multi-GPU" and "1 of 8 ranks" in lim["reason"]
               for lim in doc["limitations"])


def test_a100_allreduce_overlap_is_the_interval_intersection(report):
    facts = facts_for("a100_nccl")
    _, doc = report(A100_NCCL)
    share_overlapped = facts["comm_overlapped_us"] / facts["comm_busy_us"]
    # communication is the top category: the dominant-category finding carries the overlap (one finding per fact)
    (dom,) = [f for f in doc["traces"][0]["findings"] if f["rule"] == "dominant_category"]
    assert dom["title"].startswith(f"communication kernels hold {facts['comm_share']:.1%} of GPU op time")
    overlapped = next(e["value"] for e in dom["evidence"] if e["label"] == "overlapped with compute")
    assert overlapped == pytest.approx(share_overlapped, abs=5e-4)
    assert facts["world_size"] == 2
    assert any("1 of 2 ranks" in lim["reason"] for lim in doc["limitations"])


def test_qwen_phase_coverage_below_90_percent_is_a_limitation(report):
    # ProfilerStep#6 holds only the launches of about 70% of the kernel time on both GPUs:
    # the rest is the previous step's queued work
    for key, path in (("h100_qwen", H100_QWEN), ("mi300x_qwen", MI300X_QWEN)):
        facts = facts_for(key)
        assert facts["coverage"] < 0.9
        md, doc = report(path)
        assert f"the phases cover {facts['coverage']:.1%} of kernel time" in md


def test_resnet_2021_steps_in_operator_category_are_phases(report):
    facts = facts_for("resnet_2021")
    md, doc = report(RESNET_2021)
    assert "Phases from 'none'" not in md
    assert "6 phases from 'ProfilerStep'" in executive_summary(md)
    assert doc["traces"][0]["phase_count"] == 6
    assert facts["training"]


SHAPED = ["b200_vllm", "h100_qwen", "h100_bert", "h200_llama", "flex",
          "mi300x_qwen"]


@pytest.mark.parametrize("key", SHAPED)
def test_no_missing_shapes_claim_where_shapes_were_recorded(key, report):
    facts = facts_for(key)
    assert facts["ops_with_shapes"] > 100
    md, _ = report(KINETO_CASES[key][0])
    assert "no recorded op shapes" not in md


# --------------------------------------------------------------------- nsys SQLite

NSYS_CASES = {"extrap_c": EXTRAP_C, "gtx1060": NSYS_2022, "cloverleaf": NSYS_2024}


@pytest.mark.parametrize("key", list(NSYS_CASES))
def test_nsys_headline_names_the_top_kernel(key, report):
    path = NSYS_CASES[key]
    facts = nsys_facts(path)
    md, doc = report(path)
    trace = doc["traces"][0]
    summary = executive_summary(md)
    top = f"The top kernel is {facts['top_kernel']}: {facts['top_share']:.1%} of GPU op time"
    if key == "gtx1060":
        # Its longest idle gap (21.1 ms) is the host inside the NVTX range main->test_copies->init_data
        # (NVTX_EVENTS: that push/pop range covers 14.7 ms of the gap on the launching thread): the
        # specific cause leads the summary; the top kernel is still told below it.
        assert "The GPU waits on the CPU inside main->test_copies->init_data: 1 gap," in summary
        assert top in md
    elif key == "extrap_c":
        # six one-block kernels on a 108-SM A100: the tiny grids, a more specific cause, lead the summary
        # (every launch is grid 1x1x1 in CUPTI_ACTIVITY_KIND_KERNEL); the top kernel is still told below
        assert "100.0% of kernel time runs in launches of fewer than 10 blocks on a GPU of 108 SMs" in summary
        assert top in md
    else:
        assert top in summary
    p = trace["producer"]
    # no PyTorch in a CUDA C / MPI program: no torch advice of any kind
    assert p["framework"] == "none" and p["platform"] == "CUDA"
    assert "Made by a program without PyTorch: CUDA." in summary
    assert "torch.compile" not in md and "torch.cuda" not in md
    assert p["graphs"]["graph_launches"] == facts["graph_launches"] == 0
    assert all(n.startswith("cuda") for n in facts["launch_names"])


def test_nsys_nvtx_phases_cover_the_launches(report):
    """The GTX 1060 program's NVTX ranges directly under `main` (`main->test_max_par`,
    `main->test_copies`, `main->process`) are its phases; every kernel's cudaLaunchKernel call
    (same correlationId) starts inside one of them."""
    con = sqlite3.connect(f"file:{NSYS_2022}?mode=ro", uri=True)
    ranges = [(s, e) for s, e, t in con.execute("SELECT start, end, text FROM NVTX_EVENTS")
              if t and re.fullmatch(r"main->[^>]+", t)]
    launches = list(con.execute(
        "SELECT k.end - k.start, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId"))
    con.close()
    total = sum(d for d, _ in launches)
    inside = sum(d for d, t in launches if any(s <= t <= e for s, e in ranges))
    assert len(ranges) == 3 and len(launches) == 12
    md, doc = report(NSYS_2022)
    trace = doc["traces"][0]
    assert trace["phase_count"] == len(ranges)
    assert "3 phases from 'nvtx'" in executive_summary(md)
    assert trace["phase_coverage"]["share_of_kernel_time"] == pytest.approx(inside / total)


def test_nsys_without_markers_states_it(report):
    for path in (EXTRAP_C, NSYS_2024):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "NVTX_EVENTS" not in tables or con.execute(
            "SELECT COUNT(*) FROM NVTX_EVENTS").fetchone()[0] == 0
        con.close()
        _, doc = report(path)
        assert doc["traces"][0]["phase_coverage"] is None
        assert any(lim["analysis"] == "phases" and "no step markers" in lim["reason"]
                   for lim in doc["limitations"])
