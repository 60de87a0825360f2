"""Python's cyclic garbage collector, seen from the engine: time per iteration, and the freeze.

Why: a collection of the oldest generation walks every object the process tracks; after
``import torch`` and a model's start-up that is hundreds of thousands to millions of objects,
tens of ms during which every thread of the process waits (the collector holds the GIL). The
engine thread then launches nothing, and at tensor parallelism every rank waits for this one in
the next collective. The event log's times alone cannot tell such a pause from a slow forward.

:class:`GcClock` (one per engine) hangs a callback on :data:`gc.callbacks`: at each
collection's ``start`` and ``stop`` it reads the engine's clock (the event log's ``now_ns``) and
keeps ``(end, duration, generation)``. The engine asks :meth:`GcClock.take` at each iteration's
end for the collections that ended in ``[t_start, t_end]``: ``gc_ns`` (their summed wall time),
``gc_passes`` (how many) and ``gc_generation`` (the oldest generation collected, 2 = full).
Collections run on any thread (the HTTP thread's allocations trigger them too); all count, since
each one stops the whole process. A collection that straddles two iterations is charged whole to
the one it ends in (its time before that iteration's start included), so ``gc_ns`` can exceed
the iteration's wall time by that part; the engine's own timestamps are taken on the engine
thread, which cannot run while a collection holds the GIL, so a straddle needs a finalizer that
releases the GIL mid-collection and is rare. Collections that end between iterations (the engine
idle) are charged to none. Limits: the callback costs about a microsecond per collection (young
generations are collected hundreds of times a second under load); the time is wall time, so a
collection preempted by the OS counts in full; a rank > 0 of a tensor-parallel server writes no
event log, so its collections show per iteration only as device time of rank 0's forward
(waiting in the all-reduce); it says their count and longest at its end (:meth:`GcClock.summary`,
one stderr line).

:func:`freeze_heap`: once start-up is done (model built, compiled, graphs captured) a
``gc.collect()`` frees what start-up left behind, then ``gc.freeze()`` moves every surviving
object to the permanent generation, which no later collection walks: a full collection then
walks only what serving allocated since. The collector stays on (cycles made while serving are
still found); the frozen objects are never freed by the collector, which is what start-up state
(weights, graphs, modules) needs anyway.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable

KEEP = 4096  # collections remembered between two takes (an idle engine takes none)


class GcClock:
    """Collections of this process, timed on ``clock`` (ns); :meth:`install` to start."""

    def __init__(self, clock: Callable[[], int]):
        self._clock = clock
        self._started: tuple[int, int] | None = None  # (t, generation) of a collection under way
        self._done: deque[tuple[int, int, int]] = deque(maxlen=KEEP)  # (t_end, ns, generation)
        self._on = False
        self.totals: dict[int, list[int]] = {}  # generation -> [collections, ns, longest ns] since install

    def _callback(self, phase: str, info: dict) -> None:
        t = self._clock()
        if phase == "start":
            self._started = (t, int(info.get("generation", 0)))
        elif self._started is not None:
            t0, gen = self._started
            self._started = None
            self._done.append((t, t - t0, gen))
            tot = self.totals.setdefault(gen, [0, 0, 0])
            tot[0] += 1
            tot[1] += t - t0
            tot[2] = max(tot[2], t - t0)

    def install(self) -> None:
        if not self._on:
            gc.callbacks.append(self._callback)
            self._on = True

    def remove(self) -> None:
        if self._on:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._on = False

    def take(self, t_start: int, t_end: int) -> dict[str, int]:
        """The collections that ended in ``[t_start, t_end]`` (those that ended earlier are
        dropped, later ones kept for the next take): ``gc_ns``, ``gc_passes`` and, when there
        was one, ``gc_generation``; ``{}`` when not installed (not measured)."""
        if not self._on:
            return {}
        ns = passes = 0
        gen = -1
        done = self._done
        while done and done[0][0] <= t_end:
            end, d, g = done.popleft()
            if end < t_start:
                continue
            ns += d
            passes += 1
            gen = max(gen, g)
        out = {"gc_ns": ns, "gc_passes": passes}
        if passes:
            out["gc_generation"] = gen
        return out

    def summary(self) -> str:
        """One line: collections per generation since :meth:`install`, their time and the longest
        (a rank > 0 of a tensor-parallel server says it at its end: it writes no event log)."""
        if not self.totals:
            return "Python GC: no collection"
        parts = [
            f"generation {g}: {n} ({ns / 1e6:.1f} ms, longest {mx / 1e6:.2f} ms)"
            for g, (n, ns, mx) in sorted(self.totals.items())
        ]
        return "Python GC: " + "; ".join(parts)


def freeze_heap() -> dict[str, int]:
    """``gc.collect()`` then ``gc.freeze()`` (module docstring); returns what to log:
    ``gc_frozen_objects`` (objects in the permanent generation now) and ``gc_freeze_ms`` (the
    collection's and freeze's time)."""
    import time

    t = time.perf_counter()
    gc.collect()
    gc.freeze()
    return {"gc_frozen_objects": gc.get_freeze_count(), "gc_freeze_ms": round((time.perf_counter() - t) * 1e3, 1)}
