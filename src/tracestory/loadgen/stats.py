"""Summary of a load run: rates, token throughput, latency percentiles, goodput under an SLO.

Definitions (all from the records of :mod:`tracestory.loadgen.generator`):

* ``elapsed_ns``: run start to the end of the last request (or the deadline).
* ``achieved_qps`` = OK requests / elapsed. ``sent_qps`` = requests sent / send window (the
  ``duration``, or less when ``num_requests`` was reached first or the run was interrupted):
  compare it with ``target_qps`` to see whether the generator kept up.
* Token throughput counts OK requests only: ``input_tokens_per_s`` = their prompt tokens /
  elapsed, ``output_tokens_per_s`` = their output tokens / elapsed.
* Latencies (TTFT, E2E per OK request; ITL pooled over every gap of every OK request) are
  summarized by percentiles with **linear interpolation between closest ranks** (numpy's
  default ``linear`` method, Hyndman & Fan type 7): for sorted ``x[0..n-1]`` the ``p``-th
  percentile is at rank ``h = (n - 1) p / 100``, ``x[floor h] + (h - floor h)(x[floor h + 1] -
  x[floor h])``. No sample: ``None``.
* Goodput: a request is *good* when it is OK, its TTFT <= ``slo_ttft`` and its mean
  inter-token latency (``(e2e - ttft) / (output_tokens - 1)`` measured as the mean of its
  ITL gaps; a request with one token event has no gap and meets it) <= ``slo_itl``.
  ``goodput_rps`` = good / elapsed; ``goodput_fraction`` = good / all records (failed and
  cancelled requests are not good). An SLO left out is not checked; both left out: ``None``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..stats import percentile  # noqa: F401  (re-exported)
from ..ingest.load_summary import Distribution, LoadSummary, distribution, is_summary_file, read_summary  # noqa: F401
from .generator import LoadResult, RequestRecord


def is_good(r: RequestRecord, slo_ttft_ns: int | None, slo_itl_ns: int | None) -> bool:
    """OK and within both SLOs (see the module docstring)."""
    if not r.ok:
        return False
    if slo_ttft_ns is not None and (r.ttft_ns is None or r.ttft_ns > slo_ttft_ns):
        return False
    return not (slo_itl_ns is not None and r.itl_ns and sum(r.itl_ns) / len(r.itl_ns) > slo_itl_ns)


def _rate(n: float, ns: int) -> float | None:
    return n / (ns / 1e9) if ns > 0 else None


def summarize(result: LoadResult) -> LoadSummary:
    cfg = result.config
    recs = result.records
    ok = [r for r in recs if r.ok]
    failures = Counter(r.failure_key for r in recs if not r.ok)
    itl = np.concatenate([np.asarray(r.itl_ns, dtype=np.int64) for r in ok]) if ok else np.empty(0)
    slo_ttft = round(cfg.slo_ttft_s * 1e9) if cfg.slo_ttft_s is not None else None
    slo_itl = round(cfg.slo_itl_s * 1e9) if cfg.slo_itl_s is not None else None
    checked = slo_ttft is not None or slo_itl is not None
    good = sum(is_good(r, slo_ttft, slo_itl) for r in recs) if checked else None
    el = result.elapsed_ns
    tin = sum(r.prompt_tokens for r in ok)
    tout = sum(r.output_tokens for r in ok)
    return LoadSummary(
        mode=cfg.mode, target_qps=cfg.target_qps, concurrency=cfg.concurrency, duration_s=cfg.duration_s,
        planned=len(recs), sent=sum(r.send_ns is not None for r in recs), ok=len(ok),
        failed=len(recs) - len(ok), failures=dict(sorted(failures.items())),
        elapsed_ns=el, send_window_ns=result.send_window_ns,
        achieved_qps=_rate(len(ok), el), sent_qps=_rate(sum(r.send_ns is not None for r in recs), result.send_window_ns),
        input_tokens=tin, output_tokens=tout, input_tokens_per_s=_rate(tin, el), output_tokens_per_s=_rate(tout, el),
        ttft=distribution([r.ttft_ns for r in ok if r.ttft_ns is not None]),
        itl=distribution(itl), e2e=distribution([r.e2e_ns for r in ok]),
        slo_ttft_ns=slo_ttft, slo_itl_ns=slo_itl, good=good,
        goodput_rps=_rate(good, el) if good is not None else None,
        goodput_fraction=(good / len(recs) if recs else None) if good is not None else None,
        interrupted=result.interrupted, deadline_hit=result.deadline_hit, t0_unix_ns=result.t0_unix_ns)


def summary_lines(s: LoadSummary) -> list[str]:
    """A plain-text summary for the terminal (the CLI prints it)."""
    from ..render.ascii import fmt_ns

    def f(v, spec=".2f"):
        return "n/a" if v is None else format(v, spec)

    mode = f"Poisson {s.target_qps:g} QPS" if s.mode == "poisson" else f"concurrency {s.concurrency}"
    lines = [f"{mode}, {s.duration_s:g} s: {s.planned} requests, {s.sent} sent, {s.ok} OK, {s.failed} failed"
             + (" (interrupted)" if s.interrupted else "") + (" (deadline hit)" if s.deadline_hit else ""),
             f"achieved {f(s.achieved_qps)} QPS (sent {f(s.sent_qps)} QPS) over {fmt_ns(s.elapsed_ns)}",
             f"throughput: {f(s.input_tokens_per_s, '.1f')} input tok/s, {f(s.output_tokens_per_s, '.1f')} output tok/s"]
    for name, d in (("TTFT", s.ttft), ("ITL", s.itl), ("E2E", s.e2e)):
        lines.append(f"{name:<5} p50 {fmt_ns(d.p50_ns)}  p90 {fmt_ns(d.p90_ns)}  p99 {fmt_ns(d.p99_ns)}"
                     f"  (n={d.count})")
    if s.good is not None:
        slo = ", ".join(x for x in (f"TTFT <= {fmt_ns(s.slo_ttft_ns)}" if s.slo_ttft_ns is not None else "",
                                    f"mean ITL <= {fmt_ns(s.slo_itl_ns)}" if s.slo_itl_ns is not None else "") if x)
        lines.append(f"goodput ({slo}): {s.good} requests, {f(s.goodput_rps)} req/s, "
                     f"{f(None if s.goodput_fraction is None else 100 * s.goodput_fraction, '.1f')}%")
    if s.failures:
        lines.append("failures: " + ", ".join(f"{k} {v}" for k, v in s.failures.items()))
    return lines
