"""The summary a load run writes (``tracestory load --json``): read back for the batch story.

The file is one JSON object ``{"config": {...}, "summary": {...}}``; ``summary`` holds every
field of :class:`LoadSummary` (latency distributions as objects with ``count`` and the
percentiles in ns). The definitions of each number are in :mod:`tracestory.loadgen.stats`,
which writes it. A missing key or a wrong type raises
:class:`~tracestory.errors.TraceFormatError` naming the file and the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError
from ..stats import summarize
from .files import check_size, refuse_special
from .sniffs import is_summary_file  # noqa: F401  (its sniff, where it was)


@dataclass(frozen=True)
class Distribution:
    """Percentiles of one latency, in ns; every field None without samples."""

    count: int
    mean_ns: float | None
    min_ns: float | None
    p50_ns: float | None
    p90_ns: float | None
    p99_ns: float | None
    max_ns: float | None


@dataclass(frozen=True)
class LoadSummary:
    mode: str
    target_qps: float | None
    concurrency: int | None
    duration_s: float
    planned: int                       # records (every planned or started request)
    sent: int
    ok: int
    failed: int                        # sent and not ok, cancelled included
    failures: dict[str, int]           # kind (or http_<code>) -> count
    elapsed_ns: int
    send_window_ns: int
    achieved_qps: float | None
    sent_qps: float | None
    input_tokens: int
    output_tokens: int
    input_tokens_per_s: float | None
    output_tokens_per_s: float | None
    ttft: Distribution
    itl: Distribution
    e2e: Distribution
    slo_ttft_ns: int | None
    slo_itl_ns: int | None
    good: int | None
    goodput_rps: float | None
    goodput_fraction: float | None
    interrupted: bool
    deadline_hit: bool
    t0_unix_ns: int
    # added later, with defaults: files written before lack them
    not_sent: int = 0                        # planned, never sent (window closed, Ctrl-C)
    slo_e2el_ns: int | None = None
    prompts_exact: bool | None = None        # lengths counted by a real tokenizer
    capped_at: int | None = None             # planning stopped at --max-requests

    def to_json(self) -> dict:
        return asdict(self)


def distribution(values: Sequence[float] | np.ndarray) -> Distribution:
    """Count, mean, min, p50/p90/p99 (linear interpolation) and max of ``values``."""
    sm = summarize(values, (90, 99))
    return Distribution(sm.count, sm.mean, sm.min, sm.median, sm.at(90), sm.at(99), sm.max)


def _check_numbers(path: str | Path, s: dict) -> None:
    """Every number of the summary (counts, times, rates; those of ttft/itl/e2e and failures
    too) as ``tracestory load`` writes it: finite, not negative, within int64. 2^70 requests or a
    negative latency is a damaged or hand-edited file, refused in one line."""
    for key, v in s.items():
        items = v.items() if isinstance(v, dict) else [("", v)]
        for sub, x in items:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                continue
            if not (math.isfinite(x) and 0 <= x < (1 << 63)):
                name = f"summary.{key}" + (f".{sub}" if sub else "")
                raise TraceFormatError(path, f"{name} finite, not negative and within int64", repr(x)[:40])


def read_summary(path: str | Path) -> LoadSummary:
    """The :class:`LoadSummary` of a ``tracestory load --json`` file; a missing key or a wrong
    type raises :class:`~tracestory.errors.TraceFormatError` naming it."""
    check_size(path, refuse_special(path))
    try:
        doc = json.loads(Path(path).read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise TraceFormatError(path, "a `tracestory load --json` summary", f"unreadable JSON ({e})") from None
    s = doc.get("summary") if isinstance(doc, dict) else None
    if not isinstance(s, dict):
        raise TraceFormatError(path, "a `tracestory load --json` summary", "no \"summary\" object")
    required = [f for f in fields(LoadSummary) if f.default is MISSING]
    missing = [f.name for f in required if f.name not in s]
    if missing:
        raise TraceFormatError(path, "a `tracestory load --json` summary", f"no key {missing[0]!r} in \"summary\"")
    _check_numbers(path, s)
    values = dict(s)
    for name in ("ttft", "itl", "e2e"):
        d = s[name]
        if not isinstance(d, dict) or any(f.name not in d for f in fields(Distribution)):
            raise TraceFormatError(path, f"summary.{name} with count and p50/p90/p99 in ns", repr(d)[:80])
        values[name] = Distribution(**{f.name: d[f.name] for f in fields(Distribution)})
    return LoadSummary(**{f.name: values[f.name] for f in fields(LoadSummary) if f.name in values})


def against_log(summary: LoadSummary, log) -> list[str]:
    """Where a load summary cannot be of the same run as the scheduler log given with it: the
    client says it sent no request, or that more requests succeeded than the server finished,
    while the log (``SchedulerLog``) holds ``finish`` lines. Either way the two files are not of
    one run, and the client-side numbers (TTFT, throughput) next to the log's would mislead: the
    report states it.
    A summary that sent fewer requests than the log finished is not flagged: a capture's log also
    holds the requests of its warm-up and of other clients."""
    done = len(log.finishes)
    if done and summary.sent == 0:
        return [f"the load summary sent no request while the scheduler log {Path(log.path).name} finished "
                f"{done}: the two files are not of the same run"]
    if summary.ok > done:
        return [f"the load summary counts {summary.ok} successful requests but the scheduler log "
                f"{Path(log.path).name} finished {done}: the two files are not of the same run"]
    return []
