"""Triton FP8 quantizers and the FP8 matmuls on a CUDA GPU (run on the device machine)."""

import pytest
import torch

from tracestory.bench import fp8

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def qt():
    from tracestory.models import quant_triton

    return quant_triton


def _x(m, k, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((m, k), generator=g, device="cuda") * 3
    x[1] = 0.0                       # a zero row / zero blocks
    x[2, :64] *= 1e-4                # small blocks
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("method", ["per_tensor", "per_row", "mxfp8"])
def test_triton_quantizer_matches_reference(qt, dtype, method):
    x = _x(300, 4096 + 64, dtype)
    q, s = getattr(qt, f"quantize_{method}")(x)
    rq, rs = getattr(fp8, f"ref_quantize_{method}")(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    if method == "mxfp8":
        # E8M0 exponents are read from the bits of each block's amax: exact, so bitwise equal.
        assert torch.equal(s, rs)
        scale = torch.pow(2.0, s.float() - 127).repeat_interleave(32, dim=-1)
        ref_scale = torch.pow(2.0, rs.float() - 127).repeat_interleave(32, dim=-1)
    else:
        # amax / 448 in fp32: Triton and the torch reference may round that division differently
        # in the last bit, so the scales agree to 2 ulp, not bitwise.
        torch.testing.assert_close(s, rs, rtol=2 * 2.0 ** -23, atol=0)
        scale, ref_scale = s.float(), rs.float()
    # A last-bit scale difference can move a value sitting on a rounding boundary to the
    # neighbouring fp8 code: codes agree to one fp8 step, and rarely differ at all.
    frac, steps = fp8.fp8_code_diff(q, rq)
    assert steps <= 1 and frac < 1e-3
    deq, ref_deq = q.float() * scale, rq.float() * ref_scale
    assert float((deq - ref_deq).abs().max()) <= float(2.0 ** -3 * ref_deq.abs().max())


def test_rowwise_scaled_mm_matches_dequantized_fp32(qt):
    a, w = _x(256, 1024, torch.bfloat16, 1), _x(512, 1024, torch.bfloat16, 2)
    qa, sa = qt.quantize_per_row(a)
    qw, sw = qt.quantize_per_row(w)
    c = torch._scaled_mm(qa, qw.t(), scale_a=sa, scale_b=sw.reshape(1, -1).contiguous(), out_dtype=torch.bfloat16)
    ref = (qa.float() * sa) @ (qw.float() * sw).t()
    assert float((c.float() - ref).norm() / ref.norm()) < 1e-2


# (BLOCK_K, stages, BLOCK_N, warps): the tuner's configs (fp8_small_m.CONFIGS, checked below) and the
# narrower blocks the decode benchmark times
SMALL_M_CONFIGS = [(128, 4, 64, 4), (256, 3, 64, 4), (256, 4, 64, 4), (256, 5, 64, 4), (256, 6, 64, 4),
                   (128, 4, 32, 4), (256, 3, 16, 2)]


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("cfg", SMALL_M_CONFIGS, ids=lambda c: "k{}_s{}_n{}_w{}".format(*c))
def test_small_m_triton_gemm_matches_scaled_mm(m, cfg):
    """The decode GEMM (models.fp8_small_m) against torch._scaled_mm on the same FP8 operands:
    the same products summed in another order, so equal to bf16 rounding (and a looser bound)."""
    from tracestory.models import fp8_small_m, quant_triton
    from tracestory.models.fp8 import Fp8Weight

    g = torch.Generator(device="cuda").manual_seed(m)
    w = Fp8Weight(torch.randn(1536 + 48, 3584, generator=g, device="cuda", dtype=torch.bfloat16), "rowwise")
    qx, sx = quant_triton.quantize_per_row(torch.randn(m, 3584, generator=g, device="cuda", dtype=torch.bfloat16))
    ref = torch._scaled_mm(qx, w.weight.t(), scale_a=sx, scale_b=w.scale, out_dtype=torch.bfloat16).float()
    assert set(fp8_small_m.CONFIGS) <= {c[:2] for c in SMALL_M_CONFIGS if c[2] == 64}
    y = fp8_small_m.matmul(qx, sx, w.weight, w.scale, *cfg).float()
    assert y.shape == (m, 1536 + 48)   # 1,584 columns (a multiple of 16, as _scaled_mm needs): the last block is partial at BLOCK_N 64 and 32
    assert ((y - ref).norm() / ref.norm()).item() < 1e-2
    assert torch.allclose(y, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_pdl_chain_in_a_graph_reads_what_the_previous_kernel_wrote(monkeypatch):
    """Programmatic dependent launch (models.pdl): each kernel of a quantiser -> small-M GEMM ->
    quantiser -> small-M GEMM chain reads the output of the one before it. Replayed from a CUDA
    graph (as the decode graphs run) on new inputs, with PDL and the weight prefetch on, the result
    must be bit for bit that of the same kernels launched one after another without PDL, eagerly:
    a kernel reading before its predecessor finished would see the previous replay's values."""
    from tracestory.models import fp8_small_m, pdl, quant_triton
    from tracestory.models.fp8 import Fp8Weight

    dev = torch.device("cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    w1 = Fp8Weight(torch.randn(4096, 2048, generator=g, device="cuda", dtype=torch.bfloat16), "rowwise")
    w2 = Fp8Weight(torch.randn(1024, 4096, generator=g, device="cuda", dtype=torch.bfloat16), "rowwise")

    def chain(x):
        y = fp8_small_m.matmul(*quant_triton.quantize_per_row(x), w1.weight, w1.scale, 256, 4)
        return fp8_small_m.matmul(*quant_triton.quantize_per_row(y), w2.weight, w2.scale, 128, 4)

    xs = [torch.randn(4, 2048, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    monkeypatch.setenv(pdl.ENV, "0")
    assert not pdl.enabled(dev)
    want = [chain(x) for x in xs]
    monkeypatch.setenv(pdl.ENV, "1")
    assert pdl.enabled(dev), "an H100/H200 with Triton's launch_pdl is expected here"
    static = xs[0].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        chain(static)                         # compile the PDL variants outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static)
    for x, ref in zip(xs[1:] + xs[:1], want[1:] + want[:1]):
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)
