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
    kernel, reason = fresh.decide("auto", "its call failed: no engine")
    assert kernel == "flash" and reason == "cuDNN not used: its call failed: no engine"
    assert fresh.decide("flash", "") == ("flash", "TRACESTORY_FRESH_ATTN=flash")
    kernel, reason = fresh.decide("cudnn", "")
    assert kernel == "cudnn" and reason.startswith("TRACESTORY_FRESH_ATTN=cudnn; ")
    with pytest.raises(RuntimeError, match="TRACESTORY_FRESH_ATTN=cudnn, but cuDNN cannot serve fresh prompts: x"):
        fresh.decide("cudnn", "x")


def _fake_probe(monkeypatch, problem):
    calls = []
    monkeypatch.setattr(fresh, "info", {})
    monkeypatch.setattr(fresh, "probe", lambda *a: calls.append(a) or problem)
    return calls


def test_choose_probes_once_and_says_it_once(monkeypatch):
    monkeypatch.delenv(fresh.ENV, raising=False)
    calls = _fake_probe(monkeypatch, "")
    said = []
    got = fresh.choose(32, 8, 128, "bf16", "cuda:0", said.append)
    assert got["kernel"] == "cudnn" and calls == [(32, 8, 128, "bf16", "cuda:0")]
    assert said == [f"fresh-prompt attention: cudnn ({got['reason']})"]
    assert fresh.choose(16, 4, 128, "bf16", "cuda:0", said.append) is got      # chosen once per process
    assert len(calls) == 1 and len(said) == 1


def test_choose_falls_back_to_flash_with_the_probe_s_reason(monkeypatch):
    monkeypatch.delenv(fresh.ENV, raising=False)
    _fake_probe(monkeypatch, "its call failed: boom")
    assert fresh.choose(32, 8, 128, "bf16", "cuda:0") == {"kernel": "flash",
                                                          "reason": "cuDNN not used: its call failed: boom"}


def test_choose_flash_and_off_skip_the_probe(monkeypatch):
    for raw, kernel in (("flash", "flash"), ("0", "off")):
        monkeypatch.setenv(fresh.ENV, raw)
        calls = _fake_probe(monkeypatch, "never asked")
        assert fresh.choose(32, 8, 128, "bf16", "cuda:0")["kernel"] == kernel and calls == []


def test_probe_without_cuda():
    assert fresh.probe(4, 2, 8, torch.float32, torch.device("cpu")) == "no CUDA device (cpu)"


def _fake_kernels(monkeypatch, cudnn_error=None):
    ran = []

    def cudnn(q, k, v, cu, rows):
        ran.append("cudnn")
        if cudnn_error:
            raise RuntimeError(cudnn_error)
        return "cudnn-out"

    monkeypatch.setattr(fresh, "cudnn_call", cudnn)
    monkeypatch.setattr(fresh, "flash_call", lambda *a: ran.append("flash") or "flash-out")
    return ran


def _qkv():
    return torch.zeros(16, 4, 8), torch.zeros(16, 2, 8), torch.zeros(16, 2, 8), torch.tensor([0, 16])


def test_first_use_chooses_on_the_call_s_shape(monkeypatch):
    monkeypatch.delenv(fresh.ENV, raising=False)
    calls = _fake_probe(monkeypatch, "")
    ran = _fake_kernels(monkeypatch)
    q, k, v, cu = _qkv()
    assert fresh.run_chosen(q, k, v, cu, 16, capturing=False) == "cudnn-out"
    assert calls == [(4, 2, 8, torch.float32, torch.device("cpu"))] and ran == ["cudnn"]


def test_first_use_inside_a_capture_takes_flash_unprobed(monkeypatch):
    monkeypatch.delenv(fresh.ENV, raising=False)
    calls = _fake_probe(monkeypatch, "")
    ran = _fake_kernels(monkeypatch)
    assert fresh.run_chosen(*_qkv(), 16, capturing=True) == "flash-out"
    assert calls == [] and ran == ["flash"] and "capture" in fresh.info["reason"]


def test_a_cudnn_error_moves_to_flash_outside_a_capture_only(monkeypatch):
    monkeypatch.delenv(fresh.ENV, raising=False)
    ran = _fake_kernels(monkeypatch, cudnn_error="no valid engine")
    monkeypatch.setattr(fresh, "info", {"kernel": "cudnn", "reason": "probe passed"})
    with pytest.raises(RuntimeError, match="no valid engine"):
        fresh.run_chosen(*_qkv(), 16, capturing=True)
    assert fresh.info["kernel"] == "cudnn"
    assert fresh.run_chosen(*_qkv(), 16, capturing=False) == "flash-out"
    assert fresh.info == {"kernel": "flash", "reason": "cuDNN failed at 16 rows, flash since: no valid engine"}
    assert fresh.run_chosen(*_qkv(), 16, capturing=False) == "flash-out"
    assert ran == ["cudnn", "cudnn", "flash", "flash"]


def test_a_cudnn_error_propagates_when_cudnn_was_asked_for(monkeypatch):
    monkeypatch.setenv(fresh.ENV, "cudnn")
    _fake_kernels(monkeypatch, cudnn_error="no valid engine")
    monkeypatch.setattr(fresh, "info", {"kernel": "cudnn", "reason": "asked"})
    with pytest.raises(RuntimeError, match="no valid engine"):
        fresh.run_chosen(*_qkv(), 16, capturing=False)


def test_attend_on_cpu_chooses_nothing(monkeypatch):
    monkeypatch.setattr(fresh, "info", {})
    _fake_kernels(monkeypatch)
    q = torch.randn(4, 16, 8)
    kc, vc = torch.randn(32, 2, 8), torch.randn(32, 2, 8)
    fresh.attend(q, kc, vc, torch.arange(16), torch.tensor(fresh.offsets([10], 16, 3)), 16)
    assert fresh.info == {}
