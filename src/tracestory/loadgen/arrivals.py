"""When requests are planned to be sent: gamma-distributed gaps, as ``vllm bench serve`` does.

The first request is planned at 0; each later one follows the previous by a gap drawn from a
gamma distribution of shape ``burstiness`` and scale ``1 / (rate * burstiness)``, so the mean
gap is ``1 / rate`` whatever the burstiness and the squared coefficient of variation of the gaps
is ``1 / burstiness``: 1 is a Poisson process, below 1 burstier, above 1 more regular. An
infinite rate plans every request at 0. Gaps come from ``numpy.random.default_rng(seed)``,
drawn in blocks in order, so a run's plan depends only on the rate, the burstiness and the seed.

The plan stops at ``count`` requests or at the first arrival at or after ``duration_s``,
whichever comes first; at least one of them must be given.

Ramp-up (:func:`ramp_offsets_ns`, vLLM's ``--ramp-up-strategy``): request ``i`` of ``count`` has
the rate ``r_i`` with progress ``x = i / (count - 1)``: ``linear`` ``S + (E - S) x``,
``exponential`` ``S (E / S)^x``. Request 0 is planned at 0 and the gap before request ``i`` is
gamma of shape ``burstiness`` and mean ``1 / r_i``: ``default_rng(seed).standard_gamma(burstiness,
count - 1) / (r_i burstiness)``. vLLM draws a gap before request 0 too; here the run starts with
a request, as it does without a ramp.
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


def ramp_rates(strategy: str, start_rps: float, end_rps: float, count: int) -> np.ndarray:
    """The planned rate of each of ``count`` requests (requests/s)."""
    x = np.arange(count, dtype=np.float64) / max(count - 1, 1)
    if strategy == "linear":
        return start_rps + (end_rps - start_rps) * x
    if strategy == "exponential":
        return start_rps * (end_rps / start_rps) ** x
    raise ValueError(f"ramp_rates: unknown strategy {strategy!r}")


def ramp_offsets_ns(strategy: str, start_rps: float, end_rps: float, *, count: int, burstiness: float = 1.0,
                    seed: int = 0, duration_s: float | None = None) -> np.ndarray:
    """Planned send times in ns of a ramped run (module docstring), cut at ``duration_s``."""
    if count < 1:
        return np.zeros(0, dtype=np.int64)
    rates = ramp_rates(strategy, start_rps, end_rps, count)
    gaps = np.random.default_rng(seed).standard_gamma(burstiness, size=count - 1) / (rates[1:] * burstiness)
    out = np.concatenate([np.zeros(1), np.cumsum(gaps)])
    if duration_s is not None:
        out = out[out < duration_s]
    return np.round(out * 1e9).astype(np.int64)
