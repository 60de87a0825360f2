"""Summary of a load run in our own terms (nested, in ns): the file ``tracestory load --json``
writes and ``tracestory report`` reads next to a scheduler log. The vLLM-style flat result in ms
is :mod:`.metrics`; both count the same requests the same way.

Definitions (all from the records of :mod:`tracestory.loadgen.generator`):

* ``planned``: every record (every planned request); ``sent``: those sent; ``ok``: those
  completed; ``failed``: sent and not OK (``cancelled`` included); ``not_sent``: planned, never
  sent (not a failure). ``planned = ok + failed + not_sent``.
* ``elapsed_ns``: run start to the end of the last request (or the stop).
* ``achieved_qps`` = OK requests / elapsed. ``sent_qps`` = requests sent / send window (the
  ``duration``, or less when every planned request was sent first or the run was interrupted):
  compare it with ``target_qps`` to see whether the generator kept up.
* Token throughput counts OK requests only: ``input_tokens_per_s`` = their prompt tokens /
  elapsed, ``output_tokens_per_s`` = their output tokens / elapsed.
* Latencies (TTFT, E2E per OK request; ITL pooled over every gap of every OK request) are
  summarized by percentiles with **linear interpolation between closest ranks**
  (:func:`tracestory.stats.percentile`). No sample: ``None``.
* Goodput (``--goodput``, vLLM's rule): a request is *good* when it is OK and its TTFT, its
  TPOT (:attr:`RequestRecord.tpot_ns`) and its E2E latency are each at most their SLO (an SLO
  left out is not checked). ``goodput_rps`` = good / elapsed; ``goodput_fraction`` = good /
  planned. No SLO given: ``None``. ``slo_itl_ns`` holds the TPOT SLO (the older name).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..stats import percentile  # noqa: F401  (re-exported)
from ..ingest.load_summary import Distribution, LoadSummary, distribution, is_summary_file, read_summary  # noqa: F401
from .generator import LoadResult, RequestRecord


def is_good(r: RequestRecord, slo_ttft_ns: float | None, slo_tpot_ns: float | None,
            slo_e2el_ns: float | None = None) -> bool:
    """OK and within every SLO given (see the module docstring)."""
    if not r.ok:
        return False
    for slo, value in ((slo_ttft_ns, r.ttft_ns), (slo_tpot_ns, r.tpot_ns), (slo_e2el_ns, r.e2e_ns)):
        if slo is not None and (value is None or value > slo):
            return False
    return True


def _rate(n: float, ns: int) -> float | None:
    return n / (ns / 1e9) if ns > 0 else None


def slo_ns(cfg) -> tuple[int | None, int | None, int | None]:
    """(TTFT, TPOT, E2EL) SLOs of a config in ns, None where not given."""
    g = cfg.goodput_ms
    return tuple(round(g[m] * 1e6) if m in g else None for m in ("ttft", "tpot", "e2el"))


def summarize(result: LoadResult) -> LoadSummary:
    cfg = result.config
    recs = result.records
    ok = [r for r in recs if r.ok]
    sent = sum(r.sent for r in recs)
    failures = Counter(r.failure_key for r in recs if r.failure_key is not None)
    itl = np.concatenate([np.asarray(r.itl_ns, dtype=np.int64) for r in ok]) if ok else np.empty(0)
    slo_ttft, slo_tpot, slo_e2el = slo_ns(cfg)
    checked = cfg.goodput_ms != {}
    good = sum(is_good(r, slo_ttft, slo_tpot, slo_e2el) for r in recs) if checked else None
    el = result.elapsed_ns
    tin = sum(r.prompt_tokens for r in ok)
    tout = sum(r.output_tokens for r in ok)
    finite = not math.isinf(cfg.request_rate)
    return LoadSummary(
        mode=cfg.mode, target_qps=cfg.request_rate if finite else None, concurrency=cfg.max_concurrency,
        duration_s=cfg.duration_s if cfg.duration_s is not None else el / 1e9,
        planned=len(recs), sent=sent, ok=len(ok), failed=sent - len(ok), failures=dict(sorted(failures.items())),
        elapsed_ns=el, send_window_ns=result.send_window_ns,
        achieved_qps=_rate(len(ok), el), sent_qps=_rate(sent, result.send_window_ns),
        input_tokens=tin, output_tokens=tout, input_tokens_per_s=_rate(tin, el), output_tokens_per_s=_rate(tout, el),
        ttft=distribution([r.ttft_ns for r in ok if r.ttft_ns is not None]),
        itl=distribution(itl), e2e=distribution([r.e2e_ns for r in ok]),
        slo_ttft_ns=slo_ttft, slo_itl_ns=slo_tpot, good=good,
        goodput_rps=_rate(good, el) if good is not None else None,
        goodput_fraction=(good / len(recs) if recs else None) if good is not None else None,
        interrupted=result.interrupted, deadline_hit=result.deadline_hit, t0_unix_ns=result.t0_unix_ns,
        not_sent=len(recs) - sent, slo_e2el_ns=slo_e2el,
        prompts_exact=result.prompts.exact if result.prompts is not None else None, capped_at=result.capped_at)
