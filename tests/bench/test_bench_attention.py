"""Decode-attention bench: the line fit, the byte count, the CLI on CPU."""

from __future__ import annotations

import json

import pytest

from tracestory.bench.attention import decode_attention_bytes, default_kv_lens, fit_line


def test_fit_exact_line():
    x = [256, 512, 1024, 2048]
    y = [7.5 + 0.25 * v for v in x]
    f = fit_line(x, y)
    assert f.intercept == pytest.approx(7.5) and f.slope == pytest.approx(0.25) and f.r2 == pytest.approx(1.0)


def test_fit_r2_by_hand():
    # y = [1, 3, 2] at x = [0, 1, 2]: slope 0.5, intercept 1.5, residuals [-0.5, 1, -0.5]
    # SS_res = 1.5, SS_tot = 2 -> R^2 = 0.25
    f = fit_line([0, 1, 2], [1, 3, 2])
    assert f.slope == pytest.approx(0.5) and f.intercept == pytest.approx(1.5) and f.r2 == pytest.approx(0.25)
    assert fit_line([0, 1], [4, 4]).r2 is None
    with pytest.raises(ValueError):
        fit_line([3, 3], [1, 2])


def test_bytes_and_default_sweep():
    # llama-3-8b shape at 4096 keys, batch 1, bf16: K and V are 2 * 8 * 4096 * 128 * 2 = 16,777,216
    # bytes; q and out 2 * 32 * 128 * 2 = 16,384
    assert decode_attention_bytes(1, 32, 8, 128, 4096, 2) == 16_777_216 + 16_384
    assert default_kv_lens() == [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]


def test_cli_tiny_on_cpu(tmp_path):
    from tracestory.cli import main

    out = tmp_path / "a.json"
    rc = main(["bench", "attention-decode", "--device", "cpu", "--kv-len", "8", "16", "--heads", "4", "--gqa", "2",
               "--head-dim", "8", "--dtype", "fp32", "--warmup-ms", "0", "--rep-ms", "0", "--json", str(out)])
    doc = json.loads(out.read_text())
    # default implementations: SDPA as torch picks it, then the two-GEMM path; each checked
    # against a float64 reference before it is timed
    assert rc == 0 and [(r["impl"], r["kv_len"]) for r in doc["results"]] == [
        ("sdpa", 8), ("sdpa", 16), ("matmul", 8), ("matmul", 16)]
    # fp32: 2 * 2 kv heads * 16 keys * 8 * 4 + 2 * 4 heads * 8 * 4 bytes
    assert doc["results"][1]["bytes"] == 2 * 2 * 16 * 8 * 4 + 2 * 4 * 8 * 4
    assert set(doc["fits"]) == {"sdpa", "matmul"} and doc["fits"]["matmul"]["fit"] is not None
    assert doc["peaks"]["copy_bytes_per_s"] is None


def test_run_returns_sweeps_and_prints_nothing(capsys):
    from tracestory.bench import common
    from tracestory.bench.attention import run_attention_decode

    sweeps = run_attention_decode(common.open_device("cpu"), kv_lens=[8, 16, 32], heads=4, gqa=2, head_dim=8,
                                  dtype="float32", impls=["matmul"], warmup_ms=0, rep_ms=0)
    assert capsys.readouterr().out == ""
    (sw,) = sweeps
    assert sw.impl == "matmul" and [p.kv_len for p in sw.points] == [8, 16, 32]
    # K and V of 2 kv heads x L x 8 x 4 B, plus q and out: 2 x 4 heads x 8 x 4 B
    assert [p.bytes for p in sw.points] == [2 * 2 * L * 8 * 4 + 2 * 4 * 8 * 4 for L in (8, 16, 32)]
    assert sw.fit is not None
    # one KV position costs 2 (K, V) x 1 sequence x 2 kv heads x 8 x 4 B = 128 B
    if sw.fit.slope > 0:
        assert sw.marginal_gbps == pytest.approx(128 / sw.fit.slope)
    else:
        assert sw.marginal_gbps is None
