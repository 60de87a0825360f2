"""tracestory compare: two runs side by side.

Side B is BUILT from the real H200 Llama fixture (conftest.H200_LLAMA) by editing its JSON in
tmp_path, so every expected number is a plain json sum over the file the test wrote:

* ``fused``: the eager RMSNorm (pow, mean, +eps, rsqrt) becomes one Inductor-named kernel: every
  ``pow_tensor_scalar`` kernel is renamed ``triton_red_fused_add_mean_mul_pow_rsqrt_0`` and the
  mean / rsqrt / add-on-self kernels are dropped with their launch calls (what torch.compile
  does to this module, in name and count; durations are the eager pow kernel's).
* ``gemm_half``: every cuBLAS ``nvjet_*`` kernel takes half its time.

Real eager/compiled captures go into ``tests/data/compare/`` as ``<name>_a.trace.json.gz`` and
``<name>_b.trace.json.gz``: each pair found there is one more parametrization of the
invariant test below (same checks, same plain-json expectations).
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

from conftest import H200_LLAMA, TEST_DATA
from tracestory.analysis import analyze
from tracestory.analysis.compare import compare, comparison_findings, fused_ops, normalize_name
from tracestory.cli import main
from tracestory.errors import UsageError
from tracestory.ingest import load_inputs
from tracestory.render.compare import comparison_json, render_comparison, what_changed

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
LAUNCH = re.compile(r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")
FUSED = "triton_red_fused_add_mean_mul_pow_rsqrt_0"
DROPPED = ("MeanOps", "rsqrt_kernel_cuda", "CUDAFunctorOnSelf_add")

# Category of every kernel of these traces, by name substring, written here (first match wins).
NEEDLES = [("triton_", "norm"),  # Inductor names a fused RMSNorm after its rsqrt
           ("nvjet_", "gemm"), ("splitKreduce_kernel", "gemm"), ("_sdpa_", "attention"),
           ("lean_reduction_kernel", "attention"), ("reduce_kernel", "reduction"),  # cuDNN runs it inside SDPA
           ("elementwise_kernel", "elementwise"), ("Memcpy", "memcpy"), ("Memset", "memset")]


# ------------------------------------------------------------------ plain-json helpers


def _doc(path: Path) -> dict:
    return json.load(gzip.open(path))


def _write(doc: dict, path: Path) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def _ns(us: float) -> int:
    return round(us * 1000)


def _gpu(doc):
    return [e for e in doc["traceEvents"] if e.get("cat") in GPU_CATS]


def _per_category(doc) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for e in _gpu(doc):
        cat = next(c for needle, c in NEEDLES if needle in e["name"])
        t, n = out.get(cat, (0, 0))
        out[cat] = (t + _ns(e["dur"]), n + 1)
    return out


def _launches(doc) -> int:
    return sum(1 for e in doc["traceEvents"] if e.get("cat") in API_CATS and LAUNCH.match(e["name"]))


def _key(name: str) -> str:
    """The match key, by the rule the compare docstring states."""
    s = " ".join(name.split()).removeprefix("void ")
    return re.sub(r"_\d+$", "", s) if s.startswith("triton_") else s


def _per_kernel(doc) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for e in _gpu(doc):
        t, n = out.get(_key(e["name"]), (0, 0))
        out[_key(e["name"])] = (t + _ns(e["dur"]), n + 1)
    return out


def _iterations(doc, family: str) -> list[int]:
    """Per range of ``family``: max(range end, last end of a GPU op launched in it) - start."""
    ranges = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in doc["traceEvents"]
              if e.get("cat") == "user_annotation" and re.fullmatch(rf"{family}_\d+", e["name"])]
    launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in doc["traceEvents"] if e.get("cat") in API_CATS}
    ends = [s_e[1] for s_e in ranges]
    for e in _gpu(doc):
        t = launch.get(e["args"].get("correlation"))
        for i, (s, en) in enumerate(ranges):
            if t is not None and s <= t < en:
                ends[i] = max(ends[i], _ns(e["ts"]) + _ns(e["dur"]))
    return [en - s for (s, _), en in zip(ranges, ends, strict=True)]


# ------------------------------------------------------------------ built variants


def build_fused(tmp: Path) -> Path:
    doc = _doc(H200_LLAMA)
    gone = {e["args"]["correlation"] for e in doc["traceEvents"]
            if e.get("cat") == "kernel" and any(d in e["name"] for d in DROPPED)}
    out = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and any(d in e["name"] for d in DROPPED):
            continue
        if e.get("cat") in API_CATS and e.get("args", {}).get("correlation") in gone:
            continue
        if e.get("cat") == "kernel" and "pow_tensor_scalar" in e["name"]:
            e = dict(e, name=FUSED)
        out.append(e)
    doc["traceEvents"] = out
    return _write(doc, tmp / "fused.trace.json.gz")


def build_gemm_half(tmp: Path) -> Path:
    doc = _doc(H200_LLAMA)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("nvjet_"):
            e["dur"] = round(e["dur"] / 2, 3)
    return _write(doc, tmp / "gemm_half.trace.json.gz")


def _real_pairs() -> list[tuple[str, Path, Path]]:
    folder = TEST_DATA / "compare"
    pairs = []
    for a in sorted(folder.glob("*_a.trace.json.gz")) if folder.is_dir() else []:
        b = a.with_name(a.name.replace("_a.trace", "_b.trace"))
        if b.exists():
            pairs.append((a.name.split("_a.trace")[0], a, b))
    return pairs


def _given(a: Path, b: Path):
    return lambda tmp: (a, b)


PAIRS = [("fused", lambda tmp: (H200_LLAMA, build_fused(tmp))),
         ("gemm_half", lambda tmp: (H200_LLAMA, build_gemm_half(tmp)))] + [
    (name, _given(a, b)) for name, a, b in _real_pairs()]


def _analysis(path):
    return analyze(load_inputs([path]).traces[0])


@pytest.fixture(scope="module")
def fused_cmp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fused")
    b = build_fused(tmp)
    aa, ab = _analysis(H200_LLAMA), _analysis(b)
    return compare(aa, ab, label_a="eager", label_b="fused"), _doc(H200_LLAMA), _doc(b), (aa, ab)


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("name,build", PAIRS, ids=[p[0] for p in PAIRS])
def test_sides_match_plain_json(name, build, tmp_path):
    pa, pb = build(tmp_path)
    c = compare(_analysis(pa), _analysis(pb), label_a="A", label_b="B", top=10_000)
    da, db = _doc(pa), _doc(pb)
    for side, doc in ((c.a, da), (c.b, db)):
        gpu = _gpu(doc)
        assert side.kernel_count == sum(e["cat"] == "kernel" for e in gpu)
        assert side.memop_count == len(gpu) - side.kernel_count
        assert side.gpu_time_ns == sum(_ns(e["dur"]) for e in gpu)
        assert side.launch_count == _launches(doc)
        assert side.triton_kernel_count == sum(e["cat"] == "kernel" and e["name"].startswith("triton_") for e in gpu)
    # Kernels, matched by normalized name, with per-side time and runs.
    ka, kb = _per_kernel(da), _per_kernel(db)
    got = {k.key: ((k.a_time_ns, k.a_count), (k.b_time_ns, k.b_count)) for k in c.kernels}
    assert got == {k: (ka.get(k, (0, 0)), kb.get(k, (0, 0))) for k in set(ka) | set(kb)}
    assert sum(d.a_time_ns for d in c.categories) == c.a.gpu_time_ns
    assert sum(d.b_time_ns for d in c.categories) == c.b.gpu_time_ns
    json.dumps(comparison_json(c))  # plain JSON, no NaN objects


@pytest.mark.parametrize("name,build", PAIRS[:2], ids=[p[0] for p in PAIRS[:2]])
def test_categories_and_speedups(name, build, tmp_path):
    pa, pb = build(tmp_path)
    da, db = _doc(pa), _doc(pb)
    c = compare(_analysis(pa), _analysis(pb), label_a="A", label_b="B")
    ea, eb = _per_category(da), _per_category(db)
    got = {d.name: ((d.a_time_ns, d.a_count), (d.b_time_ns, d.b_count)) for d in c.categories}
    assert got == {k: (ea.get(k, (0, 0)), eb.get(k, (0, 0))) for k in set(ea) | set(eb)}
    for d in c.categories:
        assert d.delta_ns == d.b_time_ns - d.a_time_ns
        assert d.a_share == pytest.approx(d.a_time_ns / sum(t for t, _ in ea.values()))
    ta, tb = sum(t for t, _ in ea.values()), sum(t for t, _ in eb.values())
    s = {x.metric: x for x in c.speedups}
    assert s["GPU op time"].speedup == pytest.approx(ta / tb)
    ia, ib = _iterations(da, "decode"), _iterations(db, "decode")
    assert (c.a.iteration.family, c.a.iteration.count) == ("decode", 16)
    assert c.a.iteration.median_ns == statistics.median(ia)
    assert c.b.iteration.median_ns == statistics.median(ib)
    assert c.headline.metric == "iteration median"
    assert c.headline.speedup == pytest.approx(statistics.median(ia) / statistics.median(ib))


def test_gemm_half_changes(tmp_path):
    b = build_gemm_half(tmp_path)
    c = compare(_analysis(H200_LLAMA), _analysis(b))
    halved = sum(_ns(e["dur"]) for e in _gpu(_doc(H200_LLAMA)) if e["name"].startswith("nvjet_")) - sum(
        _ns(e["dur"]) for e in _gpu(_doc(b)) if e["name"].startswith("nvjet_"))
    assert [d.name for d in c.changes.shrank] == ["gemm"]
    assert c.changes.shrank[0].delta_ns == -halved
    assert c.changes.grew == ()
    assert (c.changes.only_a_kernels, c.changes.only_b_kernels) == (0, 0)
    assert (c.changes.kernel_count_delta, c.changes.launch_delta) == (0, 0)
    assert not c.a.compiled and not c.b.compiled
    f = comparison_findings(c)
    assert [x.rule for x in f] == ["run_comparison"]


def test_fused_kernels_explain_the_eager_ones(fused_cmp):
    c, da, db, _ = fused_cmp
    dropped = [e for e in _gpu(da) if any(d in e["name"] for d in DROPPED) or "pow_tensor_scalar" in e["name"]]
    assert c.b.compiled and not c.a.compiled
    assert c.b.compile_evidence == f"{len(_gpu(db)) - len(_gpu(da)) + len(dropped)} Triton/Inductor kernel executions"
    assert c.changes.only_b_kernels == 1
    assert c.changes.only_a_kernels == 4
    assert c.changes.only_a_time_ns == sum(_ns(e["dur"]) for e in dropped)
    assert c.changes.launch_delta == _launches(db) - _launches(da)
    assert c.changes.launch_reduction == pytest.approx((_launches(da) - _launches(db)) / _launches(da))
    (f,) = c.fused
    assert (f.side, f.name, f.ops) == ("b", FUSED, ("add", "mean", "mul", "pow", "rsqrt"))
    assert set(f.replaces) == {_key(e["name"]) for e in dropped}
    assert f.replaced_count == len(dropped)
    assert f.replaced_time_ns == sum(_ns(e["dur"]) for e in dropped)
    assert f.count == sum(e["name"] == FUSED for e in _gpu(db))


def test_compiled_vs_eager_finding(fused_cmp):
    c, da, db, (aa, ab) = fused_cmp
    ma, mb = statistics.median(_iterations(da, "decode")), statistics.median(_iterations(db, "decode"))
    (f,) = comparison_findings(c)
    assert f.rule == "compiled_vs_eager"
    expected = "as fast as" if abs(ma / mb - 1) < 0.005 else ("faster" if ma > mb else "slower")
    assert expected in f.title and "Compiled (fused)" in f.title and "eager (eager)" in f.title
    ev = {e.label: e.value for e in f.evidence}
    assert ev["eager: launches"] == _launches(da) and ev["fused: launches"] == _launches(db)
    assert ev["speedup of fused vs eager (iteration median)"] == pytest.approx(ma / mb)
    # Swapping the sides names the compiled run correctly.
    (g,) = comparison_findings(compare(ab, aa, label_a="fused", label_b="eager"))
    assert "Compiled (fused)" in g.title and "eager (eager)" in g.title


def test_graph_launch_marks_compiled(tmp_path):
    doc = _doc(H200_LLAMA)
    first = next(e for e in doc["traceEvents"] if e.get("name") == "cudaLaunchKernel")
    first["name"] = "cudaGraphLaunch"
    c = compare(_analysis(H200_LLAMA), _analysis(_write(doc, tmp_path / "g.json.gz")))
    assert (c.b.graph_launch_count, c.b.launch_count, c.b.compiled) == (1, _launches(doc), True)
    assert c.b.compile_evidence == "1 CUDA graph launches"


def test_markdown_numbers_and_shape(fused_cmp):
    c, da, db, _ = fused_cmp
    md = render_comparison(c)
    assert md.count("```") % 2 == 0
    inside = False
    for line in md.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            assert len(line) <= 100, line
    for block in re.findall(r"((?:^\|.*\n)+)", md, re.MULTILINE):
        rows = block.strip().splitlines()
        assert {len(re.split(r"(?<!\\)\|", r)) for r in rows} == {len(re.split(r"(?<!\\)\|", rows[0]))}
    assert "## " not in md.replace("### ", "")  # one title, subsections only: embeddable
    prose = "\n".join(what_changed(c))
    assert f"Launches: {_launches(da)} -> {_launches(db)} API calls" in prose
    assert f"Kernels: {c.a.kernel_count} -> {c.b.kernel_count} runs; 4 kernel names only in eager" in prose
    # The eager-vs-compiled table shape: metric rows, both runs in ms, the speedup.
    assert "|  | eager [ms] | fused [ms] | speedup fused vs eager |" in md
    med = f"{statistics.median(_iterations(da, 'decode')) / 1e6:.3f}"
    assert f"| decode iteration, median (16 vs 16) | {med} |" in md


def test_json_document(fused_cmp):
    c, da, db, _ = fused_cmp
    doc = json.loads(json.dumps(comparison_json(c)))
    assert doc["schema"] == "tracestory.comparison/1"
    assert doc["a"]["launch_count"] == _launches(da) and doc["b"]["launch_count"] == _launches(db)
    cats = {d["name"]: (d["a_time_ns"], d["b_time_ns"]) for d in doc["categories"]}
    ea, eb = _per_category(da), _per_category(db)
    assert cats["norm"] == (0, eb["norm"][0]) and cats["elementwise"] == (ea["elementwise"][0], eb["elementwise"][0])
    assert doc["findings"][0]["rule"] == "compiled_vs_eager"


def test_helpers():
    assert fused_ops("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_3") == ("add", "mean", "mul", "pow", "rsqrt")
    assert fused_ops("nvjet_sm90_tst") == ()
    assert normalize_name("void  foo<int>(int)") == "foo<int>(int)"
    assert normalize_name("triton_poi_fused_add_12") == "triton_poi_fused_add"


def test_cli(tmp_path, capsys):
    b = build_fused(tmp_path)
    md, js = tmp_path / "c.md", tmp_path / "c.json"
    assert main(["compare", str(H200_LLAMA), str(b), "--label-a", "eager", "--label-b", "compiled",
                 "-o", str(md), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "Compiled (compiled)" in out and "Top kernels" in out
    assert md.read_text().startswith("# Run comparison: eager vs compiled")
    assert json.loads(js.read_text())["b"]["label"] == "compiled"
    # Default labels come from the file names.
    assert main(["compare", str(H200_LLAMA), str(b)]) == 0
    assert "fused" in capsys.readouterr().out


def test_cli_errors(tmp_path, capsys):
    folder = tmp_path / "two"
    folder.mkdir()
    for n in ("r0", "r1"):
        (folder / f"{n}.trace.json.gz").write_bytes(H200_LLAMA.read_bytes())
    assert main(["compare", str(folder), str(H200_LLAMA)]) == 2
    assert "one trace per side, found 2" in capsys.readouterr().err
    assert main(["compare", str(H200_LLAMA), str(H200_LLAMA), "-o", str(H200_LLAMA)]) == 2
    assert main(["compare", str(tmp_path / "missing.json"), str(H200_LLAMA)]) == 2


def test_taxonomy_mismatch():
    from tracestory.analysis.categories import taxonomy

    a = _analysis(H200_LLAMA)
    with pytest.raises(UsageError, match="same taxonomy"):
        compare(a, analyze(a.trace, taxonomy("moe")))


@pytest.mark.parametrize("pair", ["decode_default", "decode_max-autotune"])
def test_seed001_eager_vs_compiled_on_real_h200_captures(pair):
    """The eager-vs-compiled table on our own captures: which side is compiled, and by how much the GPU
    op time changed, from a plain json sum of each file; the finding names the compiled side."""
    pa, pb = TEST_DATA / "compare" / f"{pair}_a.trace.json.gz", TEST_DATA / "compare" / f"{pair}_b.trace.json.gz"
    da, db = _doc(pa), _doc(pb)
    c = compare(_analysis(pa), _analysis(pb), label_a="eager", label_b="compiled")
    assert not c.a.compiled and c.b.compiled
    assert c.b.triton_kernel_count == sum(e["cat"] == "kernel" and e["name"].startswith("triton_") for e in _gpu(db)) > 0
    op = next(s for s in c.speedups if s.metric == "GPU op time")
    ta, tb = sum(_ns(e["dur"]) for e in _gpu(da)), sum(_ns(e["dur"]) for e in _gpu(db))
    assert (op.a_ns, op.b_ns) == (ta, tb) and op.speedup == pytest.approx(ta / tb)
    assert tb < ta  # compiled is faster on the GPU here (unlike earlier RTX runs)
    f = next(f for f in comparison_findings(c) if f.rule == "compiled_vs_eager")
    assert "compiled" in f.title.lower() and "faster" in f.title.lower()
