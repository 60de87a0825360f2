"""The fresh-prompt attention's offsets and its reference semantics (CPU): ``cu`` written out by
hand, and the masked SDPA of :func:`reference` against each sequence's own causal attention
computed with plain softmax arithmetic in float64, sequence by sequence."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tracestory.serve import fresh_attention as fresh  # noqa: E402


def test_offsets_members_then_padding_then_empty():
    assert fresh.offsets([5, 3], 12, 5).tolist() == [0, 5, 8, 12, 12, 12]
    assert fresh.offsets([4, 4], 8, 3).tolist() == [0, 4, 8, 8]           # no padding rows
    assert fresh.offsets([7], 7, 1).tolist() == [0, 7]
    with pytest.raises(ValueError, match="do not fit a bucket of 8 rows"):
        fresh.offsets([5, 4], 8, 4)
    with pytest.raises(ValueError, match="3 sequences exceed the 2 prepared for"):
        fresh.offsets([2, 2], 8, 2)
    with pytest.raises(ValueError):
        fresh.offsets([0, 2], 8, 4)


def test_is_fresh():
    assert fresh.is_fresh([(0, 5), (0, 1)])
    assert not fresh.is_fresh([(0, 5), (16, 3)])
    assert not fresh.is_fresh([])


def _naive(q, k, v, start, n):
    """Causal attention of rows start..start+n-1 among themselves, float64, head by head."""
    H, d = q.shape[1], q.shape[2]
    g = H // k.shape[1]
    out = np.zeros((n, H, d))
    for h in range(H):
        for i in range(n):
            s = np.array([q[start + i, h] @ k[start + j, h // g] / math.sqrt(d) for j in range(i + 1)])
            w = np.exp(s - s.max())
            w /= w.sum()
            out[i, h] = sum(w[j] * v[start + j, h // g] for j in range(i + 1))
    return out


def test_attend_on_cpu_is_causal_per_sequence():
    gen = torch.Generator().manual_seed(3)
    H, K, d, S = 4, 2, 8, 64
    lengths, R = [5, 3, 6], 16
    kc = torch.randn(S, K, d, generator=gen, dtype=torch.float64)
    vc = torch.randn(S, K, d, generator=gen, dtype=torch.float64)
    q = torch.randn(H, R, d, generator=gen, dtype=torch.float64)
    slots = torch.randperm(S, generator=gen)[:R]             # any slots: K/V are read at the rows' slots
    cu = torch.tensor(fresh.offsets(lengths, R, 6))
    o = fresh.attend(q, kc, vc, slots, cu, R).view(R, H, d).numpy()
    qn, kn, vn = q.transpose(0, 1).numpy(), kc[slots].numpy(), vc[slots].numpy()
    start = 0
    for n in lengths + [R - sum(lengths)]:                   # the padding rows: a sequence of their own
        np.testing.assert_allclose(o[start:start + n], _naive(qn, kn, vn, start, n), rtol=1e-10, atol=1e-12)
        start += n


# ---------------------------------------------------------------- the kernel choice (CPU)


@pytest.fixture
def clean(monkeypatch):
    """No choice made, no graph prepared, the switch unset; the probe and the graph builder faked
    (``calls`` records what they were asked)."""
    monkeypatch.setattr(fresh, "info", {})
    monkeypatch.setattr(fresh, "_graphs", {})
    monkeypatch.delenv(fresh.ENV, raising=False)
    calls = {"probe": [], "build": [], "problem": "", "fail_at": None}

    def probe(*a):
        calls["probe"].append(a)
        return calls["problem"]

    def build(rows, *rest):
        calls["build"].append((rows, *rest))
        if rows == calls["fail_at"]:
            raise RuntimeError("no valid engine")
        return lambda q, k, v, cu: ("graph", rows)

    monkeypatch.setattr(fresh, "probe", probe)
    monkeypatch.setattr(fresh, "build", build)
    monkeypatch.setattr(fresh, "flash_call", lambda q, k, v, cu, rows: ("flash", rows))
    return calls


@pytest.mark.parametrize(("raw", "want"), [(None, "auto"), ("", "auto"), ("1", "auto"), ("On", "auto"),
                                           ("auto", "auto"), (" CUDNN ", "cudnn"), ("flash", "flash"),
                                           ("0", "off"), ("off", "off"), ("False", "off")])
def test_mode_reads_the_switch(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv(fresh.ENV, raising=False)
    else:
        monkeypatch.setenv(fresh.ENV, raw)
    assert fresh.mode() == want
    assert fresh.enabled() is (want != "off")


def test_mode_refuses_another_value(monkeypatch):
    monkeypatch.setenv(fresh.ENV, "fa3")
    with pytest.raises(ValueError, match="TRACESTORY_FRESH_ATTN: expected one of 0, auto, cudnn, flash, found 'fa3'"):
        fresh.mode()


def test_decide():
    assert fresh.decide("auto", "")[0] == "cudnn"
    assert fresh.decide("auto", "its probe failed: x") == ("flash", "cuDNN not used: its probe failed: x")
    assert fresh.decide("flash", "") == ("flash", "TRACESTORY_FRESH_ATTN=flash")
    kernel, reason = fresh.decide("cudnn", "")
    assert kernel == "cudnn" and reason.startswith("TRACESTORY_FRESH_ATTN=cudnn; ")
    with pytest.raises(RuntimeError, match="TRACESTORY_FRESH_ATTN=cudnn, but cuDNN cannot serve fresh prompts: x"):
        fresh.decide("cudnn", "x")


def _qkv(rows, count, heads=4, kv_heads=2, d=8):
    cu = torch.zeros(count + 1, dtype=torch.int32)
    return torch.zeros(rows, heads, d), torch.zeros(rows, kv_heads, d), torch.zeros(rows, kv_heads, d), cu


def test_prepare_builds_a_graph_per_bucket_and_run_takes_it_for_that_shape_only(clean):
    said = []
    got = fresh.prepare([256, 128], 9, 4, 2, 8, torch.float32, "cpu", said.append)
    assert got["kernel"] == "cudnn" and got["buckets"] == [128, 256]
    assert said == [f"fresh-prompt attention: cudnn ({got['reason']})"]
    assert clean["probe"] == [(4, 2, 8, torch.float32, "cpu", 9)]
    assert [b[:2] for b in clean["build"]] == [(256, 9), (128, 9)]
    assert fresh.run(*_qkv(128, 9), 128) == ("graph", 128)
    assert fresh.run(*_qkv(256, 9), 256) == ("graph", 256)
    assert fresh.run(*_qkv(384, 9), 384) == ("flash", 384)              # no bucket of 384 rows
    assert fresh.run(*_qkv(128, 3), 128) == ("flash", 128)              # an eager call: 3 sequences
    assert fresh.run(*_qkv(128, 9, heads=8), 128) == ("flash", 128)     # other heads
    q, k, v, cu = _qkv(128, 9)
    assert fresh.run(q.half(), k.half(), v.half(), cu, 128) == ("flash", 128)   # other dtype


def test_a_failed_probe_leaves_flash_with_its_reason(clean):
    clean["problem"] = "import cudnn failed: No module named 'cudnn'"
    got = fresh.prepare([128], 9, 4, 2, 8, torch.float32, "cpu")
    assert got == {"kernel": "flash", "reason": "cuDNN not used: import cudnn failed: No module named 'cudnn'",
                   "buckets": []}
    assert clean["build"] == [] and fresh._graphs == {}
    assert fresh.run(*_qkv(128, 9), 128) == ("flash", 128)


def test_a_failed_build_leaves_flash_for_every_bucket(clean):
    clean["fail_at"] = 256
    got = fresh.prepare([128, 256, 384], 9, 4, 2, 8, torch.float32, "cpu")
    assert got["kernel"] == "flash"
    assert got["reason"] == "cuDNN not used: its graph of 256 rows could not be built: no valid engine"
    assert [b[0] for b in clean["build"]] == [128, 256] and fresh._graphs == {}
    assert fresh.run(*_qkv(128, 9), 128) == ("flash", 128)


def test_cudnn_asked_for_raises_when_it_cannot_serve(clean, monkeypatch):
    monkeypatch.setenv(fresh.ENV, "cudnn")
    clean["problem"] = "its probe failed: boom"
    with pytest.raises(RuntimeError, match="=cudnn, but cuDNN cannot serve fresh prompts: its probe failed: boom"):
        fresh.prepare([128], 9, 4, 2, 8, torch.float32, "cpu")


def test_flash_and_off_skip_the_probe_and_drop_prepared_graphs(clean, monkeypatch):
    fresh.prepare([128], 9, 4, 2, 8, torch.float32, "cpu")
    assert fresh.run(*_qkv(128, 9), 128) == ("graph", 128)
    for raw, kernel in (("flash", "flash"), ("0", "off")):
        monkeypatch.setenv(fresh.ENV, raw)
        clean["probe"].clear()
        assert fresh.prepare([128], 9, 4, 2, 8, torch.float32, "cpu")["kernel"] == kernel
        assert clean["probe"] == [] and fresh._graphs == {}
        assert fresh.run(*_qkv(128, 9), 128) == ("flash", 128)


def test_probe_without_cuda():
    assert fresh.probe(4, 2, 8, torch.float32, torch.device("cpu")) == "no CUDA device (cpu)"


def test_attend_on_cpu_runs_the_reference_whatever_is_prepared(clean):
    fresh.prepare([16], 3, 4, 2, 8, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(4, 16, 8, generator=gen)
    kc, vc = torch.randn(32, 2, 8, generator=gen), torch.randn(32, 2, 8, generator=gen)
    slots, cu = torch.arange(16), torch.tensor(fresh.offsets([10], 16, 3))
    o = fresh.attend(q, kc, vc, slots, cu, 16)
    ref = fresh.reference(q.transpose(0, 1), kc[slots], vc[slots], cu).reshape(16, 32)
    assert torch.equal(o, ref)


def test_key_names_a_device_one_way():
    assert fresh._key("cpu", 128, 9, 4, 2, 8, torch.float32) == fresh._key(torch.device("cpu"), 128, 9, 4, 2, 8,
                                                                           torch.float32)
    assert fresh._key("cpu", 128, 9, 4, 2, 8, torch.float32)[0] == "cpu"
