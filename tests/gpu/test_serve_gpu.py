"""The serving engine on a CUDA GPU: decode CUDA graphs, FlexAttention over the paged cache,
and a served request with graphs on (run on the device machine).

Expected tokens come from a second path: the same model with the graphs' body run without a
graph (same kernels: bitwise the same ids), and the SDPA gather path (another attention
implementation, float32: the same greedy ids on these random weights)."""

import json

import pytest
import torch
from ragged_requests import complete, drive  # tests/gpu/ragged_requests.py

from tracestory.models import llama
from tracestory.models.fp8 import quantize_reference, quantize_stack
from tracestory.models.llama_config import LlamaConfig
from tracestory.serve import ServeOptions, start_server_thread, wait_healthy
from tracestory.serve.model import PagedLlama

pytestmark = pytest.mark.gpu

BS, NB, SEQS, BUDGET = 16, 96, 4, 64


def _run(attention, prepare, graphs=True, mixed=True, replay=True, glue="triton", dtype=torch.float32, fp8="off",
         keep=None):
    """A continuous-batching run over 7 ragged requests (chunked prefills, decode at batch 1..4).
    ``mixed``: prefill/mixed buckets built; ``replay=False``: the graphs are captured but their
    bodies run instead (same kernels, no replay); ``glue``: fused Triton glue or torch ops; ``keep``:
    a list that receives the model."""
    cfg = LlamaConfig.from_name("llama-3-8b")
    m = PagedLlama(cfg, layers=2, num_blocks=NB, block_size=BS, vocab=1024, device="cuda", dtype=dtype,
                   seed=2, attention=attention)
    if fp8 != "off":
        quantize_stack(m.stack.layers, fp8)
    if prepare:
        m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET, cuda_graphs=graphs, mixed_graphs=mixed, glue=glue)
        assert m.startup["glue"] == glue
        if not replay:
            m._graphs.use_graphs = False
            m._mixed.use_graphs = False
    if keep is not None:
        keep.append(m)
    return drive(m, block_size=BS, num_blocks=NB, max_batch_tokens=BUDGET, max_num_seqs=SEQS)


def _first_difference(a, b):
    for rid in sorted(a):
        if a[rid] != b.get(rid):
            return rid, a[rid], b.get(rid)
    return None


def test_graph_replay_gives_the_tokens_of_the_same_body_run_eagerly():
    graph, paths = _run("flex", prepare=True, graphs=True)
    # decode-only iterations and the prefill/mixed ones both replay graphs
    assert paths.count("graph") > 10 and paths.count("mixed-graph") >= 3 and "eager" not in paths
    bodies, bpaths = _run("flex", prepare=True, graphs=True, replay=False)
    assert {"static", "mixed-static"} <= set(bpaths) and not {"graph", "mixed-graph"} & set(bpaths)
    assert _first_difference(graph, bodies) is None
    static, spaths = _run("flex", prepare=True, graphs=False)
    assert "static" in spaths and "graph" not in spaths
    assert _first_difference(graph, static) is None


def test_flex_on_cuda_gives_the_tokens_of_sdpa():
    flex, _ = _run("flex", prepare=True, graphs=True)
    sdpa, _ = _run("sdpa", prepare=False)
    assert _first_difference(flex, sdpa) is None
    # without the prefill/mixed buckets those iterations run eagerly, with the same tokens
    eager_mixed, paths = _run("flex", prepare=True, graphs=True, mixed=False)
    assert "eager" in paths and "mixed-graph" not in paths
    assert _first_difference(eager_mixed, sdpa) is None


def test_served_request_completes_with_graphs(tmp_path):
    log = tmp_path / "sched.jsonl"
    h = start_server_thread(ServeOptions(port=0, device="cuda", preset="llama-3-8b", layers=2, max_num_seqs=8,
                                         num_blocks=256, max_batch_tokens=128, event_log=str(log)))
    try:
        wait_healthy(h.url, timeout_s=60)
        outs = complete(h.url, (40, 300), max_tokens=24)
    finally:
        h.stop()
    assert [o["usage"]["completion_tokens"] for o in outs] == [24, 24]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    meta = lines[0]
    assert meta["attention_backend"] == "flex" and meta["startup"]["cuda_graphs"] is True
    assert meta["startup"]["decode_buckets"] == [1, 2, 4, 8] and meta["startup"]["compile_s"] > 0
    # chunk rows 128 (the budget) x decode rows 0, 1, 2, 4, 8, each with and without fresh prompts
    # (bf16: the fresh-prompt flash path is on): one graph each
    assert meta["startup"]["fresh_attention"] is True
    assert meta["startup"]["chunk_rows"] == [128] and meta["startup"]["mixed_graphs"] == 10
    decode = [o for o in lines if o["type"] == "iteration" and o["prefill_tokens"] == 0]
    assert len(decode) >= 20


