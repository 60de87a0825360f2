"""The engine thread: one thread owns the scheduler and the model.

HTTP handlers hand it requests and aborts through a queue (:meth:`Engine.submit`,
:meth:`Engine.abort`, thread-safe); it runs iterations while there is work, writes the event
log, records the metrics (:mod:`.metrics`, when given) and pushes tokens into per-request sinks
(the HTTP side turns them into asyncio queue items with ``call_soon_threadsafe``).

One iteration: schedule (:mod:`.scheduler`), run the model over the plan's members, hand the
sampled tokens back to the scheduler, then log the iteration, its first tokens and finishes. A
model failure fails the requests of that iteration (finish ``error``), not the server; a bug in
the loop fails every request and leaves :attr:`Engine.error` set (``/health`` answers 503).

Stop (:meth:`Engine.stop`): the loop ends after the current iteration and every request still
queued or running finishes as ``cancelled``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from .eventlog import EventLog
from .metrics import ServerMetrics
from .scheduler import Finish, RequestRejected, Scheduler


class Engine:
    """The engine thread: scheduler + model + event log (+ metrics). Thread-safe :meth:`submit`/:meth:`abort`."""

    def __init__(self, scheduler: Scheduler, model, log: EventLog, metrics: ServerMetrics | None = None):
        self.scheduler, self.model, self.log, self.metrics = scheduler, model, log, metrics
        self._prompt_len: dict[str, int] = {}     # engine thread only: for the prompt-token counter
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sinks: dict[str, Callable] = {}
        self._thread = threading.Thread(target=self._run, name="tracestory-engine", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, ignore_eos: bool, sink: Callable) -> None:
        """Queue a request; ``sink(kind, payload)`` is called from the engine thread with
        ``("token", id)`` per token and ``("finish", Finish)`` once at the end."""
        t = self.log.now_ns()
        self.log.arrival(t, request_id, len(prompt), max_new_tokens, ignore_eos)
        if not self.alive:
            self._finish_now(Finish(request_id, "cancelled", len(prompt), 0, "server shutting down"), sink)
            return
        self._inbox.put(("add", request_id, prompt, max_new_tokens, ignore_eos, sink))
        self._wake.set()

    def abort(self, request_id: str, error: str = "client disconnected") -> None:
        """Cancel a request (finish ``cancelled`` with ``error``), freeing its KV blocks."""
        self._inbox.put(("abort", request_id, error))
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _finish_now(self, fin: Finish, sink: Callable | None) -> None:
        self._prompt_len.pop(fin.request_id, None)
        self.log.finish(self.log.now_ns(), fin)
        if sink is not None:
            sink("finish", fin)

    # ------------------------------------------------------------------ the loop
    def _drain(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "add":
                _, rid, prompt, max_new, ignore_eos, sink = item
                try:
                    self.scheduler.add_request(rid, prompt, max_new, ignore_eos=ignore_eos)
                    self._sinks[rid] = sink
                    self._prompt_len[rid] = len(prompt)
                except RequestRejected as e:
                    self._finish_now(Finish(rid, "error", len(prompt), 0, str(e)), sink)
            else:
                fin = self.scheduler.abort(item[1], "cancelled", item[2])
                if fin is not None:
                    self._finish_now(fin, self._sinks.pop(fin.request_id, None))
                    self._publish_queues()        # no iteration may follow to refresh the gauges

    def _run(self) -> None:
        sched, log = self.scheduler, self.log
        try:
            while not self._stop.is_set():
                self._drain()
                if not sched.has_work:
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                t_start = log.now_ns()
                plan = sched.schedule()
                if not plan.members:          # nothing can run now (should not happen): do not spin
                    self._wake.wait(0.01)
                    continue
                t_fwd = log.now_ns()
                try:
                    sampled = self.model.step(plan.members, plan.iteration)
                    t_fwd_end = log.now_ns()
                except Exception as e:  # noqa: BLE001 -- a model failure fails this batch, not the server
                    for m in plan.members:
                        fin = sched.abort(m.request_id, "error", f"model step failed: {e!r}")
                        if fin is not None:
                            self._finish_now(fin, self._sinks.pop(fin.request_id, None))
                    continue
                result = sched.complete(plan, sampled)
                t_end = log.now_ns()
                blocks = {m.request_id: len(sched.kv.block_table(m.request_id)) for m in plan.members}
                log.iteration(plan, result, t_start, t_end, kv_total=sched.kv.num_blocks,
                              memory=self.model.memory(), block_counts=blocks,
                              timing={"schedule_ns": t_fwd - t_start, "forward_ns": t_fwd_end - t_fwd})
                if self.metrics is not None:
                    self.metrics.observe_iteration(
                        seconds=(t_end - t_start) / 1e9, new_tokens=len(result.new_tokens),
                        first_prompt_tokens=[self._prompt_len.get(rid, 0) for rid in result.first_tokens],
                        preemptions=sum(d.action == "preempt" for d in plan.decisions),
                        running=result.running, waiting=result.waiting, kv_in_use=result.kv_in_use,
                        kv_total=sched.kv.num_blocks)
                for rid in result.first_tokens:
                    log.first_token(t_end, rid)
                for rid, tok in result.new_tokens:
                    sink = self._sinks.get(rid)
                    if sink is not None:
                        sink("token", tok)
                for fin in result.finished:
                    self._prompt_len.pop(fin.request_id, None)
                    log.finish(t_end, fin)
                    sink = self._sinks.pop(fin.request_id, None)
                    if sink is not None:
                        sink("finish", fin)
                log.flush()
        except BaseException as e:  # noqa: BLE001 -- a bug in the loop: fail everything, report unhealthy
            self.error = e
            self._stop.set()
        finally:
            self._drain()
            why = "server shutting down" if self.error is None else f"engine failed: {self.error!r}"
            for fin in sched.abort_all("cancelled" if self.error is None else "error", why):
                self._finish_now(fin, self._sinks.pop(fin.request_id, None))
            self._publish_queues()
            log.flush()

    def _publish_queues(self) -> None:
        sched = self.scheduler
        if self.metrics is not None:
            self.metrics.set_queues(sched.num_running, sched.num_waiting, sched.kv.in_use, sched.kv.num_blocks)
