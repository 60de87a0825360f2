"""The Python stacks of a host step that stalls, written while it stalls (a diagnostic switch).

Serving runs on the lent 4-GPU machines show iterations held 10-30 ms on the host in clusters
about 1.5 s apart, on rank 0 and on the followers (docs/BENCHMARKS.md, "Serving under load"),
with the CPU idle: a thread blocked, not starved. The event log says which step (hand-out, the
next launch, its plan send) but not which call. With ``TRACESTORY_STALL_STACKS_MS=N`` each host
step of the engine (rank 0: an iteration's launch and its hand-out; a follower: its launch) arms
:func:`faulthandler.dump_traceback_later` for N ms and cancels it when the step ends. A step that
outlasts N ms has every Python thread's stack written by faulthandler's own C thread, which needs
no GIL: the engine thread's innermost frame is the call it is blocked in (a CUDA graph replay, a
gloo send, a file write), and a thread that holds the GIL shows as well. After the step a line
says which step it was and how long it took in all.

The stacks go to ``stall_stacks.<label>.txt`` (label ``rank0``, ``rank1``, ...) in
``TRACESTORY_STALL_STACKS_DIR`` (default: the working directory). Unset or 0: off, nothing armed.
The first armed step also writes ``stall_stacks.<label>.tid``: the process id and the watched
thread's native id, so that a sampler outside the process (``benchmarks/gpu/thread_watch.py``)
can read that thread's kernel state (running, or which system call it sleeps in) during a stall,
which a Python stack cannot show for a thread inside a C call. The line under a dump gives the
step's start on the monotonic clock (``CLOCK_MONOTONIC``, shared by the processes of a host).

Limits: one dump per step, of the moment N ms into it; native frames are not shown; faulthandler
has one timer per process, so a process has one watch (the engine thread's or the follower's).
Arming and cancelling cost a few microseconds a step.
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time

ENV = "TRACESTORY_STALL_STACKS_MS"
DIR_ENV = "TRACESTORY_STALL_STACKS_DIR"


class StackWatch:
    """Arm before a host step, :meth:`done` after it (module docstring); off when ``ms`` is None."""

    def __init__(self, ms: float | None, path: str | None = None):
        self.ms = ms if ms and ms > 0 else None
        self.path = path if self.ms else None
        self.dumps = 0  # steps that outlasted the limit
        self._fh = open(self.path, "a") if self.path else None  # noqa: SIM115 -- open while serving
        self._t0 = 0
        self._tid_written = False

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
        if not self._tid_written:
            self._tid_written = True
            with open(os.path.splitext(self.path)[0] + ".tid", "w") as f:
                f.write(f"{os.getpid()} {threading.get_native_id()}\n")
        self._t0 = time.monotonic_ns()
        faulthandler.dump_traceback_later(self.ms / 1e3, repeat=False, file=self._fh)

    def done(self, what: str) -> None:
        """End the step named ``what``; when it outlasted the limit, say so under its stacks."""
        if self._fh is None:
            return
        faulthandler.cancel_dump_traceback_later()
        ns = time.monotonic_ns() - self._t0
        if ns > self.ms * 1e6:
            self.dumps += 1
            # faulthandler wrote to the descriptor directly: write this line the same way
            os.write(self._fh.fileno(), f"^ {what}: {ns / 1e6:.1f} ms (stacks taken at {self.ms:g} ms; "
                                           f"started at monotonic {self._t0} ns)\n\n".encode())

    def close(self) -> None:
        if self._fh is not None:
            faulthandler.cancel_dump_traceback_later()
            self._fh.close()
            self._fh = None
