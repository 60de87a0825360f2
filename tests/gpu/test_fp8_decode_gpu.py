"""The decode GEMM with its glue inside (models.fp8_decode) on a CUDA GPU (run on the device machine).

Expected values come from the torch ops: the activation each prologue computes is built with
torch (the formulas and roundings of models.llama and models.glue_triton), quantised per group
of ``fp8_decode.BLOCK_K`` elements of a row with models.fp8's formulas (scale = amax / 448), and
multiplied in float32 by the dequantised FP8 weight; the kernel sums the same products in another
order, so the results agree to float32 accumulation and the final bf16 rounding."""

import pytest
import torch
import torch.nn.functional as F

from tracestory.models.fp8 import Fp8Weight
from tracestory.models.llama import rms_norm

pytestmark = pytest.mark.gpu

N, K = 1536 + 48, 3584           # the last 64-column block is partial; K a multiple of 256


@pytest.fixture(scope="module")
def fd():
    from tracestory.models import fp8_decode      # imports triton: collected on CPU-only machines too

    return fp8_decode


def _w(seed, n=N, k=K):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return Fp8Weight(torch.randn(n, k, generator=g, device="cuda", dtype=torch.bfloat16) * k ** -0.5, "rowwise")


def _rows(m, k, seed):
    g = torch.Generator(device="cuda").manual_seed(100 + seed)
    return torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16)


def _group_quantised(z, group):
    """``z`` [M, K] float32 quantised to e4m3 per (row, group of ``group`` columns), dequantised."""
    M, K = z.shape
    zt = z.float().reshape(M, K // group, group)
    amax = zt.abs().amax(-1, keepdim=True)
    pos = amax > 0
    scale = torch.where(pos, amax / 448.0, torch.ones_like(amax))
    inv = torch.where(pos, 448.0 / torch.where(pos, amax, torch.ones_like(amax)), torch.ones_like(amax))
    q = (zt * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    return (q * scale).reshape(M, K)


def _close(fd, y, z, w, post=None):
    ref = _group_quantised(z, fd.BLOCK_K) @ w.dequantize().t()
    if post is not None:
        ref = ref * post
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    err = (y.float() - ref).abs().max().item()
    assert err <= 2 ** -7 * ref.abs().max().item(), (err, ref.abs().max().item())
    # and at least as close to the unquantised product as a row-wise scale would be
    exact = z.float() @ w.dequantize().t() * (1 if post is None else post)
    rowwise = _group_quantised(z, z.shape[1]) @ w.dequantize().t() * (1 if post is None else post)
    assert (y.float() - exact).norm() <= 1.05 * (rowwise - exact).norm()


@pytest.mark.parametrize("m", [1, 3, 16])
def test_plain_prologue_is_the_group_quantised_product(fd, m):
    w, x = _w(m), _rows(m, K, m)
    _close(fd, fd.matmul(x, w), x, w)


@pytest.mark.parametrize("m", [1, 5, 16])
def test_silu_prologue_multiplies_swiglu_of_the_gate_up_row(fd, m):
    w, gu = _w(m), _rows(m, 2 * K, m) * 2
    g, u = gu[:, :K], gu[:, K:]
    a = F.silu(g) * u                      # bf16 ops: silu rounded, then the product rounded
    _close(fd, fd.silu_matmul(gu, w), a, w)


@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("residual", [False, True])
def test_norm_prologue_adds_the_residual_and_multiplies_the_norm(fd, m, residual):
    w, x = _w(m), _rows(m, K, m) * 3
    r = _rows(m, K, m + 50) if residual else None
    nw = (1 + 0.1 * _rows(1, K, 7)[0]).to(torch.bfloat16)
    h, y = fd.norm_matmul(x, nw, 1e-5, w, residual=r)
    h_ref = x + r if residual else x                   # bf16 add: float sum rounded once
    assert torch.equal(h, h_ref)
    # the kernel quantises h * w (float32) and applies rsqrt(mean(h^2) + eps) after the product
    rstd = torch.rsqrt(h_ref.float().pow(2).mean(-1, keepdim=True) + 1e-5)          # [M, 1]
    _close(fd, y, h_ref.float() * nw.float(), w, post=rstd)
    # the same as the norm's output projected, to the FP8 rounding of the activation
    ref = rms_norm(h_ref, nw, 1e-5).float() @ w.dequantize().t()
    assert ((y.float() - ref).norm() / ref.norm()).item() < 2e-2


def test_rows_and_shapes_outside_the_kernel_are_refused(fd):
    w = _w(0)
    with pytest.raises(ValueError, match="expected 1..16 rows"):
        fd.matmul(_rows(17, K, 0), w)
    with pytest.raises(ValueError, match="K ="):
        fd.matmul(_rows(2, K - 256, 0), w)


def test_decode_graphs_run_the_fused_projections_and_replay_like_their_bodies():
    """A bf16 model with FP8 row-wise projections: decode buckets of up to 16 rows run
    models.fp8_decode (the kernel names in a profile of one decode step say so), and the
    graph replays give the tokens of the same bodies run without a graph (same kernels)."""
    from torch.profiler import ProfilerActivity, profile

    from test_serve_gpu import _run

    keep = []
    graph, paths = _run("flex", prepare=True, dtype=torch.bfloat16, fp8="rowwise", keep=keep)
    m = keep[0]
    assert m.startup["decode_fused_rows"] == 16 and "graph" in paths
    bodies, _ = _run("flex", prepare=True, dtype=torch.bfloat16, fp8="rowwise", replay=False)
    assert graph == bodies
    from tracestory.serve.scheduler import Member

    member = Member("p", "decode", 20, (5,), (0, 1), False, True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        m.launch([member], 0).result()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert sum("_fp8_decode_kernel" in n for n in names) == 4 * 2            # 4 projections x 2 layers
    assert not any("_silu_mul" in n or "_quant_row" in n for n in names)
    assert sum("_add_rmsnorm_quant" in n for n in names) == 1            # the final norm, before the LM head
