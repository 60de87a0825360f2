"""The Python stacks of a host step that stalls, written while it stalls (a diagnostic switch).

Serving runs on the lent 4-GPU machines show iterations held 10-30 ms on the host, on rank 0 and
on the followers (docs/BENCHMARKS.md, "Serving under load"), with the CPU idle. The event log
says which step (hand-out, the next launch, its plan send) but not which call. With
``TRACESTORY_STALL_STACKS_MS=N`` each host step of the engine (rank 0: an iteration's launch and
its hand-out; a follower: its launch) is watched: a watcher thread wakes every N/2 ms, and when
the step in progress has run N ms it writes every Python thread's stack
(:func:`sys._current_frames`, a consistent snapshot taken under the GIL). The engine thread's
innermost frame is the call it is in (a CUDA graph replay, a gloo broadcast, numpy). After the
step a line says which step it was, how long it took in all and when the stacks were taken.

*When* the stacks were taken is itself a measurement: the watcher needs the GIL, so stacks taken
much later than N ms mean some thread held the GIL through the stall (the dump then shows the
moment it was let go), while stacks taken on time mean the engine thread was waiting with the
GIL released (in a C call, or descheduled).

The stacks go to ``stall_stacks.<label>.txt`` (label ``rank0``, ``rank1``, ...) in
``TRACESTORY_STALL_STACKS_DIR`` (default: the working directory). Unset or 0: off, no thread.
The first watched step also writes ``stall_stacks.<label>.tid``: the process id and the watched
thread's native id, so that a sampler outside the process (``benchmarks/gpu/thread_watch.py``)
can read that thread's kernel state (running, or which system call it sleeps in) during a stall,
which a Python stack cannot show. The line under a dump gives the step's start on the monotonic
clock (``CLOCK_MONOTONIC``, shared by the processes of a host).

Why not :func:`faulthandler.dump_traceback_later` (the first version): it walks the other
threads' frames without the GIL, and a dump that fired as the step ended crashed rank 0 with
SIGSEGV mid-dump (session 14, a 4-GPU serving run).

Limits: one dump per step; native frames are not shown; one watched thread per process. Cost
when on: the watcher takes the GIL 2000/N times a second (about 250/s at N = 8) for a few
microseconds; arming and ending a step are two attribute writes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

ENV = "TRACESTORY_STALL_STACKS_MS"
DIR_ENV = "TRACESTORY_STALL_STACKS_DIR"


class StackWatch:
    """Arm before a host step, :meth:`done` after it (module docstring); off when ``ms`` is None."""

    def __init__(self, ms: float | None, path: str | None = None):
        self.ms = ms if ms and ms > 0 else None
        self.path = path if self.ms else None
        self.dumps = 0  # steps that outlasted the limit
        self._fh = open(self.path, "a") if self.path else None  # noqa: SIM115 -- open while serving
        self._lock = threading.Lock()
        self._t0 = 0              # monotonic ns of the step in progress; 0 between steps
        self._taken_ms = None     # when this step's stacks were taken (ms into it), or None
        self._tid = None          # the watched thread's ident (the first thread to arm)
        self._closed = threading.Event()
        self._watcher = None
        if self._fh is not None:
            self._watcher = threading.Thread(target=self._watch, name="tracestory-stackwatch", daemon=True)
            self._watcher.start()

    @classmethod
    def from_env(cls, label: str) -> StackWatch:
        try:
            ms = float(os.environ.get(ENV, "0") or 0)
        except ValueError:
            ms = 0.0
        if ms <= 0:
            return cls(None)
        folder = os.environ.get(DIR_ENV) or os.getcwd()
        return cls(ms, os.path.join(folder, f"stall_stacks.{label}.txt"))

    def arm(self) -> None:
        if self._fh is None:
            return
        if self._tid is None:
            self._tid = threading.get_ident()
            with open(os.path.splitext(self.path)[0] + ".tid", "w") as f:
                f.write(f"{os.getpid()} {threading.get_native_id()}\n")
        self._taken_ms = None
        self._t0 = time.monotonic_ns()

    def done(self, what: str) -> None:
        """End the step named ``what``; when it outlasted the limit, say so under its stacks."""
        if self._fh is None:
            return
        t0, self._t0 = self._t0, 0
        ns = time.monotonic_ns() - t0
        with self._lock:
            if self._taken_ms is not None:
                self.dumps += 1
                self._fh.write(f"^ {what}: {ns / 1e6:.1f} ms (stacks taken at {self._taken_ms:.1f} ms, "
                               f"asked for at {self.ms:g} ms; started at monotonic {t0} ns)\n\n")
                self._fh.flush()
            self._taken_ms = None

    def _watch(self) -> None:
        period = self.ms / 2e3
        while not self._closed.wait(period):
            t0 = self._t0
            if not t0 or self._taken_ms is not None:
                continue
            late = (time.monotonic_ns() - t0) / 1e6
            if late < self.ms:
                continue
            frames = sys._current_frames()
            names = {t.ident: t.name for t in threading.enumerate()}
            with self._lock:
                if self._t0 != t0:        # the step ended while the frames were read
                    continue
                self._taken_ms = late
                for ident, frame in frames.items():
                    if ident == threading.get_ident():
                        continue
                    mark = " (the watched step)" if ident == self._tid else ""
                    self._fh.write(f"Thread {names.get(ident, ident)}{mark}:\n")
                    self._fh.write("".join(traceback.format_stack(frame)))
                    self._fh.write("\n")
                self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._closed.set()
            if self._watcher is not None:
                self._watcher.join(timeout=1)
            with self._lock:
                self._fh.close()
                self._fh = None
