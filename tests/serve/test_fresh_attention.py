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