# ---------------------------------------------------------------- fresh prompts through flash


def test_fresh_prompts_through_flash_follow_the_flex_chunk_kernel(monkeypatch):
    """bf16, two fresh prompts in one prefill: the hidden states with the chunk attention through
    the flash call (serve.fresh_attention) against the FlexAttention chunk kernel (another
    attention implementation: bf16 rounding apart, the same function)."""
    from tracestory.serve import fresh_attention

    calls = []
    real = fresh_attention.attend
    monkeypatch.setattr(fresh_attention, "attend", lambda *a: calls.append(a[-1]) or real(*a))
    outs = []
    for fresh in (True, False):
        cfg = LlamaConfig.from_name("llama-3-8b")
        m = PagedLlama(cfg, layers=2, num_blocks=NB, block_size=BS, vocab=1024, device="cuda",
                       dtype=torch.bfloat16, seed=2, attention="flex")
        before = len(calls)
        m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET, cuda_graphs=False)
        assert m._fresh is True and m.startup["fresh_attention"] is True
        # the start-up warm-up compiles the FlexAttention chunk kernel, never the flash call
        assert len(calls) == before
        m._fresh = fresh
        x = m.embed[torch.arange(60, device="cuda") * 7]
        with torch.inference_mode():
            outs.append(m.forward_hidden(x, [(0, 40, [0, 1, 2]), (0, 20, [5, 6])]).float())
    assert calls == [60, 60]          # one flash call per layer, over the 60 chunk rows, in the fresh run only
    rel = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()
    assert rel < 1e-2, rel


def test_fresh_buckets_replay_like_their_bodies():
    """bf16 continuous batching: the fresh prefill buckets' graph replays give the tokens of their
    bodies run without replay (same kernels), and fresh buckets were used; their kernel is cuDNN's
    graph where the frontend imports (serve.fresh_cudnn), else flash."""
    from tracestory.serve import fresh_cudnn

    kept = []
    graph, paths = _run("flex", prepare=True, dtype=torch.bfloat16, keep=kept)
    assert kept[0]._mixed.fresh and kept[0]._mixed.fresh_runs >= 1 and "mixed-graph" in paths
    chosen = kept[0].startup["fresh_kernel"]
    assert chosen["kernel"] == ("flash" if fresh_cudnn.import_reason() else "cudnn"), chosen
    assert any(k[2] for k in kept[0]._mixed.graphs)
    bodies, _ = _run("flex", prepare=True, dtype=torch.bfloat16, replay=False)
    assert _first_difference(graph, bodies) is None


# ---------------------------------------------------------------- the fused glue (models.glue_triton)
@pytest.fixture(scope="module")
def glue_triton():
    from tracestory.models import glue_triton  # imports triton: collected on CPU-only machines too

    return glue_triton


