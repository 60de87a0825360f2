"""The finding record shared by every rule module (titles format numbers with ``tracestory.units``). :mod:`.findings` re-exports :class:`Finding` and :class:`Evidence`.

Evidence values are raw numbers in base units (ns, bytes, fractions 0..1, ratios); the report
formats them by ``unit`` so every number printed in a finding can be traced to its evidence.
Units: ``ns``, ``ns_per_step``, ``ns_per_token``, ``fraction``, ``x``, ``count``, ``per_ms``,
``bytes``, ``ratio``, ``text``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from ...stats import linear_fit  # noqa: F401  (re-exported for the rules)
from ...units import capital  # noqa: F401  (re-exported for the rules)

SEVERITIES = ("high", "medium", "low", "info")


class Evidence(msgspec.Struct, frozen=True):
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
    basis: tuple[str, ...] = ()  # the facts the claim rests on (workload, platform, trace kind)
