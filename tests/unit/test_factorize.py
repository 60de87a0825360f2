"""trace.factorize against numpy's own np.unique(return_inverse=True) on the inputs it takes
both paths for: dense codes (the presence table), a sparse range and floats (np.unique)."""

from __future__ import annotations

import numpy as np
import pytest

from tracestory.trace import factorize


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.int16])
def test_same_as_np_unique(dtype):
    rng = np.random.default_rng(7)
    cases = [rng.integers(0, 50, 1000), rng.integers(-1, 3, 200), np.array([5]), np.zeros(0),
             np.array([-1, -1, -1]), rng.integers(0, 2**14, 30)]     # the last: a sparse range
    for raw in cases:
        v = raw.astype(dtype) if (dtype not in (np.uint32,) or raw.size == 0 or raw.min() >= 0) else raw.astype(np.int64)
        u, inv = factorize(v)
        eu, einv = np.unique(v, return_inverse=True)
        assert u.dtype == eu.dtype and np.array_equal(u, eu)
        assert np.array_equal(inv, einv.reshape(-1)) and np.array_equal(u[inv], v)


def test_hand_read_codes():
    # codes 3, -1, 3, 7, -1: distinct -1, 3, 7; positions 1, 0, 1, 2, 0
    u, inv = factorize(np.array([3, -1, 3, 7, -1], dtype=np.int32))
    assert u.tolist() == [-1, 3, 7] and inv.tolist() == [1, 0, 1, 2, 0]


def test_floats_and_sparse_values_fall_back():
    v = np.array([2.5, -1.0, 2.5])
    u, inv = factorize(v)
    assert u.tolist() == [-1.0, 2.5] and inv.tolist() == [1, 0, 1]
    big = np.array([10**15, 7, 10**15], dtype=np.int64)
    u, inv = factorize(big)
    assert u.tolist() == [7, 10**15] and inv.tolist() == [1, 0, 1]
