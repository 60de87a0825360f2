"""The Llama layer runs Wq/Wk/Wv (and Wg/Wu) as one GEMM over a fused weight while the
parameters are views into it, and one GEMM each once they are replaced (FP8, shards).

Second source: the same layer with its parameters replaced by clones of themselves (the
one-GEMM-per-projection path), in float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from tracestory.models.llama import build_model  # noqa: E402
from tracestory.models.llama_config import LlamaConfig  # noqa: E402


def test_fused_projections_equal_separate_ones_and_share_storage():
    cfg = LlamaConfig.from_name("tiny")
    fused = build_model(cfg, layers=2, batch=2, max_len=16, dtype=torch.float64, seed=3)
    separate = build_model(cfg, layers=2, batch=2, max_len=16, dtype=torch.float64, seed=3)
    for layer in separate.layers:
        for name in ("wq", "wk", "wv", "wg", "wu"):
            setattr(layer, name, nn.Parameter(getattr(layer, name).detach().clone(), requires_grad=False))
    lay = fused.layers[0]
    # the views hold no storage of their own: Wk starts where Wq ends in the fused tensor
    assert lay.wk.data_ptr() == lay.wq.data_ptr() + lay.wq.numel() * lay.wq.element_size()
    assert lay.wu.data_ptr() == lay.wg.data_ptr() + lay.wg.numel() * lay.wg.element_size()
    x = torch.randn(2, 9, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = fused(x[:, :8], 0, False), separate(x[:, :8], 0, False)
        c, d = fused(x[:, 8:], 8, True), separate(x[:, 8:], 8, True)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, d, rtol=1e-12, atol=1e-12)