def _close_fp8(q, s, ref):
    """``(q, s)`` against :func:`quantize_reference` of ``ref``: the same scales (to 1e-2: the
    amax of a row whose last bit of rsqrt differs), every dequantised element within one e4m3
    step of the reference's, and nearly all codes equal."""
    qr, sr = quantize_reference(ref, per_row=True)
    assert torch.allclose(s, sr, rtol=1e-2, atol=0)
    a, b = q.float() * s, qr.float() * sr
    step = b.abs() * 2.0 ** -3 + sr * 2.0 ** -9          # one e4m3 step at that magnitude
    assert bool(((a - b).abs() <= step).all())
    assert (q.float() == qr.float()).float().mean().item() > 0.99


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_glue_norm_matches_the_torch_ops(glue_triton, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    x, r = (torch.randn(37, 4096, generator=g, device="cuda").to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(4096, generator=g, device="cuda")).to(dtype)
    h, y = glue_triton.norm(x, w, 1e-5, residual=r)
    assert torch.equal(h, x + r)
    ref = llama.rms_norm(x + r, w, 1e-5)
    assert torch.allclose(y.float(), ref.float(), rtol=2 ** -7 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)
    h2, (q, s) = glue_triton.norm(x, w, 1e-5, quant=True)
    assert h2 is x
    _close_fp8(q, s, llama.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_glue_rope_writes_the_cache_as_the_torch_ops(glue_triton, dtype):
    H, K, d, T = 8, 2, 128, 19
    g = torch.Generator(device="cuda").manual_seed(2)
    qkv = torch.randn(T, (H + 2 * K) * d, generator=g, device="cuda").to(dtype)
    pos = torch.randint(0, 5000, (T,), generator=g, device="cuda")
    inv = 1.0 / 500000.0 ** (torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
    ang = pos.double()[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos().float(), ang.sin().float()
    kc, vc = (torch.zeros(64, K, d, device="cuda", dtype=dtype) for _ in range(2))
    slots = torch.randperm(64, generator=g, device="cuda")[:T]
    q = glue_triton.rope_qkv(qkv, cos, sin, kc, vc, slots, H, K)
    qq, kk, vv = qkv.split([H * d, K * d, K * d], dim=-1)
    tol = {"rtol": 2 ** -7, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    assert q.shape == (H, T, d)
    assert torch.allclose(q.float(), llama.rope(qq.view(T, H, d).transpose(0, 1), cos, sin).float(), **tol)
    kref = llama.rope(kk.reshape(T, K, d).transpose(0, 1), cos, sin).transpose(0, 1)
    assert torch.allclose(kc[slots].float(), kref.float(), **tol)
    assert torch.equal(vc[slots], vv.reshape(T, K, d))
    rest = torch.ones(64, dtype=torch.bool, device="cuda")
    rest[slots] = False
    assert not kc[rest].any() and not vc[rest].any()          # no other slot written


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_glue_silu_mul_matches_the_torch_ops(glue_triton, dtype):
    g = torch.Generator(device="cuda").manual_seed(3)
    I = 7168 + 16                                             # not a multiple of the kernel's tile
    gu = (torch.randn(5, 2 * I, generator=g, device="cuda") * 3).to(dtype)
    ref = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
    out = glue_triton.silu_mul(gu)
    assert torch.allclose(out.float(), ref.float(), rtol=2 ** -7 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)
    q, s = glue_triton.silu_mul(gu, quant=True)
    _close_fp8(q, s, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n, vocab", [(1, 128256), (3, 64128), (16, 1000), (2, 4096)])
def test_glue_row_max_picks_as_torch_argmax(glue_triton, dtype, n, vocab):
    """The LM head's greedy pick in two kernels against torch's argmax and max: integer-valued
    logits in a narrow range, so every row holds its maximum several times (ties go to the
    lowest index), and one row whose maximum sits in the last, partial block."""
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randint(-50, 6, (n, vocab), generator=g, device="cuda").to(dtype)
    x[-1, :] = -60
    x[-1, vocab - 1] = 3
    val, idx = glue_triton.row_max(x)
    assert torch.equal(idx, x.float().argmax(-1))
    assert torch.equal(val, x.float().max(-1).values)
    assert idx[-1].item() == vocab - 1
    assert n == 1 or (x[0] == x[0].max()).sum().item() > 1            # row 0 did hold a tie


def test_fused_glue_gives_the_tokens_of_the_torch_glue():
    fused, paths = _run("flex", prepare=True, glue="triton")
    assert "graph" in paths and "mixed-graph" in paths
    plain, _ = _run("flex", prepare=True, glue="torch")
    assert _first_difference(fused, plain) is None


def test_pdl_gives_the_tokens_of_plain_launches(monkeypatch):
    """bf16 with FP8 row-wise projections, the fused glue and the small-M GEMM (one config, always
    chosen, so both runs use the same kernels): with programmatic dependent launch (models.pdl)
    the decode and mixed graphs must give the ids of the same kernels launched without it."""
    from tracestory.models import fp8, fp8_small_m, pdl

    monkeypatch.setattr(fp8_small_m, "CONFIGS", ((256, 4),))
    tune = fp8.tune_small_m
    monkeypatch.setattr(fp8, "tune_small_m", lambda groups, rows: tune(groups, rows, margin=1e9))
    runs = []
    for on in ("1", "0"):
        monkeypatch.setenv(pdl.ENV, on)
        keep = []
        runs.append(_run("flex", prepare=True, glue="triton", dtype=torch.bfloat16, fp8="rowwise", keep=keep))
        assert any(r["chosen"] != "_scaled_mm" for r in keep[0].startup["small_m"])
        assert pdl.enabled(torch.device("cuda")) == (on == "1")
    (with_pdl, paths), (plain, _) = runs
    assert "graph" in paths and "mixed-graph" in paths
    assert _first_difference(with_pdl, plain) is None


def test_fused_glue_with_fp8_follows_the_torch_glue():
    """bf16 with FP8 row-wise projections: the two paths round alike but not bit for bit (rsqrt,
    exp), and a one-step difference in an FP8 code can flip a near-tie of the random weights'
    argmax, so the hidden states of one prefill are compared instead of tokens."""
    outs = []
    for glue in ("triton", "torch"):
        cfg = LlamaConfig.from_name("llama-3-8b")
        m = PagedLlama(cfg, layers=2, num_blocks=NB, block_size=BS, vocab=1024, device="cuda",
                       dtype=torch.bfloat16, seed=2, attention="flex")
        quantize_stack(m.stack.layers, "rowwise")
        m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET, cuda_graphs=False, glue=glue)
        assert m.startup["glue"] == glue and m.startup["stacked_projections"]
        x = m.embed[torch.arange(60, device="cuda") * 7]
        with torch.inference_mode():
            outs.append(m.forward_hidden(x, [(0, 60, list(range(4)))]).float())
    rel = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()
    assert rel < 2e-2, rel
