"""The engine thread: one thread owns the scheduler and the model.

HTTP handlers hand it requests and aborts through a queue (:meth:`Engine.submit`,
:meth:`Engine.abort`, thread-safe); it runs iterations while there is work, writes the event
log, records the metrics (:mod:`.metrics`, when given) and pushes tokens into per-request sinks
(the HTTP side turns them into asyncio queue items with ``call_soon_threadsafe``).

One iteration N, overlapped with the device (``overlap=True``, the default):

1. schedule N (:mod:`.scheduler`) and launch it (:meth:`PagedLlama.launch` returns at once on
   CUDA); its input ids that are not known on the host yet (the tokens sampled by N-1, still
   in flight) are ``-(row+1)``: the model takes them from N-1's sampled ids on the device;
2. record N in the scheduler at once with a *placeholder* per sampled token (unique negative
   ids), so N+1 can be scheduled before N's tokens are on the host;
3. wait for N-1's tokens (the device is already busy with N) and hand them out: placeholders
   resolved, tokens to the sinks, the iteration's event-log line, metrics and finishes.

So the host's per-iteration work (scheduling, packing inputs, logging, HTTP hand-off) runs
while the device computes the previous launch. What the placeholders change, and how it is
kept exact:

* ``max_new_tokens``: the scheduler counts placeholders, so a request ends at exactly
  ``max_new_tokens`` tokens (``length``), as without overlap;
* EOS: the scheduler cannot see a placeholder's value, so the engine checks each token when
  it arrives; a request that sampled EOS ends there (``stop``, the tokens after it never
  reach the client, its blocks are freed) after at most one extra iteration was computed for
  it. When ``max_new_tokens`` is reached on the same token, ``length`` wins, as in the
  scheduler;
* a request preempted and re-prefilled uses its resolved tokens (or the device rows of the
  launch in flight).

``overlap=False`` resolves each iteration right after its launch (the device idles while the
host schedules). Event-log times: an iteration's ``t_end_ns`` is when its tokens reached the
host, its ``t_start_ns`` the later of its scheduling start and the previous iteration's end,
so iterations tile the timeline; ``launch_ns`` is the launch's host time (``forward_ns``:
launch to tokens on the host; it spans the next iteration's launch, overlapped), ``result_wait_ns``
the part the engine thread spent waiting for the tokens (:meth:`Launch.result`), ``plan_send_ns``
(tensor parallel) the part of the launch rank 0 spent sending the plan to the other ranks (a rank
that is late to listen holds it there), ``input_wait_ns`` and ``replay_ns`` the parts of the
launch spent waiting for a pinned input buffer's last copy and in the CUDA graph's replay call
(:mod:`.graphs`, :mod:`.mixed`), ``drain_ns`` and ``handout_before_ns`` the host work of
the loop turn that launched the iteration before its scheduling (queued admissions and aborts; the
hand-out of the iteration before the previous one: its tokens to the clients, its event-log line).
So with overlap the wall time of iteration N holds, as disjoint parts, N+1's
``handout_before_ns``, ``drain_ns``, ``schedule_ns`` and ``launch_ns`` and N's ``result_wait_ns``
(the rest: the scheduler's bookkeeping of N+1 after its launch, the loop's own steps): a stall
names the step that took its time; ``profiler_ns``, when present, is the part of the launch a
profiler's start or stop held the engine thread (``tracestory capture --range``), not the
engine's own time; ``gc_ns``/``gc_passes``/``gc_generation`` the Python garbage collections
that ended inside the iteration (:mod:`.gcwatch`: any thread's, each stops the whole process; a
collection that straddles two iterations is charged to the one it ends in); ``gpu_ns``, on CUDA,
the device time of the iteration's launched work (the model's :class:`~.model.Launch`, two CUDA
events around it, read once its tokens are on the host). A model failure fails the requests of that iteration (finish
``error``), not the server; a bug in the loop fails every request and leaves
:attr:`Engine.error` set (``/health`` answers 503).

Stop (:meth:`Engine.stop`): the loop ends after the current iteration and every request still
queued or running finishes as ``cancelled``.

Progress (:attr:`Engine.progress`, :mod:`.progress`): each turn of the loop beats and names the
step it enters, so :meth:`Engine.stalled` can tell a step that has not returned for longer than
a timeout (a forward waiting on a stopped tensor-parallel rank) from an idle engine. A failed
event-log write never reaches this thread (:mod:`.eventlog` counts the lost lines and goes on).
With ``TRACESTORY_STALL_STACKS_MS`` set, the launch and the hand-out of each iteration are watched
(:mod:`.stackwatch`): one that outlasts the limit leaves every thread's Python stack in a file.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..capture.region import take_notes
from .eventlog import EventLog
from .gcwatch import GcClock
from .metrics import ServerMetrics
from .progress import Progress
from .scheduler import Decision, Finish, Plan, RequestRejected, Scheduler, StepResult
from .stackwatch import StackWatch


class _Done:
    """The tokens of a model that has ``step()`` only (computed at once)."""

    def __init__(self, sampled: dict):
        self._sampled = sampled

    def result(self) -> dict:
        return self._sampled


@dataclass(frozen=True)
class _Flight:
    """An iteration launched on the device whose tokens the host has not seen yet."""

    plan: Plan
    launch: object                   # model.Launch
    result: StepResult               # from Scheduler.complete with placeholder tokens
    sampled: dict                    # request id -> its placeholder
    blocks: dict                     # request id -> blocks held after the iteration
    t_start: int
    t_fwd: int
    t_launched: int
    notes: dict                      # region notes of its launch (capture.region.note: profiler_ns)

    @property
    def rows(self) -> dict[int, int]:
        """placeholder -> row of the launch's sampled ids (sampling members in order)."""
        return {ph: i for i, ph in enumerate(self.sampled.values())}


