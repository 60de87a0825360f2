"""How long a serving engine's loop turn can be held up by the GIL and by Python's GC (CPU only).

Model of ``tracestory serve``: one *engine* thread loops on short waits that release the GIL
(``threading.Event.wait(WAIT_S)``, standing in for waiting on a CUDA event or the inbox) and
times each turn; one *HTTP* thread does pure-Python work in bursts (``json.dumps`` of streamed
token chunks for ``--burst-ms``, then ``--idle-ms`` asleep, like an event loop writing SSE
chunks). When the engine's wait ends while the HTTP thread holds the GIL, the engine waits for
it: CPython makes the holder drop the GIL only after ``sys.getswitchinterval()`` of asking. A
turn's excess over ``WAIT_S`` is that hand-off (plus OS scheduling).

Part 1 (``handoff``): p50 / p99 / max of the engine's turn at switch intervals 5 ms (CPython's
default), 1 ms and 0.5 ms, and the HTTP thread's chunks per second (its cost of more hand-offs).

Part 2 (``gc``): the same engine loop alone with a heap of ``--objects`` container objects
(dicts in lists, all tracked by the collector) alive, as a model's start-up leaves behind;
each turn leaves a few small reference cycles behind, so the collector runs on its own (young
generations; a full collection on its own needs survivors worth 25% of the heap, which a few
seconds do not make). Measured:
the longest turn and the longest collection (``gc.callbacks``) over ``--seconds``, and one
``gc.collect()`` (a full collection, what the collector does on its own when enough objects
have survived) timed, without and with ``gc.freeze()`` after the heap was built.

Limits: one process, two threads; times are wall times on a machine that may be shared (the
numbers say how large the effects are, not a precise latency); the HTTP burst is a stand-in
for aiohttp's work, not aiohttp itself.

Usage: python3 benchmarks/gil_handoff.py [--seconds 3] [--objects 1500000] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import threading
import time

WAIT_S = 0.0002


def _pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] / 1e6 if s else float("nan")


def _engine(stop: threading.Event, seconds: float, turns: list[int], churn: int = 0) -> None:
    ev = threading.Event()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter_ns()
        ev.wait(WAIT_S)
        for _ in range(churn):  # cyclic garbage: only the collector frees it
            d: dict = {}
            d["self"] = d
        turns.append(time.perf_counter_ns() - t)
    stop.set()


def _http(stop: threading.Event, burst_ms: float, idle_ms: float, sent: list[int]) -> None:
    chunk = {
        "id": "cmpl-0",
        "object": "text_completion",
        "choices": [{"index": 0, "text": " token", "logprobs": None, "finish_reason": None}],
    }
    while not stop.is_set():
        end = time.perf_counter() + burst_ms / 1e3
        while time.perf_counter() < end:
            json.dumps(chunk)
            sent[0] += 1
        time.sleep(idle_ms / 1e3)


def handoff(seconds: float, burst_ms: float, idle_ms: float) -> list[dict]:
    out = []
    saved = sys.getswitchinterval()
    try:
        for interval in (0.005, 0.001, 0.0005):
            sys.setswitchinterval(interval)
            stop, turns, sent = threading.Event(), [], [0]
            h = threading.Thread(target=_http, args=(stop, burst_ms, idle_ms, sent))
            h.start()
            _engine(stop, seconds, turns)
            h.join()
            out.append(
                {
                    "switch_interval_ms": interval * 1e3,
                    "turns": len(turns),
                    "turn_p50_ms": _pct(turns, 0.5),
                    "turn_p99_ms": _pct(turns, 0.99),
                    "turn_max_ms": max(turns) / 1e6,
                    "http_chunks_per_s": round(sent[0] / seconds),
                }
            )
        # the engine alone: the floor of a turn
        stop, turns = threading.Event(), []
        _engine(stop, seconds, turns)
        out.append(
            {
                "switch_interval_ms": saved * 1e3,
                "http_thread": False,
                "turns": len(turns),
                "turn_p50_ms": _pct(turns, 0.5),
                "turn_p99_ms": _pct(turns, 0.99),
                "turn_max_ms": max(turns) / 1e6,
            }
        )
    finally:
        sys.setswitchinterval(saved)
    return out


def gc_pauses(seconds: float, objects: int) -> list[dict]:
    out = []
    for frozen in (False, True):
        heap = [{"k": i} for i in range(objects)]  # ~objects dicts + their list, all tracked
        gc.collect()
        if frozen:
            gc.freeze()
        pauses: list[tuple[int, int]] = []
        started: list[int] = [0]

        def cb(phase: str, info: dict, pauses=pauses, started=started) -> None:
            if phase == "start":
                started[0] = time.perf_counter_ns()
            else:
                pauses.append((info["generation"], time.perf_counter_ns() - started[0]))

        gc.callbacks.append(cb)
        try:
            stop, turns = threading.Event(), []
            _engine(stop, seconds, turns, churn=50)
            t = time.perf_counter_ns()
            gc.collect()
            full_ms = (time.perf_counter_ns() - t) / 1e6
        finally:
            gc.callbacks.remove(cb)
            if frozen:
                gc.unfreeze()
        by_gen = {g: [d for gg, d in pauses if gg == g] for g in (0, 1, 2)}
        out.append(
            {
                "frozen": frozen,
                "heap_objects": objects,
                "turns": len(turns),
                "turn_p50_ms": _pct(turns, 0.5),
                "turn_max_ms": max(turns) / 1e6,
                "collections": {str(g): len(v) for g, v in by_gen.items()},
                "longest_collection_ms": {str(g): (max(v) / 1e6 if v else None) for g, v in by_gen.items()},
                "explicit_full_collection_ms": full_ms,
            }
        )
        del heap
        gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--burst-ms", type=float, default=8.0)
    ap.add_argument("--idle-ms", type=float, default=2.0)
    ap.add_argument("--objects", type=int, default=1_500_000)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg": os.getloadavg(),
        },
        "wait_ms": WAIT_S * 1e3,
        "burst_ms": a.burst_ms,
        "idle_ms": a.idle_ms,
        "handoff": handoff(a.seconds, a.burst_ms, a.idle_ms),
        "gc": gc_pauses(a.seconds, a.objects),
    }
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
