"""The Llama model: presets, counted work by hand, the layer against a float64 reference written
here, KV-cache decode against full recompute."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracestory.models.llama_config import (
    LlamaConfig,
    decode_bytes,
    decode_flops,
    layer_params,
    prefill_flops,
)


def test_presets():
    c = LlamaConfig.from_name("llama-3-8b")
    assert (c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim, c.head_dim, c.group) == (4096, 32, 8, 14336, 128, 4)
    assert LlamaConfig.from_name("llama-2-7b").n_kv_heads == 32
    from tracestory.errors import UsageError

    with pytest.raises(UsageError):
        LlamaConfig.from_name("gpt-2")


def test_counts_by_hand():
    c = LlamaConfig.from_name("llama-3-8b")
    # q, o: 4096*4096 each = 16,777,216; k, v: 4096*1024 = 4,194,304 each; MLP 3*4096*14336 =
    # 176,160,768; norms 2*4096 = 8192. Total 218,112,000 (Llama-3-8B: 32 layers ~ 6.98e9).
    assert layer_params(c) == 2 * 16_777_216 + 2 * 4_194_304 + 176_160_768 + 8192 == 218_112_000
    # decode, batch 1, kv 512, bf16, 4 layers: weights 436,224,000 B + K/V 2*513*8*128*2 = 2,101,248 B
    assert decode_bytes(c, 1, 512, layers=4, dtype_bytes=2) == 4 * (436_224_000 + 2_101_248)
    # prefill B=1 S=512: matmul 2*(218,112,000-8192)*512 + attention 2*32*128*512^2
    assert prefill_flops(c, 1, 512) == 2 * 218_103_808 * 512 + 2 * 32 * 128 * 512 * 512
    assert decode_flops(c, 2, 10) == 2 * 218_103_808 * 2 + 4 * 2 * 32 * 128 * 11


import torch  # noqa: E402  (the test extra installs the CPU build; a missing torch is a setup error, not a skip)


def _reference_layer(x, layer, cfg, positions, window=None):
    """Plain float64 Llama layer (numpy), independent of the module under test; with ``window``,
    keys older than ``window`` positions are masked by hand too: query i sees keys j with
    i - window < j <= i."""
    W = {n: getattr(layer, n).detach().double().numpy() for n in ("wq", "wk", "wv", "wo", "wg", "wu", "wd", "n1", "n2")}
    B, S, D = x.shape
    H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    def rms(v, w):
        return v / np.sqrt((v ** 2).mean(-1, keepdims=True) + cfg.norm_eps) * w

    def rope(t):  # t: [B, h, S, d]
        inv = cfg.rope_theta ** (-np.arange(0, d, 2) / d)
        ang = np.outer(positions, inv)
        c, s = np.cos(ang), np.sin(ang)
        a, b = t[..., : d // 2], t[..., d // 2:]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    a = rms(x, W["n1"])
    q = rope((a @ W["wq"].T).reshape(B, S, H, d).transpose(0, 2, 1, 3))
    k = rope((a @ W["wk"].T).reshape(B, S, K, d).transpose(0, 2, 1, 3))
    v = (a @ W["wv"].T).reshape(B, S, K, d).transpose(0, 2, 1, 3)
    o = np.empty_like(q)
    for h in range(H):
        g = h // cfg.group
        sc = q[:, h] @ k[:, g].transpose(0, 2, 1) / math.sqrt(d)
        sc = sc + np.triu(np.full((S, S), -np.inf), 1)
        if window is not None:
            sc = sc + np.tril(np.full((S, S), -np.inf), -window)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        o[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, g]
    hdn = x + o.transpose(0, 2, 1, 3).reshape(B, S, H * d) @ W["wo"].T
    m = rms(hdn, W["n2"])
    gate = m @ W["wg"].T
    return hdn + ((gate / (1 + np.exp(-gate))) * (m @ W["wu"].T)) @ W["wd"].T


def test_layer_against_reference():
    from tracestory.models.llama import build_model

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, batch=2, max_len=16, dtype=torch.float64)
    x = torch.randn(2, 7, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        y = m(x, 0, False)
    assert y.shape == (2, 7, cfg.dim)
    ref = x.numpy()
    for layer in m.layers:
        ref = _reference_layer(ref, layer, cfg, np.arange(7))
    assert np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref) < 1e-10


@pytest.mark.parametrize("decode_attention", ["matmul", "sdpa"])
def test_kv_cache_decode_equals_recompute(decode_attention):
    from tracestory.models.llama import build_model

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, batch=3, max_len=16, dtype=torch.float64, decode_attention=decode_attention)
    x = torch.randn(3, 10, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full = m(x, 0, False)
        m(x[:, :8], 0, False)              # fills the caches at 0..7
        t8 = m(x[:, 8:9], 8, True)         # decode token 8 against keys 0..8
        t9 = m(x[:, 9:10], 9, True)
    assert t8.shape == (3, 1, cfg.dim)
    assert torch.allclose(t8, full[:, 8:9], rtol=0, atol=1e-10)
    assert torch.allclose(t9, full[:, 9:10], rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- attention backends
def test_flex_prefill_against_reference():
    from tracestory.models.llama import build_model

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, batch=2, max_len=16, dtype=torch.float64, attention_backend="flex")
    x = torch.randn(2, 7, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        y = m(x, 0, False)
    ref = x.numpy()
    for layer in m.layers:
        ref = _reference_layer(ref, layer, cfg, np.arange(7))
    assert np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref) < 1e-10


def test_flex_sliding_window_against_hand_masked_reference():
    from tracestory.models.llama import build_model

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, batch=2, max_len=16, dtype=torch.float64, attention_backend="flex",
                    sliding_window=3)
    x = torch.randn(2, 9, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        y = m(x, 0, False)
        m(x[:, :8], 0, False)
        last = m(x[:, 8:9], 8, True)        # decode at 8 sees keys 6, 7, 8 only
    ref = x.numpy()
    for layer in m.layers:
        ref = _reference_layer(ref, layer, cfg, np.arange(ref.shape[1]), window=3)
    assert np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref) < 1e-10
    assert np.abs(last.numpy() - ref[:, 8:9]).max() < 1e-10
    # and the window changed the answer (a window wider than the sequence would not)
    full = x.numpy()
    for layer in m.layers:
        full = _reference_layer(full, layer, cfg, np.arange(9))
    assert np.abs(full - ref).max() > 1e-3


@pytest.mark.parametrize("backend", ["flex", "matmul-split"])
def test_decode_backends_equal_recompute(backend):
    from tracestory.models.llama import build_model

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, batch=3, max_len=24, dtype=torch.float64,
                    attention_backend="flex" if backend == "flex" else "matmul")
    if backend == "matmul-split":
        for layer in m.layers:
            layer.split_keys = 4            # keys 0..9 in 3 chunks of 4 (10, 11 masked), up to 0..13 in 4
    x = torch.randn(3, 14, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full = m(x, 0, False)
        m(x[:, :9], 0, False)
        steps = [m(x[:, p:p + 1], p, True) for p in range(9, 14)]
    for p, t in zip(range(9, 14), steps):
        assert torch.allclose(t, full[:, p:p + 1], rtol=0, atol=1e-10), p


def test_split_kv_applies_only_to_whole_chunks_inside_the_cache():
    from tracestory.models.llama import split_fits

    assert split_fits(0, 10, 12, 4)              # 3 chunks, positions 0..11 inside a 12-slot cache
    assert not split_fits(0, 10, 11, 4)          # the third chunk would end at 12 > 11
    assert not split_fits(0, 4, 16, 4)           # one chunk: the plain GEMMs
    assert split_fits(3, 9, 16, 4)               # a window: keys 3..8, 2 chunks, 3..10


def test_flex_masks_by_hand():
    from tracestory.models import flex

    causal, sliding = flex.causal_mask_mod(), flex.causal_mask_mod(3)
    t = torch.tensor
    assert [bool(causal(0, 0, t(5), t(j))) for j in (4, 5, 6)] == [True, True, False]
    # window 3 at query 5: keys 3, 4, 5
    assert [bool(sliding(0, 0, t(5), t(j))) for j in (2, 3, 5, 6)] == [False, True, True, False]
    assert flex.causal_block_mask(8, 8, 3, "cpu") is flex.causal_block_mask(8, 8, 3, "cpu")
    assert flex.decode_key_range(9, None) == (0, 10) and flex.decode_key_range(9, 3) == (7, 10)


def test_bad_backend_and_window_are_usage_errors():
    from tracestory.errors import UsageError
    from tracestory.models.llama import build_model

    cfg = LlamaConfig.from_name("tiny")
    with pytest.raises(UsageError, match="expected one of sdpa, matmul, flex"):
        build_model(cfg, attention_backend="paged")
    with pytest.raises(UsageError, match="--sliding-window"):
        build_model(cfg, attention_backend="sdpa", sliding_window=4)


def test_fp8_decode_bytes_by_hand():
    c = LlamaConfig.from_name("llama-3-8b")
    # projections 218,103,808 params at 1 B; rowwise scales: rows q 4096 + k 1024 + v 1024 + o 4096
    # + gate 14336 + up 14336 + down 4096 = 43,008 x 4 B = 172,032; norms 2 x 4096 x 2 B = 16,384
    kv = 2 * 4097 * 8 * 128 * 2
    assert decode_bytes(c, 1, 4096, dtype_bytes=2, fp8="rowwise") == 218_103_808 + 172_032 + 16_384 + kv
    # tensorwise: 7 scales x 4 B
    assert decode_bytes(c, 1, 4096, layers=8, dtype_bytes=2, fp8="tensorwise") == 8 * (218_103_808 + 28 + 16_384 + kv)
    # a window of 1000 keys reads K/V over 1000 positions, not 4097
    assert decode_bytes(c, 1, 4096, window=1000) == 436_224_000 + 2 * 1000 * 8 * 128 * 2
    # prefill S=8, W=3: 4 FLOP x d per kept pair, S*W - W*W//2 = 24 - 4 = 20 pairs per head
    t = LlamaConfig.from_name("tiny")
    assert prefill_flops(t, 1, 8, window=3) == 2 * (43_136 - 128) * 8 + 4 * 4 * 16 * 20
