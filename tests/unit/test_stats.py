"""Percentiles and summaries against values worked out by hand."""

from __future__ import annotations

from tracestory.stats import linear_fit, percentile, summarize


def test_summary_by_hand():
    # 1, 2, 3, 4: mean 2.5, median 2.5 (between 2 and 3), p90 = 3 + 0.7 * (4 - 3) = 3.7,
    # population variance ((1.5^2 + 0.5^2) * 2) / 4 = 1.25.
    s = summarize([4, 1, 3, 2], percentiles=(90,))
    assert (s.count, s.total, s.mean, s.median, s.min, s.max) == (4, 10.0, 2.5, 2.5, 1.0, 4.0)
    assert abs(s.at(90) - 3.7) < 1e-12 and abs(s.std - 1.25 ** 0.5) < 1e-12
    assert summarize([], percentiles=(99,)).median is None
    assert percentile([], 50) is None and percentile([10, 20], 50) == 15.0


def test_linear_fit_exact_line():
    slope, intercept, r2 = linear_fit([1, 2, 3, 4], [5, 7, 9, 11])
    assert (slope, intercept, r2) == (2.0, 3.0, 1.0)
    assert linear_fit([1, 1, 1], [1, 2, 3]) is None
