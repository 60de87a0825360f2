"""Backoff on connection refused (docs of tracestory.loadgen.backoff): after a refusal one probe at
a time, waits of 0.05, 0.1, 0.2, ... s (doubling, at most 2 s); the first answered probe ends it.
Expected counts come from that schedule written out here."""

from __future__ import annotations

import socket
import threading
import time

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)

from tracestory.loadgen import LoadConfig, run_load, summarize


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_closed_port_with_four_in_flight_sends_a_handful_not_thousands():
    port = closed_port()
    t0 = time.monotonic()
    result = run_load(LoadConfig(url=f"http://127.0.0.1:{port}", model="m", max_concurrency=4, duration_s=3.0,
                                 prompt_len_min=4, prompt_len_max=4, max_new_tokens=2, timeout_s=2))
    assert time.monotonic() - t0 < 3 + 2 + 1
    s = summarize(result)
    # 4 refused at once, then probes after 0.05, 0.15, 0.35, 0.75, 1.55 s (cumulative waits);
    # the next would be at 3.15 s, after the 3 s window
    assert 4 + 3 <= s.sent <= 4 + 5, s.sent
    assert s.failures == {"connection_refused": s.sent} and s.ok == 0 and s.not_sent == 0
    assert result.refusal_probes == s.sent - 4


def test_first_answered_probe_ends_the_backoff(stub_server):
    port = closed_port()
    stub = Stub()
    timer = threading.Timer(0.3, lambda: stub_server(stub, port))   # the server comes up at 0.3 s
    timer.start()
    try:
        result = run_load(LoadConfig(url=f"http://127.0.0.1:{port}", model="m", max_concurrency=2, num_requests=20,
                                     prompt_len_min=4, prompt_len_max=4, max_new_tokens=2, timeout_s=5))
    finally:
        timer.join()
    by_send = sorted(result.records, key=lambda r: r.send_ns)
    kinds = [r.error_kind for r in by_send]
    refused = kinds.count("connection_refused")
    # 2 refused at once, probes at 0.05 and 0.15 s refused, the one at 0.35 s answered (the server
    # is up at 0.3 s; thread start-up may let one more probe be refused), then no more refusals
    assert kinds == ["connection_refused"] * refused + [None] * (20 - refused)
    assert 2 + 2 <= refused <= 2 + 3
    assert stub.n == 20 - refused and summarize(result).ok == 20 - refused
