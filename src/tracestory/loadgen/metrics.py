"""The result of a load run in ``vllm bench serve``'s terms: a flat dict in ms, its printed block.

Definitions (every value from the records of :mod:`.generator`; a vLLM user's scripts read the
same keys):

* ``completed``: OK requests; ``failed``: sent and not OK; ``not_sent`` (ours): planned and
  never sent. ``duration``: seconds from the run start to the end of the last request.
* ``total_input_tokens`` / ``total_output_tokens``: prompt / output tokens of the completed
  requests (the server's ``usage`` when it sends one, else the planned prompt length and the
  streamed token events). ``request_throughput`` = completed / duration,
  ``output_throughput`` = output tokens / duration, ``total_token_throughput`` = (input +
  output) / duration, ``request_goodput`` = good requests / duration (None without ``--goodput``).
* Per completed request: TTFT, TPOT = ``(e2e - ttft) / (output_tokens - 1)`` (0 for a request
  of one token, as vLLM), E2EL; ITL pooled over every gap between token events of every
  completed request. For each metric of ``percentile_metrics``: ``mean_<m>_ms``,
  ``median_<m>_ms``, ``std_<m>_ms`` (population standard deviation) and ``p<P>_<m>_ms`` for each
  ``P`` of ``metric_percentiles`` (``p99``, ``p99.9``), percentiles by linear interpolation
  (:func:`tracestory.stats.summarize`). No sample: ``None`` (vLLM writes 0).
* Goodput (vLLM's rule): a completed request is good when each of its TTFT, TPOT and E2EL with
  an SLO is at most that SLO.
* ``max_concurrent_requests``: the most requests in flight at once (from send and end times).
* ``max_output_tokens_per_s`` (vLLM's "Peak output token throughput"): the completed requests'
  token events (send + TTFT, then each ITL gap) counted in 1-second bins from the earliest
  send of a completed request; the fullest bin. A server that packs several tokens in one chunk
  shows one event for them, as in vLLM. None without token events (no completed request, or
  ``--no-stream``, where the client sees every token at once).
* Per-request lists, in request order over every planned request (with ``detailed``):
  ``input_lens`` (prompt tokens; 0 never sent), ``output_lens`` (0 unless completed),
  ``ttfts`` and ``e2els`` (seconds, as vLLM's lists; None unless completed), ``itls`` (lists
  of seconds), ``errors`` ("" when completed), ``error_kinds`` (ours).

Our extra keys: ``planned``, ``not_sent``, ``failures`` (count by kind: ``connection_refused``,
``http_<code>``, ``timeout``, ``malformed_stream``, ...), ``interrupted``, ``deadline_hit``,
``capped_at``, ``prompts_exact``, ``prompts`` (the tokenizer statement), ``inexact_prompts``,
``dataset_reused``, ``waited_for_slot``, ``refusal_probes``, ``usage_rejected`` (completed requests
whose server ``usage`` failed :mod:`.usage`'s checks, counted as failed ``bad_usage``) and
``usage_rejected_first`` (the first such request's reason, None when none).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..stats import summarize as summarize_values
from .config import LoadConfig
from .generator import LoadResult, RequestRecord
from .stats import is_good, slo_ns

METRIC_TITLES = {"ttft": ("TTFT", "Time to First Token"),
                 "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                 "itl": ("ITL", "Inter-token Latency"),
                 "e2el": ("E2EL", "End-to-end Latency")}


def p_word(p: float) -> str:
    """``99.0`` -> ``"99"``, ``99.9`` -> ``"99.9"`` (vLLM's key spelling)."""
    return str(int(p)) if int(p) == p else str(p)


def metric_samples_ns(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Samples in ns of each metric over the completed requests (ITL pooled)."""
    ok = [r for r in records if r.ok]
    return {"ttft": [r.ttft_ns for r in ok if r.ttft_ns is not None],
            "tpot": [r.tpot_ns for r in ok if r.tpot_ns is not None],
            "itl": [g for r in ok for g in r.itl_ns],
            "e2el": [r.e2e_ns for r in ok if r.e2e_ns is not None]}


def max_concurrent(records: Sequence[RequestRecord]) -> int:
    """The most requests in flight at one time (an end at the same ns as a send comes first)."""
    events = sorted([(r.send_ns, 1) for r in records if r.sent]
                    + [(r.end_ns, -1) for r in records if r.sent and r.end_ns is not None])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def peak_output_tokens_per_s(records: Sequence[RequestRecord]) -> float | None:
    """The most token events of completed requests in one 1-second bin (module docstring)."""
    ok = [r for r in records if r.ok and r.ttft_ns is not None and r.send_ns is not None]
    if not ok:
        return None
    first = min(r.send_ns for r in ok)
    times = np.concatenate([r.send_ns + r.ttft_ns + np.concatenate([[0], np.cumsum(r.itl_ns, dtype=np.int64)])
                            for r in ok])
    return float(np.bincount((times - first) // 1_000_000_000).max())


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _per_s(n: float, seconds: float) -> float | None:
    return n / seconds if seconds > 0 else None


def benchmark_result(result: LoadResult, percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
                     metric_percentiles: Sequence[float] = (99.0,), detailed: bool = False) -> dict:
    """The flat result dict (see the module docstring)."""
    cfg = result.config
    recs = result.records
    ok = [r for r in recs if r.ok]
    sent = sum(r.sent for r in recs)
    dur = result.elapsed_ns / 1e9
    tin = sum(r.prompt_tokens for r in ok)
    tout = sum(r.output_tokens for r in ok)
    good = sum(is_good(r, *slo_ns(cfg)) for r in recs) if cfg.goodput_ms else None
    rejected = [r for r in recs if r.error_kind == "bad_usage"]
    out: dict = {
        "duration": dur, "completed": len(ok), "failed": sent - len(ok), "not_sent": len(recs) - sent,
        "planned": len(recs), "total_input_tokens": tin, "total_output_tokens": tout,
        "request_throughput": _per_s(len(ok), dur),
        "request_goodput": _per_s(good, dur) if good is not None else None,
        "output_throughput": _per_s(tout, dur), "total_token_throughput": _per_s(tin + tout, dur),
        "max_output_tokens_per_s": peak_output_tokens_per_s(recs),
        "max_concurrent_requests": max_concurrent(recs),
    }
    samples = metric_samples_ns(recs)
    for m in percentile_metrics:
        sm = summarize_values(samples[m], metric_percentiles)
        out[f"mean_{m}_ms"] = _ms(sm.mean)
        out[f"median_{m}_ms"] = _ms(sm.median)
        out[f"std_{m}_ms"] = _ms(sm.std)
        for p in metric_percentiles:
            out[f"p{p_word(p)}_{m}_ms"] = _ms(sm.at(p))
    out.update({
        "failures": dict(sorted(Counter(r.failure_key for r in recs if r.failure_key is not None).items())),
        "interrupted": result.interrupted, "deadline_hit": result.deadline_hit, "capped_at": result.capped_at,
        "prompts_exact": result.prompts.exact if result.prompts is not None else None,
        "prompts": result.prompts.statement if result.prompts is not None else None,
        "inexact_prompts": result.inexact_prompts, "dataset_reused": result.dataset_reused,
        "waited_for_slot": result.waited_for_slot, "refusal_probes": result.refusal_probes,
        "goodput_slo_ms": dict(cfg.goodput_ms) or None,
        "usage_rejected": len(rejected), "usage_rejected_first": rejected[0].error if rejected else None,
    })
    if detailed:
        out["input_lens"] = [r.prompt_tokens for r in recs]
        out["output_lens"] = [r.output_tokens if r.ok else 0 for r in recs]
        out["ttfts"] = [r.ttft_ns / 1e9 if r.ok and r.ttft_ns is not None else None for r in recs]
        out["itls"] = [[g / 1e9 for g in r.itl_ns] if r.ok else [] for r in recs]
        out["e2els"] = [r.e2e_ns / 1e9 if r.ok and r.e2e_ns is not None else None for r in recs]
        out["errors"] = ["" if r.ok else (r.error or r.error_kind or "") for r in recs]
        out["error_kinds"] = [r.error_kind for r in recs]
    return out


def result_header(cfg: LoadConfig, *, date: str, label: str | None, metadata: dict[str, str]) -> dict:
    """The keys vLLM writes before the results: what was run."""
    return {"date": date, "backend": "openai-chat" if cfg.chat else "openai", "label": label,
            "model_id": cfg.model, "tokenizer_id": cfg.tokenizer or None, "base_url": cfg.url,
            "endpoint": cfg.path, "dataset_name": cfg.dataset, "dataset_path": cfg.dataset_path,
            "num_prompts": cfg.num_requests, "duration_limit_s": cfg.duration_s,
            "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
            "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency, "seed": cfg.seed,
            "ramp_up_strategy": cfg.ramp_up_strategy, "ramp_up_start_rps": cfg.ramp_up_start_rps,
            "ramp_up_end_rps": cfg.ramp_up_end_rps, "stream": cfg.stream, "sampling": cfg.sampling,
            "extra_body": dict(cfg.extra_body) or None, **metadata}


def default_result_filename(cfg: LoadConfig, label: str | None, date: str) -> str:
    """vLLM's name: ``<label or backend>-<rate>qps[-concurrency<N>]-<model>-<date>.json``."""
    rate = "inf" if math.isinf(cfg.request_rate) else str(float(cfg.request_rate))
    conc = f"-concurrency{cfg.max_concurrency}" if cfg.max_concurrency is not None else ""
    model = cfg.model.rstrip("/").split("/")[-1]
    return f"{label or 'tracestory'}-{rate}qps{conc}-{model}-{date}.json"


def _line(label: str, value, decimals: int = 2) -> str:
    if value is None:
        text = "n/a"
    elif isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    else:
        text = f"{value:.{decimals}f}"
    return f"{label:<40} {text:<10}".rstrip()


def result_lines(res: dict, cfg: LoadConfig, percentile_metrics: Sequence[str],
                 metric_percentiles: Sequence[float]) -> list[str]:
    """The block ``vllm bench serve`` prints, then our extra lines."""
    lines = [f"{' Serving Benchmark Result ':=^50}",
             _line("Successful requests:", res["completed"]),
             _line("Failed requests:", res["failed"])]
    if cfg.max_concurrency is not None:
        lines.append(_line("Maximum request concurrency:", cfg.max_concurrency))
    if not math.isinf(cfg.request_rate):
        lines.append(_line("Request rate configured (RPS):", float(cfg.request_rate)))
    lines += [_line("Benchmark duration (s):", res["duration"]),
              _line("Total input tokens:", res["total_input_tokens"]),
              _line("Total generated tokens:", res["total_output_tokens"]),
              _line("Request throughput (req/s):", res["request_throughput"])]
    if res["request_goodput"] is not None:
        lines.append(_line("Request goodput (req/s):", res["request_goodput"]))
    lines += [_line("Output token throughput (tok/s):", res["output_throughput"]),
              _line("Peak output token throughput (tok/s):", res["max_output_tokens_per_s"]),
              _line("Peak concurrent requests:", res["max_concurrent_requests"]),
              _line("Total Token throughput (tok/s):", res["total_token_throughput"])]
    for m in percentile_metrics:
        short, title = METRIC_TITLES[m]
        lines += [f"{title:-^50}", _line(f"Mean {short} (ms):", res[f"mean_{m}_ms"]),
                  _line(f"Median {short} (ms):", res[f"median_{m}_ms"])]
        lines += [_line(f"P{p_word(p)} {short} (ms):", res[f"p{p_word(p)}_{m}_ms"]) for p in metric_percentiles]
    lines.append("=" * 50)
    if cfg.ramp_up_strategy is not None:
        lines.append(f"Ramp-up: {cfg.ramp_up_strategy} from {cfg.ramp_up_start_rps:g} to {cfg.ramp_up_end_rps:g} "
                     "requests/s over the planned requests")
    if not cfg.stream:
        lines.append("Non-streaming requests (--no-stream): TTFT, TPOT, ITL and the peak output throughput are "
                     "not measured (each response arrives whole)")
    if res["not_sent"]:
        lines.append(f"Not sent: {res['not_sent']} of {res['planned']} planned requests (not counted as failed)")
    if res["failures"]:
        lines.append("Failures by kind: " + ", ".join(f"{k} {v}" for k, v in res["failures"].items()))
    if res.get("usage_rejected"):
        lines.append(f"Usage rejected: {res['usage_rejected']} completed requests reported a usage that is not a "
                     f"credible count, counted as failed (bad_usage); first: {res['usage_rejected_first']}")
    if res["capped_at"] is not None:
        lines.append(f"Planned requests capped at {res['capped_at']} (--max-requests)")
    if res["waited_for_slot"] and cfg.max_concurrency is None:
        lines.append(f"{res['waited_for_slot']} requests waited for one of the {cfg.max_in_flight} in-flight slots "
                     "(--max-in-flight) and were sent late")
    if res["refusal_probes"]:
        lines.append(f"Connection refused: sending paused with backoff ({res['refusal_probes']} probes)")
    if res["prompts"] and not res["prompts_exact"]:
        lines.append(f"Prompts: approximate lengths ({res['prompts']})")
    if res["inexact_prompts"]:
        lines.append(f"Prompts: {res['inexact_prompts']} could not be made exactly their planned length")
    if res["dataset_reused"]:
        lines.append("Prompts: the dataset had fewer usable pairs than requests; pairs were reused")
    if res["interrupted"]:
        lines.append("Interrupted (Ctrl-C): in-flight requests count as failed (cancelled), the rest as not sent")
    if res["deadline_hit"]:
        lines.append("Requests still in flight at duration + timeout were cancelled")
    return lines