class Engine:
    """The engine thread: scheduler + model + event log (+ metrics). Thread-safe :meth:`submit`/:meth:`abort`."""

    def __init__(self, scheduler: Scheduler, model, log: EventLog, metrics: ServerMetrics | None = None, *,
                 overlap: bool = True):
        self.scheduler, self.model, self.log, self.metrics = scheduler, model, log, metrics
        self._can_launch = callable(getattr(model, "launch", None))
        self.overlap = overlap and self._can_launch    # a step()-only model runs one iteration at a time
        # engine thread only
        self._prompt_len: dict[str, int] = {}     # for the prompt-token counter and stop finishes
        self._ignore_eos: dict[str, bool] = {}
        self._emitted: dict[str, int] = {}        # tokens handed to the sink
        self._resolved: dict[int, int] = {}       # placeholder -> sampled token
        self._ph_of: dict[str, list[int]] = {}    # request -> its resolved placeholders
        self._next_ph = 0                         # placeholders count down from -1
        self._last_end = 0
        self._gc = GcClock(log.now_ns)             # Python GC time per iteration (installed by the loop)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._drain_ns = 0                # host time of the current loop turn's admissions and aborts
        self._handout_ns: int | None = None  # host time of the last iteration's hand-out, not logged yet
        self._stacks = StackWatch.from_env("rank0")   # TRACESTORY_STALL_STACKS_MS (.stackwatch): off by default
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sinks: dict[str, Callable] = {}
        self._thread = threading.Thread(target=self._run, name="tracestory-engine", daemon=True)
        self.error: BaseException | None = None
        tp = getattr(model, "tp", None)
        self.progress = Progress(int(tp["size"]) if isinstance(tp, dict) else 1)
        if metrics is not None:
            log.on_lost = metrics.event_log_lines_lost.inc

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def stalled(self, timeout_s: float) -> str | None:
        """One line when the running engine has been inside one step for over ``timeout_s``
        seconds (:mod:`.progress`), else None."""
        return self.progress.stalled(timeout_s) if self.alive else None

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, ignore_eos: bool, sink: Callable) -> None:
        """Queue a request; ``sink(kind, payload)`` is called from the engine thread with
        ``("token", id)`` per token and ``("finish", Finish)`` once at the end."""
        t = self.log.now_ns()
        self.log.arrival(t, request_id, len(prompt), max_new_tokens, ignore_eos)
        if self._stop.is_set():           # requests submitted before start() wait for it
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
        # the scheduler counts placeholders of tokens still in flight: tell what was handed out
        fin = replace(fin, output_tokens=self._emitted.get(fin.request_id, 0))
        self._forget(fin.request_id)
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
                    self._ignore_eos[rid] = ignore_eos
                except RequestRejected as e:
                    self._finish_now(Finish(rid, "error", len(prompt), 0, str(e)), sink)
            else:
                fin = self.scheduler.abort(item[1], "cancelled", item[2])
                if fin is not None:
                    self._finish_now(fin, self._sinks.pop(fin.request_id, None))
                    self._publish_queues()        # no iteration may follow to refresh the gauges

    def _run(self) -> None:
        sched = self.scheduler
        inflight: _Flight | None = None
        self._gc.install()
        try:
            while not self._stop.is_set():
                self.progress.beat()
                t = self.log.now_ns()
                self._drain()
                self._drain_ns = self.log.now_ns() - t
                launched = self._launch_next(inflight) if sched.has_work else None
                if inflight is not None:
                    self._resolve(inflight)       # the GPU runs `launched` meanwhile
                inflight = launched
                if inflight is not None and not self.overlap:
                    self._resolve(inflight)
                    inflight = None
                if inflight is None:
                    if not sched.has_work:
                        self._wake.wait(0.05)
                        self._wake.clear()
                    elif launched is None:        # nothing can run now (should not happen): do not spin
                        self._wake.wait(0.01)
        except BaseException as e:  # noqa: BLE001 -- a bug in the loop: fail everything, report unhealthy
            self.error = e
            self._stop.set()
        finally:
            if inflight is not None and self.error is None:
                try:
                    self._resolve(inflight)
                except BaseException as e:  # noqa: BLE001
                    self.error = e
            self._drain()
            why = "server shutting down" if self.error is None else f"engine failed: {self.error!r}"
            for fin in sched.abort_all("cancelled" if self.error is None else "error", why):
                self._finish_now(fin, self._sinks.pop(fin.request_id, None))
            self._publish_queues()
            self.log.flush()
            self._gc.remove()
            self._stacks.close()

    def _launch_next(self, prev: _Flight | None) -> _Flight | None:
        """Schedule and launch one iteration, then record it in the scheduler with a placeholder
        per sampled token (module docstring); returns the flight, or None when nothing ran."""
        self._stacks.arm()
        try:
            return self._schedule_and_launch(prev)
        finally:
            self._stacks.done("schedule and launch of the next iteration")

    def _schedule_and_launch(self, prev: _Flight | None) -> _Flight | None:
        sched, log = self.scheduler, self.log
        t_start = log.now_ns()
        self.progress.doing("scheduling")
        plan = sched.schedule()
        if not plan.members:
            return None
        self.progress.doing(f"in the forward of iteration {plan.iteration} ({len(plan.members)} requests)")
        t_fwd = log.now_ns()
        try:
            ids = self._input_ids(plan.members, prev)
            if self._can_launch:
                launch = self.model.launch(plan.members, plan.iteration, ids)
            else:                         # a model with step() only: ids known, no placeholders left
                it = iter(ids)
                members = [replace(m, token_ids=tuple(next(it) for _ in m.token_ids)) for m in plan.members]
                launch = _Done(self.model.step(members, plan.iteration))
        except Exception as e:  # noqa: BLE001 -- a model failure fails this batch, not the server
            self._fail(plan, e)
            return None
        t_launched = log.now_ns()
        notes = take_notes()
        # the host work of this loop turn before the launch (module docstring, "Event-log times")
        notes["drain_ns"] = self._drain_ns
        if self._handout_ns is not None:
            notes["handout_before_ns"], self._handout_ns = self._handout_ns, None
        sampled = {}
        for m in plan.members:
            if m.samples:
                self._next_ph -= 1
                sampled[m.request_id] = self._next_ph
        result = sched.complete(plan, sampled)
        blocks = {m.request_id: len(sched.kv.block_table(m.request_id)) for m in plan.members}
        return _Flight(plan, launch, result, sampled, blocks, t_start, t_fwd, t_launched, notes)

    def _input_ids(self, members, prev: _Flight | None) -> list[int]:
        """The members' token ids with placeholders replaced: by the token when it is known,
        by ``-(row + 1)`` (a row of the previous launch's samples, on the device) otherwise."""
        resolved = self._resolved
        rows = prev.rows if prev is not None else {}
        out = []
        for m in members:
            for t in m.token_ids:
                if t >= 0:
                    out.append(t)
                elif t in resolved:
                    out.append(resolved[t])
                elif t in rows:
                    out.append(-(rows[t] + 1))
                else:
                    raise RuntimeError(f"request {m.request_id}: token placeholder {t} of no known iteration")
        return out

    def _fail(self, plan, e: BaseException) -> None:
        for m in plan.members:
            fin = self.scheduler.abort(m.request_id, "error", f"model step failed: {e!r}")
            if fin is not None:
                self._finish_now(fin, self._sinks.pop(fin.request_id, None))

    def _resolve(self, f: _Flight) -> None:
        """Wait for a flight's tokens, then hand them out: tokens, EOS stops, finishes, the
        event-log line and the metrics of its iteration."""
        log = self.log
        self.progress.doing(f"waiting for the tokens of iteration {f.plan.iteration} ({len(f.plan.members)} requests)")
        t_wait = log.now_ns()
        try:
            real = f.launch.result()
        except Exception as e:  # noqa: BLE001
            self._fail(f.plan, e)
            return
        t_end = log.now_ns()
        self._stacks.arm()
        try:
            self._hand_out(f, real, t_wait, t_end)
        finally:
            self._stacks.done(f"hand-out of iteration {f.plan.iteration}")

    def _hand_out(self, f: _Flight, real, t_wait: int, t_end: int) -> None:
        """Hand a flight's tokens out (``real``: request id -> token id): the rest of :meth:`_resolve`."""
        sched, log = self.scheduler, self.log
        for rid, ph in f.sampled.items():
            self._resolved[ph] = int(real[rid])
            self._ph_of.setdefault(rid, []).append(ph)
        eos = sched.config.eos_token_id
        new_tokens, finished, decisions = [], [], list(f.result.decisions)
        done = {fin.request_id: fin for fin in f.result.finished}
        for rid, ph in f.result.new_tokens:
            if rid not in self._sinks:            # finished, stopped or aborted meanwhile
                continue
            tok = self._resolved[ph]
            new_tokens.append((rid, tok))
            n = self._emitted[rid] = self._emitted.get(rid, 0) + 1
            if eos is not None and tok == eos and not self._ignore_eos.get(rid, False) and rid not in done:
                nblocks = len(sched.kv.block_table(rid))
                sched.abort(rid, "stop")          # None when a later iteration already ended it
                finished.append(Finish(rid, "stop", self._prompt_len.get(rid, 0), n))
                decisions.append(Decision(rid, "finish", f"stop: sampled EOS id {eos} after {n} tokens; "
                                                         f"{nblocks} blocks freed"))
        finished += [fin for rid, fin in done.items() if rid in self._sinks]
        first = [rid for rid in f.result.first_tokens if rid in self._sinks]
        result = replace(f.result, new_tokens=tuple(new_tokens), finished=tuple(finished),
                         decisions=tuple(decisions), first_tokens=tuple(first))
        t_start = max(f.t_start, self._last_end)
        self._last_end = t_end
        extra = self._gc.take(t_start, t_end)
        gpu_ns = getattr(f.launch, "gpu_ns", None)       # CUDA only; None when not measured
        if gpu_ns is not None:
            extra["gpu_ns"] = gpu_ns
        self.progress.doing(f"handing out the tokens of iteration {f.plan.iteration} (event log, metrics, clients)")
        log.iteration(f.plan, result, t_start, t_end, kv_total=sched.kv.num_blocks, memory=self.model.memory(),
                      block_counts=f.blocks,
                      timing={"schedule_ns": f.t_fwd - f.t_start, "forward_ns": t_end - f.t_fwd,
                              "launch_ns": f.t_launched - f.t_fwd, "result_wait_ns": t_end - t_wait, **f.notes, **extra})
        if self.metrics is not None:
            self.metrics.observe_iteration(
                seconds=(t_end - t_start) / 1e9, new_tokens=len(new_tokens),
                first_prompt_tokens=[self._prompt_len.get(rid, 0) for rid in first],
                preemptions=sum(d.action == "preempt" for d in f.plan.decisions),
                running=sched.num_running, waiting=sched.num_waiting, kv_in_use=sched.kv.in_use,
                kv_total=sched.kv.num_blocks)
        for rid in first:
            log.first_token(t_end, rid)
        for rid, tok in new_tokens:
            sink = self._sinks.get(rid)
            if sink is not None:
                sink("token", tok)
        for fin in finished:
            self._forget(fin.request_id)
            log.finish(t_end, fin)
            sink = self._sinks.pop(fin.request_id, None)
            if sink is not None:
                sink("finish", fin)
        log.flush()
        self._handout_ns = log.now_ns() - t_end

    def _forget(self, request_id: str) -> None:
        self._prompt_len.pop(request_id, None)
        self._ignore_eos.pop(request_id, None)
        self._emitted.pop(request_id, None)
        for ph in self._ph_of.pop(request_id, ()):
            self._resolved.pop(ph, None)

    def _publish_queues(self) -> None:
        sched = self.scheduler
        if self.metrics is not None:
            self.metrics.set_queues(sched.num_running, sched.num_waiting, sched.kv.in_use, sched.kv.num_blocks)
