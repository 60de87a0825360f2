"""GPU checks of the bench workloads (run on the device: pytest -m gpu --noconftest)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def test_timer_uses_cuda_events_and_sees_a_copy():
    from tracestory.bench.timer import measure

    x = torch.randn(64 * 1024 * 1024, device="cuda")  # 256 MiB
    y = torch.empty_like(x)
    st = measure(lambda: y.copy_(x), warmup_ms=10, rep_ms=50, flush_l2=True)
    assert st.clock == "cuda-events" and st.n >= 5
    # 512 MiB moved: at most ~5 TB/s on any current GPU, so at least 0.1 ms
    assert st.median_ns > 0.1e6
    assert torch.equal(x, y)


def test_llama_decode_matches_recompute_on_cuda():
    from tracestory.models.llama import build_model
    from tracestory.models.llama_config import LlamaConfig

    cfg = LlamaConfig.from_name("tiny")
    m = build_model(cfg, layers=2, batch=2, max_len=16, device="cuda", dtype=torch.float32)
    x = torch.randn(2, 9, cfg.dim, device="cuda")
    with torch.inference_mode():
        full = m(x, 0, False)
        m(x[:, :8], 0, False)
        step = m(x[:, 8:], 8, True)
    err = (step - full[:, 8:]).norm() / full[:, 8:].norm()
    assert err < 1e-4


def test_attention_cli_on_cuda(tmp_path):
    from tracestory.cli import main

    out = tmp_path / "a.json"
    rc = main(["bench", "attention-decode", "--kv-len", "1024", "4096", "--heads", "8", "--gqa", "2",
               "--warmup-ms", "5", "--rep-ms", "20", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["device"]["device"] == "cuda"
    # One result per implementation (default sdpa and matmul) and KV length, each checked
    # against a float64 reference before it was timed.
    assert sorted((r["impl"], r["kv_len"]) for r in doc["results"]) == [
        ("matmul", 1024), ("matmul", 4096), ("sdpa", 1024), ("sdpa", 4096)]
    assert all(r["achieved_gbps"] > 0 for r in doc["results"])
