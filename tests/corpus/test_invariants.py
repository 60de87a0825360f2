"""Report invariants, checked on every trace in the repository (the field corpus, the project's own
captures, the graph, compare, multi-GPU, serving and nsys fixtures).

Each invariant is a property any true report has, whatever the trace:

* one ceiling per category: no finding quotes two ceilings;
* no negative "more" (``-12.0 ms more``) anywhere in the text;
* every share names its base: a percentage in a finding's title reads "X% of <base>" or sits in
  parentheses right after the quantity it is a share of;
* a subset never overrides the whole silently: a roofline verdict that covers under half the kernel
  time says so in its title;
* no advice to adopt what the trace shows in use: CUDA graphs to a graph-replayed run,
  torch.compile to a compiled one, a fused RMSNorm / SwiGLU / rotary kernel where that block already
  runs fused, split-KV where the decode kernel splits the KV length, fp8 where the GEMMs run fp8;
* advice fits the program: no decoder-LLM vocabulary (KV cache, RMSNorm, SwiGLU, RoPE, decode GEMV)
  in the recommendations for a workload that is not an LLM, no torch.compile or torch.cuda advice
  outside PyTorch, no gradient advice outside training, no Nsight advice on AMD GPUs and no rocprof
  advice on NVIDIA GPUs;
* per-rank findings agree with the multi-rank verdict: a rank that the multi-GPU analysis shows
  waiting on a late peer is not told its communication time is work to shrink.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from conftest import REPO

import tracestory
from tracestory.errors import TracestoryError
from tracestory.analysis.workload import LLM

DATA = REPO / "tests" / "data"
LOOSE = ["h200/llama2layer_eager_decode.trace.json.gz", "graphs/flex_prefill_decode.trace.json.gz",
         "graphs/manual_graph_decode.trace.json.gz", "graphs/mixed_graph_eager.trace.json.gz",
         "graphs/reduce_overhead_decode.trace.json.gz", "compare/decode_default_a.trace.json.gz",
         "compare/decode_max-autotune_a.trace.json.gz", "nsys/cuda_gpu_trace_2024.csv",
         "nsys/cuda_gpu_kern_sum.csv", "multigpu/tp2_even", "multigpu/tp2_uneven", "multigpu/tp4_uneven",
         "serving/h200_serve_q12", "memory/tiny_llama_memory", "telemetry/capture_throttled"]


def input_sets() -> list[tuple[str, list[Path], str]]:
    """(name, paths, known-wrong note) of every input set of the repository's traces; inputs that must
    be refused are checked by their own expectations (tests/corpus/test_corpus.py), not here."""
    out = [(p, [DATA / p], "") for p in LOOSE]
    for side in sorted([*DATA.rglob("*.expect.toml"), *DATA.rglob("EXPECT.toml")]):
        doc = tomllib.loads(side.read_text())
        if doc.get("truth", {}).get("refused"):
            continue
        paths = ([side.parent / p for p in doc["inputs"]] if doc.get("inputs")
                 else [side.with_name(side.name[: -len(".expect.toml")])])
        name = str(side.parent.relative_to(DATA) / (paths[0].name if len(paths) == 1 else ""))
        out.append((name, paths, doc.get("report", {}).get("known_wrong", "")))
    return out


_SHARE_OK = re.compile(r"\d+(\.\d+)?% of |\(\d+(\.\d+)?%\)|\d+(\.\d+)?% (below|above)")
_PCT = re.compile(r"\d+(\.\d+)?%")
_NEG_MORE = re.compile(r"-\d[\d.,]*\s*(ns|us|ms|s|%|x)?\s*(more|longer|slower)\b")
_LLM_WORDS = re.compile(r"KV cache|KV length|RMSNorm|SwiGLU|\bRoPE\b|rotary|GEMV|per token|decode step", re.I)


def violations(results, text: str) -> list[str]:
    """Every invariant of the module docstring that ``results`` / ``text`` break, one line each."""
    out = []
    if _NEG_MORE.search(text):
        out.append(f"negative 'more': {_NEG_MORE.search(text).group(0)!r}")
    for run in results.runs:
        f = run.facts
        use, w, p = f.in_use, f.workload, f.producer
        for fd in run.findings:
            where = f"{run.trace.label}: [{fd.rule}] {fd.title[:70]}"
            ceilings = [e.label for e in fd.evidence if "ceiling" in e.label.lower()]
            if len(ceilings) > 1:
                out.append(f"{where}: two ceilings {ceilings}")
            for m in _PCT.finditer(fd.title):
                if not _SHARE_OK.match(fd.title, m.start()) and not _SHARE_OK.search(fd.title[max(0, m.start() - 1):]):
                    out.append(f"{where}: a share without its base")
                    break
            if fd.rule == "bound":
                cov = next((e.value for e in fd.evidence if e.label == "placed share of all kernel time"), None)
                if cov is not None and cov < 0.5 and "of all kernel time" not in fd.title:
                    out.append(f"{where}: a verdict on {cov:.0%} of kernel time reads as the whole")
            rec = fd.recommendation
            if p.replays_graphs and re.search(r"capture the (step|launch sequence) in (CUDA|HIP) Graph", rec, re.I):
                out.append(f"{where}: graph-capture advice to a graph-replayed run")
            if use.compiled and re.search(r"torch\.compile \(Inductor\) fuses", rec):
                out.append(f"{where}: torch.compile advice to a compiled run")
            for fact, words in ((use.fused_norm, "fused RMSNorm"), (use.fused_activation, "fused SwiGLU"),
                                (use.fused_rope, "fused rotary")):
                if fact and words in rec:
                    out.append(f"{where}: '{words}' advised while {fact} runs")
            if use.split_kv and re.search(r"a decode kernel that splits the KV length", rec):
                out.append(f"{where}: split-KV advised while {use.split_kv} runs")
            if "fp8" in use.low_precision_gemm and "fp8 tensor cores where accuracy allows" in rec:
                out.append(f"{where}: fp8 advised to fp8 GEMMs")
            if w.kind not in LLM and _LLM_WORDS.search(rec):
                out.append(f"{where}: LLM advice ({_LLM_WORDS.search(rec).group(0)}) to a {w.kind} workload")
            if not p.is_pytorch and re.search(r"torch\.(compile|cuda)", rec):
                out.append(f"{where}: PyTorch advice to a program without PyTorch")
            if p.mode != "training" and re.search(r"gradient", rec, re.I):
                out.append(f"{where}: gradient advice to a {p.mode} run")
            if f.platform == "ROCm" and re.search(r"Nsight|\bncu\b", rec):
                out.append(f"{where}: Nsight advice on an AMD GPU")
            if f.platform == "CUDA" and re.search(r"rocprof|omniperf", rec, re.I):
                out.append(f"{where}: rocprof advice on an NVIDIA GPU")
    mg = results.multigpu
    waits = (mg.rank_wait_ns or {}) if mg is not None else {}
    for run in results.runs:
        wait = waits.get(run.trace.meta.rank)
        for fd in run.findings:
            if fd.rule not in ("communication", "dominant_category") or not wait:
                continue
            time = next((e.value for e in fd.evidence if e.label in ("communication time", "time")), None)
            comm = fd.rule == "communication" or "communication" in fd.title
            if comm and time and wait >= 0.5 * time and "wait" not in (fd.title + fd.implication).lower():
                out.append(f"{run.trace.label}: [{fd.rule}] communication told as work while {wait} ns of its "
                           f"{time} ns is waiting on peers")
    return out


@pytest.mark.parametrize("name, paths, known", input_sets(), ids=[n[-60:] for n, _, _ in input_sets()])
def test_invariants_hold(name, paths, known, tmp_path):
    try:
        results = tracestory.analyze([str(p) for p in paths])
    except TracestoryError as e:
        if not known:
            raise
        pytest.xfail(f"not read yet ({e}); the corpus expectations say: {known}")
    text = tracestory.report(results, tmp_path / "r.md").read_text()
    bad = violations(results, text)
    assert not bad, "\n".join(bad)
