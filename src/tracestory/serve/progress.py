"""Is the engine thread making progress? The stall watch behind ``/health`` (:mod:`.server`).

Model: the engine thread calls :meth:`Progress.beat` at every turn of its loop and says what it
does next (:meth:`Progress.doing`: scheduling, launching iteration N, waiting for iteration N's
tokens, writing its log line). An idle engine turns its loop at least every 50 ms (it waits for
work with that timeout), so a loop turn longer than ``timeout_s`` means one step of work has
not returned: a model forward or a collective that waits for a peer. Under tensor parallelism
rank 0's forward holds an all-reduce with every other rank, so a rank that is stopped
(SIGSTOP, a debugger, a hung GPU) or dead but not yet noticed holds rank 0 there; on the CPU
(gloo) for the 300 s collective timeout, on CUDA (NCCL) possibly for ever. :meth:`stalled` turns
that into one line naming the step, the seconds and, with ``tensor_parallel`` above 1, the
likely cause; ``/health`` answers 503 with it, new requests get 503 and requests waiting for
tokens are cancelled with it (:mod:`.server`), instead of hanging.

Limits: only a step that has *started* is watched, so a stopped rank is noticed once work
arrives (while idle rank 0's heartbeats to it are small sends that the socket buffers; a dead
rank is noticed by the heartbeat, :mod:`.tensor_parallel`). A legitimate step longer than
``timeout_s`` (a huge prefill chunk on a slow CPU) reads as a stall while it runs: the timeout
(``--stall-timeout``, 60 s by default) must exceed the longest iteration. Nothing here stops or
restarts the engine: when the step returns, the stall ends and ``/health`` is 200 again.
"""

from __future__ import annotations

import time


class Progress:
    """Written by the engine thread, read by the HTTP thread (plain attribute stores are atomic
    in CPython; a reader may see a beat one step old, which only shifts the answer by one step)."""

    def __init__(self, tensor_parallel: int = 1, clock=time.monotonic):
        self.tensor_parallel = tensor_parallel
        self._clock = clock
        self._beat = clock()
        self._doing = "starting"

    def beat(self) -> None:
        """A turn of the engine loop began (work may follow)."""
        self._beat = self._clock()
        self._doing = "idle"

    def doing(self, what: str) -> None:
        """The step the engine thread enters now (words for the stall line)."""
        self._doing = what

    def quiet_s(self) -> float:
        """Seconds since the last turn of the loop began."""
        return self._clock() - self._beat

    def stalled(self, timeout_s: float) -> str | None:
        """One line when the current turn has run longer than ``timeout_s``, else None."""
        quiet = self.quiet_s()
        if quiet <= timeout_s:
            return None
        line = f"engine stalled: no progress for {quiet:.1f} s (over --stall-timeout {timeout_s:g} s) {self._doing}"
        if self.tensor_parallel > 1:
            line += (f"; tensor parallel {self.tensor_parallel}: rank 0 waits in a collective step for another "
                     "rank, which may be stopped or dead")
        return line
