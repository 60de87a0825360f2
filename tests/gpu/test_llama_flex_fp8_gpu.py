"""GPU checks of the FlexAttention backend and the FP8 projections of the Llama layer (run on the
device: pytest -m gpu --noconftest): flex decode and prefill on CUDA against the matmul/SDPA
layer with the same weights, the FP8 linear against a float64 product of its own quantised
operands, and the bench command's JSON with the copy roof it measured."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _pair(backend, **kw):
    from tracestory.models.llama import build_model
    from tracestory.models.llama_config import LlamaConfig

    cfg = LlamaConfig.from_name("tiny")
    make = dict(layers=2, batch=2, max_len=768, device="cuda", dtype=torch.float32, seed=7, **kw)
    return cfg, build_model(cfg, attention_backend="matmul", **make), build_model(cfg, attention_backend=backend, **make)


def test_flex_decode_and_prefill_match_matmul_on_cuda():
    cfg, ref, flex = _pair("flex")
    x = torch.randn(2, 601, cfg.dim, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.inference_mode():
        p_ref, p_flex = ref(x[:, :600], 0, False), flex(x[:, :600], 0, False)   # fills both caches 0..599
        d_ref, d_flex = ref(x[:, 600:], 600, True), flex(x[:, 600:], 600, True)  # matmul: 3 split-KV chunks
        for layer in ref.layers:
            layer.split_keys = 1024                                              # one chunk: the plain GEMMs
        d_plain = ref(x[:, 600:], 600, True)
    # fp32 inputs; FlexAttention's kernels may use TF32 for QK^T and PV (10-bit mantissa)
    assert _rel(p_flex, p_ref) < 2e-3
    assert _rel(d_flex, d_ref) < 2e-3
    assert _rel(d_ref, d_plain) < 2e-3


def test_fp8_linear_on_cuda_equals_its_quantised_product():
    from tracestory.models import fp8

    g = torch.Generator("cuda").manual_seed(2)
    x = torch.randn(5, 256, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(128, 256, device="cuda", generator=g).to(torch.bfloat16)
    for mode in ("rowwise", "tensorwise"):
        fw = fp8.Fp8Weight(w, mode)
        y = fp8.fp8_linear(x, fw)
        qx, sx = fp8.quantize(x, per_row=mode == "rowwise")
        ref = (qx.double() * sx.double()) @ fw.dequantize().double().t()
        assert y.dtype == torch.bfloat16 and y.shape == (5, 128)
        # fp32 accumulation, then one bf16 rounding (2**-9 relative)
        assert _rel(y, ref) < 4e-3, mode
        # and the FP8 product is near the unquantised one (e4m3: ~2**-4 per operand at worst)
        assert _rel(y, x.double() @ w.double().t()) < 0.1, mode


@pytest.mark.parametrize("mode", ["rowwise", "tensorwise"])
def test_compiled_flex_fp8_decode_matches_eager_on_cuda(mode):
    from tracestory.models.llama import build_model
    from tracestory.models.llama_config import LlamaConfig

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, batch=1, max_len=300, device="cuda", dtype=torch.bfloat16,
                    attention_backend="flex", fp8_mode=mode)
    dense = build_model(cfg, layers=2, batch=1, max_len=300, device="cuda", dtype=torch.bfloat16,
                        attention_backend="matmul")
    x = torch.randn(1, 1, cfg.dim, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        eager = m(x, 256, True)
        compiled = torch.compile(lambda t: m(t, 256, True), dynamic=False)(x)
        full = dense(x, 256, True)
    # the same random caches and weights at bf16: FP8 costs a few percent, not more, compiled or
    # not (the two differ where inductor keeps an fp32 intermediate that eager rounds to bf16
    # before quantising, which moves some e4m3 codes by one step: a few percent after 2 layers)
    assert _rel(eager, full) < 0.15
    assert _rel(compiled, full) < 0.15
    assert _rel(compiled, eager) < 0.1


def test_bench_cli_flex_fp8_measures_the_copy_roof(tmp_path):
    from tracestory.cli import main

    out = tmp_path / "l.json"
    rc = main(["bench", "llama", "--preset", "tiny", "--layers", "2", "--phase", "decode", "prefill",
               "--kv-len", "256", "--seq", "128", "--attention-backend", "flex", "--fp8", "rowwise",
               "--mode", "eager", "compile", "--compile-mode", "reduce-overhead", "--warmup-ms", "5",
               "--rep-ms", "20", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["device"]["device"] == "cuda"
    roof = doc["copy_roof"]
    # 2 GiB moved per copy: any current GPU needs more than 0.2 ms for it
    assert roof["nbytes"] == 1 << 30 and roof["best_ns"] > 0.2e6
    assert roof["bytes_per_s"] == pytest.approx(2 * roof["nbytes"] / (roof["best_ns"] * 1e-9))
    rows = {(r["phase"], r["variant"]): r for r in doc["results"]}
    assert set(rows) == {(p, v) for p in ("decode", "prefill") for v in ("eager", "compile:reduce-overhead")}
    for r in rows.values():
        assert r["attention_backend"] == "flex" and r["fp8"] == "rowwise"
        assert r["first_call_ms"] > 0
    d = rows[("decode", "compile:reduce-overhead")]
    assert d["measured_copy_fraction"] == pytest.approx(d["bytes"] / d["median_ns"] * 1e9 / roof["bytes_per_s"])


@pytest.mark.parametrize("per_row", [True, False])
def test_fp8_quantize_on_cuda_is_the_triton_kernel_with_the_torch_formulas(per_row):
    """On CUDA, models.fp8.quantize runs the Triton quantizer; the CPU runs the torch ops. Same
    formulas (scale = amax / 448, q = e4m3(clamp(x * 448 / amax))): scales agree to one fp32 ulp
    (the kernel's division may round the other way), and the e4m3 codes agree except where that
    ulp moves a product across a rounding boundary (at most a few in 10^4)."""
    from tracestory.models import fp8

    torch.manual_seed(0)
    x = (torch.randn(17, 4096, device="cuda") * torch.linspace(0.1, 30, 17, device="cuda")[:, None]).bfloat16()
    q, s = fp8.quantize(x, per_row=per_row)
    q_ref, s_ref = fp8.quantize(x.cpu(), per_row=per_row)
    assert q.dtype == torch.float8_e4m3fn and tuple(s.shape) == tuple(s_ref.shape)
    torch.testing.assert_close(s.cpu(), s_ref, rtol=2 ** -22, atol=0)
    differ = (q.cpu().view(torch.uint8) != q_ref.view(torch.uint8)).float().mean().item()
    assert differ <= 5e-4
