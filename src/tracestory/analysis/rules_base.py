"""The finding record shared by every rule module, and the small formatting helpers rules use
for titles. :mod:`.findings` re-exports :class:`Finding` and :class:`Evidence`.

Evidence values are raw numbers in base units (ns, bytes, fractions 0..1, ratios); the report
formats them by ``unit`` so every number printed in a finding can be traced to its evidence.
Units: ``ns``, ``ns_per_step``, ``ns_per_token``, ``fraction``, ``x``, ``count``, ``per_ms``,
``bytes``, ``ratio``, ``text``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..stats import linear_fit  # noqa: F401  (re-exported for the rules)

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
