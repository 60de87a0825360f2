"""When requests are planned to be sent: gamma-distributed gaps, as ``vllm bench serve`` does.

The first request is planned at 0; each later one follows the previous by a gap drawn from a
gamma distribution of shape ``burstiness`` and scale ``1 / (rate * burstiness)``, so the mean
gap is ``1 / rate`` whatever the burstiness and the squared coefficient of variation of the gaps
is ``1 / burstiness``: 1 is a Poisson process, below 1 burstier, above 1 more regular. An
infinite rate plans every request at 0. Gaps come from ``numpy.random.default_rng(seed)``,
drawn in blocks in order, so a run's plan depends only on the rate, the burstiness and the seed.

The plan stops at ``count`` requests or at the first arrival at or after ``duration_s``,
whichever comes first; at least one of them must be given.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets_ns(request_rate: float, *, burstiness: float = 1.0, seed: int = 0,
                       duration_s: float | None = None, count: int | None = None) -> np.ndarray:
    """Planned send times in ns from the run start (int64, non-decreasing)."""
    if count is None and duration_s is None:
        raise ValueError("arrival_offsets_ns: give count or duration_s")
    if math.isinf(request_rate):
        if count is None:
            raise ValueError("arrival_offsets_ns: an infinite rate needs a count")
        return np.zeros(count if duration_s is None or duration_s > 0 else 0, dtype=np.int64)
    rng = np.random.default_rng(seed)
    shape, scale = burstiness, 1.0 / (request_rate * burstiness)
    limit = math.inf if duration_s is None else duration_s
    expected = count if count is not None else request_rate * duration_s
    block = int(min(expected, 1_000_000) + 6 * math.sqrt(expected) + 16)
    times = [np.zeros(1)]
    n, last = 1, 0.0
    while last < limit and (count is None or n < count):
        new = last + np.cumsum(rng.gamma(shape, scale, size=block))
        times.append(new)
        n += new.size
        last = float(new[-1])
    out = np.concatenate(times)
    out = out[out < limit]
    if count is not None:
        out = out[:count]
    return np.round(out * 1e9).astype(np.int64)
