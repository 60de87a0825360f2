"""Prometheus metrics of the server (``GET /metrics``), named in vLLM's style.

Metrics (all labelled ``model_name``, the first served model name):

* ``tracestory:num_requests_running`` / ``tracestory:num_requests_waiting`` (gauges): requests in
  the scheduler's running and waiting queues after the last iteration;
* ``tracestory:kv_cache_usage_perc`` (gauge, 0..1): KV blocks in use over all blocks after the
  last iteration;
* ``tracestory:prompt_tokens_total`` (counter): the prompt length of each request, counted once
  when its first output token is sampled (recomputation after a preemption is not counted
  again; a request that never produced a token is not counted);
* ``tracestory:generation_tokens_total`` (counter): output tokens sampled;
* ``tracestory:num_preemptions_total`` (counter): ``preempt`` decisions of the scheduler;
* ``tracestory:iteration_time_seconds`` (histogram): one sample per engine iteration, from
  before scheduling to after the sampled tokens are recorded (the ``t_end_ns - t_start_ns`` of
  the event log's ``iteration`` line);
* ``tracestory:requests_refused_total`` (counter, also labelled ``reason``): requests and
  connections the server turned away (:mod:`.admission` lists the reasons);
* ``tracestory:event_log_lines_lost_total`` (counter): event-log lines not written because a
  write failed (full disk; :mod:`.eventlog`), counted from the failed line on.

``prometheus-client`` is an optional dependency (the ``serve`` extra), imported when a server
is built; without it :func:`make_metrics` returns ``None``, the engine records nothing and
``/metrics`` answers 501 with the install hint. Each server has its own registry, so several
servers can run in one process.
"""

from __future__ import annotations

from collections.abc import Iterable

ITERATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MISSING_HINT = "prometheus-client is not installed: pip install 'tracestory[serve]' for /metrics"


class ServerMetrics:
    """The metrics of one server in their own :class:`prometheus_client.CollectorRegistry`."""

    def __init__(self, model_name: str):
        import prometheus_client as pc

        self._pc = pc
        self.registry = pc.CollectorRegistry()
        labels = ["model_name"]

        def gauge(name, doc):
            return pc.Gauge(name, doc, labels, registry=self.registry).labels(model_name)

        def counter(name, doc):
            return pc.Counter(name, doc, labels, registry=self.registry).labels(model_name)

        self.running = gauge("tracestory:num_requests_running", "Requests in the running queue.")
        self.waiting = gauge("tracestory:num_requests_waiting", "Requests in the waiting queue.")
        self.kv_usage = gauge("tracestory:kv_cache_usage_perc", "KV-cache blocks in use, 0 to 1.")
        self.prompt_tokens = counter("tracestory:prompt_tokens", "Prompt tokens of requests that produced a token.")
        self.generation_tokens = counter("tracestory:generation_tokens", "Output tokens sampled.")
        self.preemptions = counter("tracestory:num_preemptions", "Requests preempted (recompute).")
        self.iteration_time = pc.Histogram("tracestory:iteration_time_seconds", "Engine iteration time.", labels,
                                           buckets=ITERATION_BUCKETS_S, registry=self.registry).labels(model_name)
        self.event_log_lines_lost = counter("tracestory:event_log_lines_lost",
                                            "Event-log lines not written after a failed write.")
        self._model_name = model_name
        self.refused = pc.Counter("tracestory:requests_refused", "Requests and connections turned away.",
                                  ["model_name", "reason"], registry=self.registry)

    def refuse(self, reason: str) -> None:
        """Count one refusal (event-loop thread)."""
        self.refused.labels(self._model_name, reason).inc()

    def observe_iteration(self, *, seconds: float, new_tokens: int, first_prompt_tokens: Iterable[int],
                          preemptions: int, running: int, waiting: int, kv_in_use: int, kv_total: int) -> None:
        """Record one engine iteration (called on the engine thread)."""
        self.iteration_time.observe(seconds)
        self.generation_tokens.inc(new_tokens)
        self.prompt_tokens.inc(sum(first_prompt_tokens))
        self.preemptions.inc(preemptions)
        self.set_queues(running, waiting, kv_in_use, kv_total)

    def set_queues(self, running: int, waiting: int, kv_in_use: int, kv_total: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_in_use / kv_total if kv_total else 0.0)

    def exposition(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the text exposition format."""
        return self._pc.generate_latest(self.registry), self._pc.CONTENT_TYPE_LATEST


def make_metrics(model_name: str) -> ServerMetrics | None:
    """:class:`ServerMetrics`, or None when prometheus-client is not installed."""
    try:
        return ServerMetrics(model_name)
    except ImportError:
        return None
