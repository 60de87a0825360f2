"""The scheduler event log: one JSON object per line (format version 1).

Line types (``type``): ``meta`` (first line), ``arrival``, ``iteration``, ``first_token``,
``finish``; the fields are those of the documented format (the serve event-log format shared
with the batch story reader). Times are integer ns on the monotonic clock since ``t0`` (taken
when the log is opened); ``meta.t0_unix_ns`` is the wall-clock time of ``t0`` and
``meta.t0_mono_ns`` its value on ``CLOCK_MONOTONIC`` itself (to set the log beside other
processes of the host, e.g. ``benchmarks/gpu/thread_watch.py``).

Keys this writer adds to the format (readers ignore unknown keys): meta ``preset``, ``layers``,
``vocab``, ``dtype``, ``capacity_tokens``, ``attention_backend``, ``overlap``, ``fp8``,
``startup`` (compile and graph-capture seconds, ``gc_frozen_objects``), ``tensor_parallel`` (when above 1); iteration
``prefill_tokens``, ``decode_tokens``, ``schedule_ns`` (the scheduler's share of the
iteration), ``forward_ns`` (the model step, from launch to the sampled ids on the host),
``launch_ns`` (the host time of the launch), ``gc_ns``/``gc_passes``/``gc_generation``
(Python garbage collections that ended in the iteration, :mod:`.gcwatch`), ``gpu_ns`` (CUDA:
device time of the launched work, :class:`.model.Launch`), the engine's host steps
``result_wait_ns``, ``drain_ns``, ``handout_before_ns`` and the launch's parts ``plan_send_ns``,
``input_wait_ns``, ``replay_ns`` (:mod:`.engine` says what each covers) and per member ``blocks`` (blocks the request holds after the iteration; 0 when it finished in
it); arrival ``ignore_eos``. A key that was not measured is left out (never 0): ``memory`` is
written only on CUDA.

Iteration times: ``t_end_ns`` is when the iteration's sampled ids reached the host and were
recorded, ``t_start_ns`` the later of its scheduling start and the previous iteration's end
(with overlapped scheduling, iteration N+1 is scheduled while N runs), so iterations tile the
timeline and ``t_end - t_start`` is the iteration's share of it (the engine's docstring).

Order: lines are written when known, so an ``arrival`` line can carry a ``t_ns`` earlier than
the end of the iteration line before it (the request arrived while that iteration ran); the
``first_token`` and ``finish`` lines of an iteration follow its ``iteration`` line. Readers that
need time order sort by time.

The file is line-buffered and flushed after every iteration; writes are serialized by a lock
(the HTTP thread logs arrivals and failures, the engine thread logs iterations).

A failed write (full disk, a file-size limit, an I/O error): the ``meta`` line is written and
flushed when the log is opened, so a path that cannot take a line is refused at start-up (one
:class:`~tracestory.errors.UsageError` line). Later, the first write that raises ``OSError``
ends the log: one line on stderr (:attr:`EventLog.failure`), the file is closed and cut back
to its last complete line (a write that failed part-way leaves no half line, so the log stays
readable; where the cut itself fails, e.g. on a device, the file is left as it is), every later
line is counted in
:attr:`EventLog.lines_lost` (and passed to :attr:`EventLog.on_lost`, the server's
``/metrics`` counter) and dropped; the caller (the engine thread, an HTTP handler) never sees
the error, so the server keeps serving. Lines lost are counted from the failed one on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError
from .scheduler import Finish, Plan, StepResult

VERSION = 1


class EventLog:
    """Writer of the JSONL event log; ``path=None`` gives a log that records nothing but still
    keeps the clock (so callers need no special case)."""

    def __init__(self, path: str | Path | None, meta: dict):
        self.t0 = time.monotonic_ns()
        t0_unix = time.time_ns()
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._fh = None
        self.failure: str | None = None       # the one line said when a write failed
        self.lines_lost = 0                   # lines not written since then
        self.on_lost: Callable[[int], None] | None = None    # called with each count of lines lost
        self._good = 0                        # bytes of complete lines in the file (ASCII JSON)
        if self.path is not None:
            try:
                self._fh = open(self.path, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 -- open until close()
                line = json.dumps({"type": "meta", "version": VERSION, "engine": "tracestory-serve", **meta,
                                   "t0_unix_ns": t0_unix, "t0_mono_ns": self.t0}, separators=(",", ":")) + "\n"
                self._fh.write(line)
                self._fh.flush()
                self._good = len(line)
            except OSError as e:
                if self._fh is not None:
                    _close_quietly(self._fh)
                    self._fh = None
                raise UsageError(f"{self.path}: expected a writable event-log path, found {e.strerror or e}") from None

    def now_ns(self) -> int:
        """ns since ``t0`` on the log's clock."""
        return time.monotonic_ns() - self.t0

    def _write(self, obj: dict, flush: bool = False) -> None:
        if self._fh is None and self.failure is None:     # no path, or closed: nothing to write or count
            return
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self._lock:
            if self._fh is None:
                if self.failure is not None:
                    self._lost(1)
                return
            try:
                self._fh.write(line)          # line-buffered: on the way to the kernel now
                if flush:
                    self._fh.flush()
                self._good += len(line)
            except OSError as e:
                self._failed(e)
                self._lost(1)

    def _failed(self, e: OSError) -> None:
        """The first failed write (lock held): say it once, close the file, write no more."""
        fh, self._fh = self._fh, None
        if fh is not None:
            _close_quietly(fh)
            try:
                os.truncate(self.path, self._good)     # no half line left behind
            except (OSError, TypeError):
                pass
        if self.failure is None:
            self.failure = (f"{self.path}: event-log write failed ({e.strerror or e}); the log stops here, "
                            "the server keeps serving")
            print(f"tracestory serve: {self.failure}", file=sys.stderr, flush=True)

    def _lost(self, n: int) -> None:
        """Count lines not written (lock held)."""
        self.lines_lost += n
        if self.on_lost is not None:
            self.on_lost(n)

    # ------------------------------------------------------------------ events
    def arrival(self, t_ns: int, request_id: str, prompt_tokens: int, max_new_tokens: int,
                ignore_eos: bool = False) -> None:
        self._write({"type": "arrival", "t_ns": int(t_ns), "request_id": request_id,
                     "prompt_tokens": int(prompt_tokens), "max_new_tokens": int(max_new_tokens),
                     "ignore_eos": bool(ignore_eos)})

    def iteration(self, plan: Plan, result: StepResult, t_start_ns: int, t_end_ns: int, *,
                  kv_total: int, memory: dict | None = None, block_counts: dict | None = None,
                  timing: dict | None = None) -> None:
        """One ``iteration`` line; ``block_counts`` maps request id -> blocks held afterwards;
        ``timing`` adds its keys (``schedule_ns``, ``forward_ns``) to the line."""
        members = []
        prefill = decode = 0
        for m in plan.members:
            row = {"request_id": m.request_id, "phase": m.phase, "tokens": m.tokens, "context": m.context}
            if m.phase == "prefill":
                row["chunked"] = m.chunked
                prefill += m.tokens
            else:
                decode += m.tokens
            if block_counts is not None:
                row["blocks"] = int(block_counts.get(m.request_id, 0))
            members.append(row)
        decisions = [{"request_id": d.request_id, "action": d.action, "reason": d.reason}
                     for d in plan.decisions + result.decisions]
        obj = {"type": "iteration", "iter": plan.iteration, "t_start_ns": int(t_start_ns), "t_end_ns": int(t_end_ns),
               "members": members, "decisions": decisions,
               "kv": {"allocated": plan.blocks_allocated, "freed": plan.blocks_freed + result.blocks_freed,
                      "in_use": result.kv_in_use, "total": int(kv_total)},
               "prefill_tokens": prefill, "decode_tokens": decode}
        if memory is not None:
            obj["memory"] = memory
        if timing:
            obj.update({k: int(v) for k, v in timing.items()})
        obj["waiting"], obj["running"] = result.waiting, result.running
        self._write(obj, flush=True)

    def first_token(self, t_ns: int, request_id: str) -> None:
        self._write({"type": "first_token", "t_ns": int(t_ns), "request_id": request_id})

    def finish(self, t_ns: int, fin: Finish) -> None:
        obj = {"type": "finish", "t_ns": int(t_ns), "request_id": fin.request_id, "reason": fin.reason,
               "prompt_tokens": fin.prompt_tokens, "output_tokens": fin.output_tokens}
        if fin.error is not None:
            obj["error"] = fin.error
        self._write(obj)

    def flush(self) -> None:
        with self._lock:
            if self._fh is not None:
                try:
                    self._fh.flush()
                except OSError as e:
                    self._failed(e)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                try:
                    self._fh.flush()
                except OSError as e:
                    self._failed(e)
                    return
                _close_quietly(self._fh)
                self._fh = None

    @property
    def closed(self) -> bool:
        return self._fh is None


def _close_quietly(fh) -> None:
    """Close a file whose buffered tail may not be writable (a full disk): drop the tail."""
    try:
        fh.close()
    except OSError:
        pass
