"""``tracestory load``: a streaming load generator for OpenAI-compatible servers.

:func:`run_load` sends the requests (:mod:`.generator`), :func:`summarize` turns the records
into rates, percentiles and goodput (:mod:`.stats`). aiohttp (the ``load`` extra) is imported
only when a run starts.
"""

from __future__ import annotations

from .generator import (
                        ERROR_KINDS,
                        LoadConfig,
                        LoadProgress,
                        LoadResult,
                        RequestRecord,
                        arrival_offsets_ns,
                        run_load,
)
from .stats import (
                        Distribution,
                        LoadSummary,
                        distribution,
                        percentile,
                        summarize,
                        summary_lines,
)

__all__ = [
                        "ERROR_KINDS",
                        "Distribution",
                        "LoadConfig",
                        "LoadProgress",
                        "LoadResult",
                        "LoadSummary",
                        "RequestRecord",
                        "arrival_offsets_ns",
                        "distribution",
                        "percentile",
                        "run_load",
                        "summarize",
                        "summary_lines",
]
