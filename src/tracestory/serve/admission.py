"""Load shedding at the HTTP door: how many requests and how many body bytes are let in.

Model (event-loop thread only, no locks):

* **requests**: a request is *admitted* from the moment it is handed to the engine until it
  finishes. At most ``max_num_seqs + max_waiting`` are admitted at once (the engine runs up to
  ``max_num_seqs``; the rest wait in its queue). One more is refused with HTTP 429 and
  ``Retry-After`` at once, instead of queueing without bound until clients time out; while the
  server shuts down, requests get 503.
* **body bytes**: a body larger than ``max_request_bytes`` is refused with 413 before it is
  read; a body that would bring the bytes being read and parsed over ``max_inflight_bytes`` gets
  503 with ``Retry-After``. A body without ``Content-Length`` (chunked) reserves the whole
  ``max_request_bytes``. The reservation ends when the body is parsed.

Every refusal is counted by reason (``queue_full``, ``shutting_down``, ``body_too_large``,
``bytes_in_flight``, ``bad_request``, ``unknown_model``, ``timeout``, ``stalled`` (a new request
refused, or a waiting one cancelled, while the engine is stalled), ``connection_limit``,
``connection_evicted``, ``head_timeout``) in :attr:`Admission.refused` and, when given, in the
``tracestory:requests_refused_total`` metric.

Limits: the admitted count is the HTTP side's; it does not look at the KV cache, so a request
may be admitted and then wait for blocks (the per-request deadline bounds that wait).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

RETRY_AFTER_S = 1


@dataclass
class Admission:
    max_admitted: int
    max_request_bytes: int
    max_inflight_bytes: int
    metrics: object | None = None          # ServerMetrics (its ``refused`` counter), or None
    admitted: int = 0
    inflight_bytes: int = 0
    refused: Counter = field(default_factory=Counter)

    def __post_init__(self):
        for name in ("max_admitted", "max_request_bytes", "max_inflight_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Admission.{name} must be >= 1, got {getattr(self, name)}")

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1
        if self.metrics is not None:
            self.metrics.refuse(reason)

    # ---------------------------------------------------------------- bodies
    def reserve_body(self, content_length: int | None) -> tuple[int, int | None, str | None]:
        """``(bytes reserved, HTTP status, message)``: status None when the body may be read."""
        n = self.max_request_bytes if content_length is None else content_length
        if content_length is not None and content_length > self.max_request_bytes:
            self.refuse("body_too_large")
            return 0, 413, (f"the request body has {content_length} bytes, more than the limit of "
                            f"{self.max_request_bytes}")
        if self.inflight_bytes + n > self.max_inflight_bytes:
            self.refuse("bytes_in_flight")
            return 0, 503, (f"{self.inflight_bytes} request bytes are being read, {n} more would pass the limit of "
                            f"{self.max_inflight_bytes}; retry later")
        self.inflight_bytes += n
        return n, None, None

    def release_body(self, n: int) -> None:
        self.inflight_bytes -= n

    # ---------------------------------------------------------------- requests
    def try_admit(self) -> bool:
        if self.admitted >= self.max_admitted:
            self.refuse("queue_full")
            return False
        self.admitted += 1
        return True

    def done(self) -> None:
        self.admitted -= 1
