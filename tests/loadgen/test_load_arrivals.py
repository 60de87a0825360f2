"""Arrival times of `tracestory load`: vLLM's gamma gaps (shape = burstiness, mean 1/rate), the
first request at 0, an infinite rate all at 0, the count and duration stops. Expected values come
from numpy's gamma draws directly and from the gamma distribution's moments (mean k * theta,
variance k * theta^2, so the squared coefficient of variation of the gaps is 1 / burstiness)."""

from __future__ import annotations

import numpy as np
import pytest

from tracestory.loadgen import arrival_offsets_ns


def test_first_at_zero_then_gamma_gaps_of_the_seed():
    got = arrival_offsets_ns(8.0, burstiness=0.5, seed=3, count=50)
    gaps = np.random.default_rng(3).gamma(0.5, 1 / (8.0 * 0.5), size=49)
    assert got[0] == 0 and got.size == 50
    assert got.tolist() == np.round(np.concatenate([[0.0], np.cumsum(gaps)]) * 1e9).astype(np.int64).tolist()


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_mean_gap_is_one_over_rate_and_burstiness_sets_the_spread(burstiness):
    rate = 50.0
    gaps = np.diff(arrival_offsets_ns(rate, burstiness=burstiness, seed=1, count=40_001)) / 1e9
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    cv2 = gaps.var() / gaps.mean() ** 2
    assert cv2 == pytest.approx(1 / burstiness, rel=0.08)


def test_duration_stops_the_plan_and_count_caps_it():
    rate, duration = 100.0, 2.0
    full = np.concatenate([[0.0], np.cumsum(np.random.default_rng(5).exponential(1 / rate, size=5000))])
    expected = full[full < duration]
    got = arrival_offsets_ns(rate, seed=5, duration_s=duration)
    assert got.size == expected.size and got[-1] == round(expected[-1] * 1e9)
    assert arrival_offsets_ns(rate, seed=5, duration_s=duration, count=17).tolist() == got[:17].tolist()


def test_infinite_rate_plans_everything_at_zero():
    assert arrival_offsets_ns(float("inf"), count=5).tolist() == [0] * 5
    with pytest.raises(ValueError):
        arrival_offsets_ns(float("inf"), duration_s=1.0)
