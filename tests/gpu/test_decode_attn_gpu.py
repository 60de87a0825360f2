"""The paged split-KV decode kernels (models.decode_attn_triton) on a CUDA GPU.

Expected values come from a second path: per sequence, its keys gathered through the block
table by torch indexing and torch's SDPA (GQA by repeating the KV heads), in float32. The
engine's greedy tokens with the kernels in its decode graphs are compared with the same engine
under ``TRACESTORY_DECODE_ATTN=0`` (FlexAttention's decoding kernel), float32."""

import pytest
import torch
import torch.nn.functional as F
from ragged_requests import drive  # tests/gpu/ragged_requests.py

from tracestory.models.llama_config import LlamaConfig
from tracestory.serve.model import PagedLlama

pytestmark = pytest.mark.gpu


class _Kernels:
    """models.decode_attn_triton, imported at first use: it imports Triton, which CI (no GPU, where
    this file is collected and deselected) does not have."""

    def __getattr__(self, name):
        from tracestory.models import decode_attn_triton

        return getattr(decode_attn_triton, name)


dat = _Kernels()


def _case(ctxs, *, H=32, KH=8, d=128, bs=16, dtype=torch.float32, gen=None, width=None):
    """Random caches, scattered block tables (padding columns = the scratch block), positions."""
    gen = gen or torch.Generator(device="cuda").manual_seed(0)
    B = len(ctxs)
    need = [-(-c // bs) for c in ctxs]
    nb = sum(need) + 8
    W = width or max(need)
    kc = (torch.randn((nb + 1) * bs, KH, d, device="cuda", generator=gen) * 0.5).to(dtype)
    vc = torch.randn((nb + 1) * bs, KH, d, device="cuda", generator=gen).to(dtype)
    perm = torch.randperm(nb, device="cuda", generator=gen)
    tables = torch.full((B, W), nb, dtype=torch.int64, device="cuda")
    off = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[off:off + n]
        off += n
    pos = torch.tensor([c - 1 for c in ctxs], dtype=torch.int64, device="cuda")
    # q as rope_qkv leaves it: [H, B, d], a transposed view of [B, H, d] memory
    q = (torch.randn(B, H, d, device="cuda", generator=gen) * 0.5).to(dtype).transpose(0, 1)
    return q, kc, vc, tables, pos, bs


def _reference(q, kc, vc, tables, pos, bs):
    H, B, d = q.shape
    KH = kc.shape[1]
    out = []
    for b in range(B):
        j = torch.arange(int(pos[b]) + 1, device="cuda")
        slots = tables[b, j // bs] * bs + j % bs
        k = kc[slots].float().transpose(0, 1).repeat_interleave(H // KH, 0)     # [H, L, d]
        v = vc[slots].float().transpose(0, 1).repeat_interleave(H // KH, 0)
        o = F.scaled_dot_product_attention(q[:, b:b + 1].float(), k, v)          # [H, 1, d]
        out.append(o.reshape(H * d))
    return torch.stack(out)


@pytest.mark.parametrize("ctxs", [[1], [15], [16], [17], [600], [4000], [1, 15, 16, 17], [600, 4000, 3, 64, 65],
                                  [600] * 16])
def test_kernels_match_gathered_sdpa_in_float32(ctxs):
    args = _case(ctxs)
    out = dat.decode(*args)
    assert out.shape == (len(ctxs), 32 * 128) and out.dtype == torch.float32
    torch.testing.assert_close(out, _reference(*args), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("splits", [1, 3, 32])
@pytest.mark.parametrize("fused", [True, False])
def test_any_split_count_either_combine_gives_the_same_attention(splits, fused):
    args = _case([1, 130, 600, 4000])
    out = dat.decode(*args, splits=splits, fused=fused)
    torch.testing.assert_close(out, _reference(*args), atol=2e-5, rtol=1e-4)
    # the fused kernel's arrival counters are back to zero for the next call
    assert all(int(c.abs().sum()) == 0 for c in dat._COUNTERS.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernels_in_half_precision_follow_the_float32_reference(dtype):
    args = _case([1, 17, 600, 4000], dtype=dtype)
    out = dat.decode(*args)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), _reference(*args), atol=2e-2, rtol=2e-2)


def test_group_of_one_and_of_sixteen_heads_and_a_small_block():
    for H, KH, bs in ((8, 8, 16), (32, 2, 16), (8, 2, 8)):
        args = _case([5, 300], H=H, KH=KH, d=64, bs=bs)
        torch.testing.assert_close(dat.decode(*args), _reference(*args), atol=2e-5, rtol=1e-4)


def test_programmatic_dependent_launch_changes_no_bit(monkeypatch):
    from tracestory.models import pdl

    args = _case([1, 600, 4000], dtype=torch.bfloat16)
    outs = []
    for on in ("1", "0"):
        monkeypatch.setenv(pdl.ENV, on)
        outs.append(dat.decode(*args))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_quantisation_is_the_quantisers_bit_for_bit(dtype):
    """The FP8 row-wise input of Wo written by the last group of each sequence equals the
    quantiser kernel (models.quant_triton) run on the kernel's own output."""
    from tracestory.models.quant_triton import quantize_per_row

    args = _case([1, 17, 600, 4000], dtype=dtype)
    ref_q, ref_s = quantize_per_row(dat.decode(*args))
    for fused in (True, False):
        q8, s8 = dat.decode(*args, quant=True, fused=fused)
        assert q8.dtype == torch.float8_e4m3fn and q8.shape == (4, 32 * 128) and s8.shape == (4, 1)
        assert torch.equal(q8.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s8, ref_s)
    assert all(int(c.abs().sum()) == 0 for c in dat._COUNTERS.values())


@pytest.mark.parametrize("fused", [False, True])
def test_graph_captured_with_other_tables_replays_the_new_ones(fused):
    """Capture over one batch's tables and positions, then write another batch's into the same
    buffers and replay: the output is that batch's attention (no shape or count from the data)."""
    ctx_a, ctx_b = [3, 40, 17, 1], [4000, 16, 600, 129]
    width = -(-4000 // 16)
    a = _case(ctx_a, width=width, gen=torch.Generator(device="cuda").manual_seed(1))
    b = _case(ctx_b, width=width, gen=torch.Generator(device="cuda").manual_seed(2))
    q, kc, vc, tables, pos, bs = a
    kc, vc = kc.clone(), vc.clone()
    kc_b, vc_b = b[1], b[2]
    big = max(kc.shape[0], kc_b.shape[0])
    kbuf = torch.zeros(big, *kc.shape[1:], device="cuda")
    vbuf = torch.zeros_like(kbuf)
    kbuf[:kc.shape[0]], vbuf[:vc.shape[0]] = kc, vc
    qbuf = q.transpose(0, 1).contiguous().transpose(0, 1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            dat.decode(qbuf, kbuf, vbuf, tables, pos, bs, fused=fused)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = dat.decode(qbuf, kbuf, vbuf, tables, pos, bs, fused=fused)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.clone(), _reference(qbuf, kbuf, vbuf, tables, pos, bs), atol=2e-5, rtol=1e-4)
    qbuf.copy_(b[0])
    kbuf.zero_()
    vbuf.zero_()
    kbuf[:kc_b.shape[0]], vbuf[:vc_b.shape[0]] = kc_b, vc_b
    tables.copy_(b[3])
    pos.copy_(b[4])
    g.replay()
    torch.cuda.synchronize()
    expected = _reference(qbuf, kbuf, vbuf, tables, pos, bs)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out, _reference(*b), atol=2e-5, rtol=1e-4)


BS, NB, SEQS, BUDGET = 16, 96, 4, 64


def _engine(monkeypatch, on: str, fused: str = "0"):
    monkeypatch.setenv("TRACESTORY_DECODE_ATTN", on)
    monkeypatch.setenv("TRACESTORY_DECODE_ATTN_FUSED", fused)
    cfg = LlamaConfig.from_name("llama-3-8b")
    m = PagedLlama(cfg, layers=2, num_blocks=NB, block_size=BS, vocab=1024, device="cuda", dtype=torch.float32,
                   seed=2, attention="flex")
    m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET)
    assert m.startup["decode_attn"] == ("triton" if on == "1" else "flex")
    assert m.startup["decode_attn_fused"] is (on == fused == "1")
    return drive(m, block_size=BS, num_blocks=NB, max_batch_tokens=BUDGET, max_num_seqs=SEQS)


@pytest.mark.parametrize("fused", ["0", "1"])
def test_engine_tokens_with_the_kernels_equal_those_with_flex(monkeypatch, fused):
    (new, paths), (flex, _) = _engine(monkeypatch, "1", fused), _engine(monkeypatch, "0")
    assert paths.count("graph") > 10
    assert sorted(new) == sorted(flex) and len(new) == 7
    diff = [(rid, new[rid], flex[rid]) for rid in sorted(new) if new[rid] != flex[rid]]
    assert diff == []


def test_engine_tokens_with_the_kernels_quantisation_equal_the_quantisers(monkeypatch):
    """bf16, FP8 row-wise projections, fused glue: Wo's input quantised by the attention kernel
    or by the quantiser kernel (TRACESTORY_DECODE_ATTN_QUANT=0) is the same bits, so the same ids."""
    from tracestory.models.fp8 import quantize_stack

    runs = []
    monkeypatch.setenv("TRACESTORY_SMALL_M", "0")        # no start-up GEMM timing: _scaled_mm in both
    for on in ("1", "0"):
        monkeypatch.setenv("TRACESTORY_DECODE_ATTN", "1")
        monkeypatch.setenv("TRACESTORY_DECODE_ATTN_FUSED", "1")
        monkeypatch.setenv("TRACESTORY_DECODE_ATTN_QUANT", on)
        cfg = LlamaConfig.from_name("llama-3-8b")
        m = PagedLlama(cfg, layers=2, num_blocks=NB, block_size=BS, vocab=1024, device="cuda",
                       dtype=torch.bfloat16, seed=2, attention="flex")
        quantize_stack(m.stack.layers, "rowwise")
        m.prepare(max_num_seqs=SEQS, max_batch_tokens=BUDGET)
        assert m.startup["decode_attn"] == "triton" and m.startup["decode_attn_quant"] is (on == "1")
        runs.append(drive(m, block_size=BS, num_blocks=NB, max_batch_tokens=BUDGET, max_num_seqs=SEQS))
    (quant, paths), (plain, _) = runs
    assert paths.count("graph") > 10
    assert [(rid, quant[rid], plain.get(rid)) for rid in sorted(quant) if quant[rid] != plain.get(rid)] == []
