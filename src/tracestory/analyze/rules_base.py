"""The finding record shared by every rule module, and the small formatting helpers rules use
for titles. :mod:`.findings` re-exports :class:`Finding` and :class:`Evidence`.

Evidence values are raw numbers in base units (ns, bytes, fractions 0..1, ratios); the report
formats them by ``unit`` so every number printed in a finding can be traced to its evidence.
Units: ``ns``, ``ns_per_step``, ``ns_per_token``, ``fraction``, ``x``, ``count``, ``per_ms``,
``bytes``, ``ratio``, ``text``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEVERITIES = ("high", "medium", "low", "info")


@dataclass(frozen=True)
class Evidence:
    label: str
    value: float | int | str | None
    unit: str  # see the module docstring


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # one of SEVERITIES
    title: str
    evidence: tuple[Evidence, ...]
    implication: str
    recommendation: str


def fmt_t(ns: float | None) -> str:
    """A duration for titles and sentences, 3 significant digits (the report's ``fmt_ns``)."""
    if ns is None:
        return "n/a"
    a = abs(ns)
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if a >= scale:
            v = ns / scale
            return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:.0f} {unit}"
    return f"{ns:.0f} ns"


def fmt_p(fraction: float) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{100 * fraction:.1f}%"


def fmt_b(n: float) -> str:
    """Bytes in binary units, 3 significant digits."""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.3g} {unit}"
        v /= 1024
    return f"{v:.3g} GiB"


def capital(text: str) -> str:
    return text[:1].upper() + text[1:]


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
