"""bench moe on a CPU: the layer against a dense float64 reference written here, the bmm path,
the FP8 path, the Amdahl formula and a tiny CLI run."""

import json
import math

import pytest
import torch

from tracestory.bench import moe
from tracestory.cli import main as cli_main

CFG = moe.PRESETS["tiny"]


def _dense_reference(x, w, cfg):
    """Each token through its top-k experts, weighted; plain loops in float64."""
    x, r, gu, dn = (t.double() for t in (x, w.router, w.gate_up, w.down))
    I = cfg.intermediate
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = [float(x[t] @ r[e]) for e in range(cfg.num_experts)]
        m = max(logits)
        z = sum(math.exp(v - m) for v in logits)
        probs = [math.exp(v - m) / z for v in logits]
        top = sorted(range(cfg.num_experts), key=lambda e: -probs[e])[:cfg.top_k]
        norm = sum(probs[e] for e in top)
        for e in top:
            h = gu[e] @ x[t]
            a = h[:I] / (1 + torch.exp(-h[:I])) * h[I:]
            out[t] += (probs[e] / norm) * (dn[e] @ a)
    return out


def test_qwen3_preset_shape():
    c = moe.PRESETS["qwen3-30b-a3b"]
    assert (c.num_experts, c.top_k, c.hidden, c.intermediate, c.norm_topk_prob) == (128, 8, 2048, 768, True)


@pytest.mark.parametrize("gemm", ["loop", "bmm"])
def test_layer_equals_dense_reference_fp64(gemm):
    w = moe.make_weights(CFG, torch.float64, "cpu", seed=5)
    x = torch.randn((13, CFG.hidden), generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    got = moe.moe_forward(x, w, CFG, gemm=gemm)
    torch.testing.assert_close(got, _dense_reference(x, w, CFG), rtol=1e-10, atol=1e-12)


def test_stages_run_inside_regions():
    seen = []

    class Rec:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            seen.append(self.name)

        def __exit__(self, *exc):
            return None

    w = moe.make_weights(CFG, torch.float32, "cpu")
    moe.moe_forward(torch.randn(4, CFG.hidden), w, CFG, region=Rec)
    assert seen == ["router", "permute", "expert_gemm", "unpermute"]


def test_permute_groups_by_expert():
    topi = torch.tensor([[3, 0], [0, 2], [3, 1]])
    x = torch.arange(3.0)[:, None].expand(3, 4)
    xs, order, counts = moe.permute(x, topi, 4)
    assert counts == [2, 1, 1, 2]
    # slots sorted by expert, stable: expert 0 <- tokens 0, 1; 1 <- 2; 2 <- 1; 3 <- 0, 2
    assert xs[:, 0].tolist() == [0.0, 1.0, 2.0, 1.0, 0.0, 2.0]


def test_fp8_layer_close_to_reference_on_dequantized_weights():
    w = moe.make_weights(CFG, torch.bfloat16, "cpu", seed=2)
    wq = moe.quantize_weights_fp8(w)
    assert wq.fp8 and wq.gate_up.dtype == torch.float8_e4m3fn
    x = torch.randn((9, CFG.hidden), generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    got = moe.moe_forward(x, wq, CFG).double()
    # reference: the same routing and dequantized weights, float64; activations stay unquantized,
    # so the remaining difference is the per-token e4m3 rounding (3 mantissa bits, a few %).
    deq = moe.MoEWeights(w.router, wq.gate_up.double() * wq.gate_up_scale.double().transpose(1, 2),
                         wq.down.double() * wq.down_scale.double().transpose(1, 2))
    ref = _dense_reference(x, deq, CFG)
    rel = float((got - ref).norm() / ref.norm())
    assert rel < 0.08


def test_amdahl_formula():
    share, ceiling = moe.amdahl({"router": 10.0, "permute": 20.0, "expert_gemm": 60.0, "unpermute": 10.0})
    assert share == pytest.approx(0.6) and ceiling == pytest.approx(2.5)
    assert moe.amdahl({s: 0.0 for s in moe.STAGES}) == (None, None)
    assert moe.amdahl(None) == (None, None)


def test_cli_tiny_run(tmp_path, capsys):
    out = tmp_path / "moe.json"
    rc = cli_main(["bench", "moe", "--preset", "tiny", "--tokens", "4,8", "--precision", "bf16,nvfp4",
                   "--warmup-ms", "1", "--rep-ms", "5", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "nvfp4: skipped: nvFP4 needs" in text and "precision comparison" in text
    doc = json.loads(out.read_text())
    assert [r["tokens"] for r in doc["results"]] == [4, 8]
    for r in doc["results"]:
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / (r["median_ns"] * 1e-9))
        assert r["ms_per_token"] == pytest.approx(r["median_ns"] / 1e6 / r["tokens"])
        assert r["min_ns"] <= r["median_ns"] <= r["max_ns"]
    assert "nvfp4" in doc["skipped"]
    assert doc["results"][1]["expert_gemm_share"] is not None   # profiled at the largest T


def test_run_moe_returns_results_and_skips_and_prints_nothing(capsys):
    from tracestory.bench import common

    run = moe.run_moe(CFG, common.open_device("cpu"), tokens=[4], precisions=["bf16", "nvfp4"], warmup_ms=0,
                      rep_ms=0, amdahl_share=False)
    assert capsys.readouterr().out == ""
    assert [(r.precision, r.tokens) for r in run.results] == [("bf16", 4)]
    assert run.results[0].expert_gemm_share is None and run.results[0].rel_err_vs_fp32 < 2e-2
    assert run.skipped["nvfp4"].startswith("nvFP4 needs data-center Blackwell")
