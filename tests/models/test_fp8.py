"""FP8 projections (models/fp8.py) against float64 references written here: e4m3 rounding by hand,
the quantise -> matmul -> scale product, and the error bound of FP8 against the unquantised product.

Bound (per operand, round to nearest with 3 mantissa bits): a scaled value ``u = v / s`` in
``[2**e, 2**(e+1))``, ``e >= -6``, has the step ``2**(e-3)``, so ``|u - e4m3(u)| <= 2**(e-4) <=
2**-4 |u|``; below ``2**-6`` (subnormals) the step is ``2**-9``, so the error is at most
``2**-10``. Times the scale: ``|v - q·s| <= 2**-4 |v| + 2**-10 s``. For a product,
``|x̂ŵ - xw| <= ex·|w| + ew·|x| + ex·ew`` with ``ex``, ``ew`` those per-element bounds, summed
over K (plus fp32 accumulation, below 1e-5 of ``Σ|x||w|`` at these sizes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracestory.errors import UsageError
from tracestory.models import fp8


def e4m3_round(u: np.ndarray) -> np.ndarray:
    """Round float64 values (|u| <= 448) to e4m3fn by hand: 3 mantissa bits, exponent >= -6."""
    a = np.abs(u)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -6)))
    step = 2.0 ** (e - 3)
    return np.sign(u) * np.minimum(np.round(a / step) * step, 448.0)    # np.round: half to even


def ref_quantize(v: np.ndarray, per_row: bool):
    amax = np.abs(v).max(axis=-1, keepdims=True) if per_row else np.abs(v).max()
    amax = np.where(amax > 0, amax, 448.0)
    return e4m3_round(v * (448.0 / amax)), amax / 448.0


def ref_fp8_linear(x: np.ndarray, w: np.ndarray, mode: str) -> np.ndarray:
    """quantise -> matmul -> scale in float64."""
    qx, sx = ref_quantize(x, mode == "rowwise")
    qw, sw = ref_quantize(w, mode == "rowwise")
    return (qx @ qw.T) * (sx * (sw.reshape(1, -1) if mode == "rowwise" else sw))


def _data(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 64, generator=g) * torch.logspace(-2, 1, 6).reshape(6, 1)   # rows of different size
    w = torch.randn(32, 64, generator=g) / 8
    return x.to(dtype), w.to(dtype)


def test_quantize_codes_equal_hand_rounding():
    x, _ = _data(torch.float32)
    for per_row in (True, False):
        q, s = fp8.quantize(x, per_row)
        rq, rs = ref_quantize(x.double().numpy(), per_row)
        assert np.array_equal(q.double().numpy(), rq)
        assert np.allclose(s.double().numpy(), rs, rtol=1e-7, atol=0)


@pytest.mark.parametrize("mode", ["rowwise", "tensorwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_equals_float64_quantised_product(mode, dtype):
    x, w = _data(dtype)
    y = fp8.fp8_linear(x, fp8.Fp8Weight(w, mode))
    assert y.dtype == dtype and y.shape == (6, 32)
    ref = ref_fp8_linear(x.double().numpy(), w.double().numpy(), mode)
    mag = np.abs(x.double().numpy()) @ np.abs(w.double().numpy()).T          # Σ|x||w| per output
    err = np.abs(y.double().numpy() - ref)
    if dtype == torch.float32:
        # fp8 products are exact in fp32; accumulation over K = 64 and the scales: ~1e-7 of Σ|x||w|
        assert (err <= 1e-6 * mag).all()
    else:
        # bf16 output: its rounding (2**-9 relative), and the CPU kernel's bf16 steps inside
        # (measured up to 0.6% of Σ|x||w|; the GPU test holds CUDA's fp32 epilogue to 4e-3)
        assert (err <= 2 ** -9 * np.abs(ref) + 2 ** -6 * mag).all()


@pytest.mark.parametrize("mode", ["rowwise", "tensorwise"])
def test_fp8_linear_within_the_rounding_bound_of_the_exact_product(mode):
    x, w = _data(torch.float32, seed=1)
    y = fp8.fp8_linear(x, fp8.Fp8Weight(w, mode)).double().numpy()
    xd, wd = x.double().numpy(), w.double().numpy()
    exact = xd @ wd.T
    _, sx = ref_quantize(xd, mode == "rowwise")
    _, sw = ref_quantize(wd, mode == "rowwise")
    ex = 2 ** -4 * np.abs(xd) + 2 ** -10 * sx                      # [M, K]
    ew = 2 ** -4 * np.abs(wd) + 2 ** -10 * (sw if mode == "tensorwise" else sw.reshape(-1, 1))  # [N, K]
    bound = ex @ np.abs(wd).T + np.abs(xd) @ ew.T + ex @ ew.T + 1e-5 * (np.abs(xd) @ np.abs(wd).T)
    err = np.abs(y - exact)
    assert (err <= bound).all()
    assert err.max() > 0                                          # it did quantise


def test_quantize_stack_keeps_the_layer_contract():
    from tracestory.models.llama import build_model, linear
    from tracestory.models.llama_config import LlamaConfig, layer_weight_bytes

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, dtype=torch.float32)
    dense_wq = m.layers[0].wq.detach().clone()
    assert fp8.quantize_stack(m, "rowwise") == 14                 # 7 projections x 2 layers
    assert fp8.quantize_stack(m.layers, "tensorwise") == 0        # already FP8: left alone
    assert fp8.quantize_stack(m, "off") == 0
    wq = m.layers[0].wq
    assert isinstance(wq, fp8.Fp8Weight) and wq.shape == dense_wq.shape and "wq" not in m.layers[0]._parameters
    x = torch.randn(3, cfg.dim)
    want = ref_fp8_linear(x.double().numpy(), dense_wq.double().numpy(), "rowwise")
    assert np.allclose(linear(x, wq).double().numpy(), want, rtol=1e-5, atol=1e-6)
    # stored bytes, counted from the tensors, equal the formula's weights without the norms
    assert sum(fp8.weight_bytes(layer) for layer in m.layers) == 2 * (
        layer_weight_bytes(cfg, 4, "rowwise") - 2 * cfg.dim * 4)


def test_fp8_weight_rejects_bad_mode_and_shape():
    with pytest.raises(UsageError, match="--fp8 'int4'"):
        fp8.Fp8Weight(torch.randn(16, 16), "int4")
    with pytest.raises(UsageError, match="multiples of 16"):
        fp8.Fp8Weight(torch.randn(13, 16), "rowwise")
