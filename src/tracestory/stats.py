"""Summary statistics shared by every analysis: percentiles, distributions, a least-squares fit.

Percentiles interpolate linearly between closest ranks (numpy's ``linear`` method, the one
``nsys stats`` and ``vllm bench serve`` report); the standard deviation is the population one
(``ddof=0``) unless asked otherwise.
"""

from __future__ import annotations

from typing import Sequence

import msgspec
import numpy as np


def percentile(values: Sequence[float] | np.ndarray, p: float) -> float | None:
    """The ``p``-th percentile (0-100) with linear interpolation; None if there are no values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    return float(np.percentile(x, p, method="linear"))


class Summary(msgspec.Struct, frozen=True):
    """Count, total, mean, median, min, max, standard deviation and the asked percentiles of a
    sample; every field but ``count`` is None without samples."""

    count: int
    total: float | None
    mean: float | None
    median: float | None
    min: float | None
    max: float | None
    std: float | None
    percentiles: tuple[tuple[float, float], ...] = ()   # (p, value) pairs

    def at(self, p: float) -> float | None:
        """The ``p``-th percentile if it was computed (``median`` is ``at(50)``)."""
        if p == 50:
            return self.median
        return dict(self.percentiles).get(float(p))


def summarize(values: Sequence[float] | np.ndarray, percentiles: Sequence[float] = (), ddof: int = 0) -> Summary:
    """The :class:`Summary` of ``values`` with the given percentiles (0-100)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return Summary(0, None, None, None, None, None, None, tuple((float(p), None) for p in percentiles))
    ps = [float(p) for p in percentiles]
    qs = np.percentile(x, [50.0, *ps], method="linear")
    std = float(x.std(ddof=ddof)) if x.size > ddof else None
    return Summary(int(x.size), float(x.sum()), float(x.mean()), float(qs[0]), float(x.min()), float(x.max()), std,
                   tuple(zip(ps, (float(q) for q in qs[1:]))))


def linear_fit(x, y) -> tuple[float, float, float | None] | None:
    """Least squares ``y = intercept + slope * x``: ``(slope, intercept, r2)``; ``None`` when
    fewer than 3 points or ``x`` is constant; ``r2`` is ``None`` when ``y`` is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 3 or np.ptp(x) == 0:
        return None
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
    intercept = float(ym - slope * xm)
    ss_tot = float(((y - ym) ** 2).sum())
    r2 = None if ss_tot == 0 else 1.0 - float(((y - intercept - slope * x) ** 2).sum()) / ss_tot
    return slope, intercept, r2
