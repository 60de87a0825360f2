"""The serving story's model: the scheduler log folded into rows a reader can follow, where the
profiler held the engine, what the waiting requests waited on, and what to change.

Profiler holds
--------------
The torch profiler's own start and stop run on the engine thread under ``tracestory capture
--range iteration`` and hold the launch of one iteration each. The event log marks that iteration
(``profiler_ns``); a log written before that key existed is read with the capture's manifest
instead (range ``iteration``, ``--skip S --count C``: the start held the launch of iteration
``S``, the stop that of ``S + C - 1``; the seconds from ``profiler_blocked_s`` of rank 0, whose
event log it is). With overlapped scheduling (``meta.overlap``) iteration ``N`` is launched while
``N - 1`` runs, and ``N - 1`` ends when its tokens reach the host, after that launch: the held
time lies in ``N - 1``'s wall time, which is the iteration it is charged to; otherwise in ``N``'s.
An engine stall is judged on the wall time less what is charged to it.

Under tensor parallelism rank 0 sends each iteration's plan to the other ranks before launching it
(``plan_send_ns``), and a rank that is still starting or stopping its own profiler takes the plan
late. Where the capture's manifest says another rank's start or stop took longer than rank 0's
(``profiler_blocked_s`` per rank), the plan send of the iteration after rank 0's hold is that
rank's hold too, when it is at least :data:`FOLLOWER_SEND_RATIO` times the log's median plan send
and 1 ms: ``what`` is then ``"stop on rank R"`` (or start), charged as above.

Wait causes
-----------
Each ``wait`` decision's reason, by its opening words as ``tracestory serve`` writes them:
``token budget ...`` (the per-iteration token budget), ``max_num_seqs ...`` (the sequence limit),
``needs N blocks ...`` (KV blocks), anything else ``other``; ``chunk`` decisions (a prompt split
because the budget left was smaller) count with the budget.

Folding
-------
Exceptions are rows of their own: the first iteration (warm-up), engine stalls, iterations with a
preemption, and the iterations charged with a profiler hold. The iterations between exceptions are
folded greedily into runs whose batch size (sequences in the iteration) stays within a band: an
iteration joins the run while ``max <= ratio * min + 1``, ``ratio`` the smallest of
:data:`FOLD_RATIOS` that leaves at most :data:`MAX_ROWS` rows (the last one, no band, leaves the
exceptions and the runs between them). Every iteration is in exactly one row.

Advice
------
Preemptions: more KV blocks or fewer sequences. Else, with a fit of iteration time on decode
sequences, by what held the requests back (``WaitCauses``):

* the token budget (waits on it, or prompts split by it, for at least :data:`BUDGET_HELD_SHARE`
  of the requests): a larger batch would not have admitted them sooner, so the advice names the
  budget (``token-budget``);
* KV blocks, at least as often as the sequence limit: a higher sequence limit would not either;
  the advice is more KV memory (``kv-wait``);
* the sequence limit: raise it while an added sequence costs less than the fixed part of an
  iteration (``raise-batch``);
* something else (waits of other reasons): no advice;
* nothing: no request waited for a slot or for blocks, so the batch was set by the offered load,
  not by the engine; no flag is advised, and the fit says how much room a larger batch has
  (``load-bound``; :attr:`Advice.peak_batch` against the log's ``max_num_seqs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ingest.scheduler_log import Iteration, SchedulerLog

MAX_ROWS = 24
BUDGET_HELD_SHARE = 0.05  # of the requests, held by the token budget before the advice names it
FOLD_RATIOS = (1.25, 1.5, 2.0, 3.0, 4.0, 8.0, float("inf"))


@dataclass(frozen=True)
class ProfilerHold:
    iter: int  # the iteration whose launch the profiler's start or stop held
    held_ns: int
    what: str  # "start" | "stop", or "start on rank R" | "stop on rank R" where ``rank`` is not 0
    charged_iter: int  # the iteration whose wall time holds it (see the module docstring)
    source: str  # "event log" | "capture manifest" | "event log and capture manifest"
    rank: int = 0  # whose profiler: 0, the engine's own; another rank's through rank 0's plan send


@dataclass(frozen=True)
class WaitCauses:
    token_budget: int
    max_num_seqs: int
    kv_blocks: int
    other: int
    chunks: int  # prompts split because the budget left was smaller
    budget_requests: int = 0  # distinct requests that waited on the budget or had a prompt split by it
    requests: int = 0  # requests that arrived (the log's arrivals)

    @property
    def total(self) -> int:
        return self.token_budget + self.max_num_seqs + self.kv_blocks + self.other

    @property
    def on_budget(self) -> bool:
        """The waits (and splits) were on the token budget more than on anything else, and the
        budget held at least BUDGET_HELD_SHARE of the requests (one prompt split among hundreds
        holds nobody back)."""
        budget = self.token_budget + self.chunks
        held = self.budget_requests >= BUDGET_HELD_SHARE * self.requests
        return budget > 0 and held and budget >= self.max_num_seqs + self.kv_blocks + self.other


@dataclass(frozen=True)
class LogRow:
    """One row of the folded iteration log: a run of similar iterations, or one exception."""

    first_iter: int
    last_iter: int
    t_start_ns: int
    t_end_ns: int
    count: int
    kinds: dict[str, int]  # iteration kind -> count
    seqs_min: int  # sequences in the batch (prefill + decode members)
    seqs_max: int
    prefill_tokens: int  # over the row
    admitted: int
    finished: int
    chunked: int
    waits: int
    time_p50_ns: float
    time_max_ns: int
    kv_in_use_end: int | None
    exception: str | None = None  # "first iteration", "stall", "preemption", "profiler start", "profiler stop"


@dataclass(frozen=True)
class Advice:
    kind: str  # "more-kv" | "token-budget" | "kv-wait" | "raise-batch" | "load-bound"
    preemptions: int = 0
    waits: WaitCauses | None = None
    peak_batch: int = 0  # the most sequences in one iteration


@dataclass(frozen=True)
class ServingStory:
    rows: tuple[LogRow, ...]
    fold_ratio: float  # the band used (inf: runs between exceptions)
    waits: WaitCauses
    profiler: tuple[ProfilerHold, ...]
    advice: Advice | None


def charged_holds(holds: tuple[ProfilerHold, ...]) -> dict[int, int]:
    """Iteration -> ns of profiler time in its wall time."""
    out: dict[int, int] = {}
    for h in holds:
        out[h.charged_iter] = out.get(h.charged_iter, 0) + h.held_ns
    return out


def profiler_holds(log: SchedulerLog, manifest: dict | None = None) -> tuple[ProfilerHold, ...]:
    """Where the profiler's start and stop held the engine (see the module docstring)."""
    its = log.iterations
    numbers = {it.iter for it in its}
    overlap = bool(log.meta.overlap)

    def charged(n: int) -> int:
        return n - 1 if overlap and n - 1 in numbers else n

    marked = [it for it in its if it.profiler_ns]
    if marked:
        own = tuple(
            ProfilerHold(it.iter, int(it.profiler_ns or 0), ("start", "stop")[k % 2], charged(it.iter), "event log")
            for k, it in enumerate(marked)
        )
    else:
        own = _manifest_holds(manifest, numbers, charged)
    return own + _follower_holds(log, _blocked_per_rank(manifest), own, charged)


FOLLOWER_SEND_RATIO = 5
FOLLOWER_SEND_FLOOR_NS = 1_000_000


def _blocked_steps(manifest: dict | None):
    """(capture, ``profiler_blocked_s``: rank -> {start, stop}) of every step of the manifest's
    iteration-range captures that recorded it."""
    if not isinstance(manifest, dict):
        return
    for cap in manifest.get("captures") or ():
        if not isinstance(cap, dict) or _setting(cap, "range") != "iteration":
            continue
        for step in cap.get("steps") or ():
            b = step.get("profiler_blocked_s") if isinstance(step, dict) else None
            if isinstance(b, dict):
                yield cap, {str(r): v for r, v in b.items() if isinstance(v, dict)}


def _blocked_per_rank(manifest: dict | None) -> dict[str, dict]:
    """``profiler_blocked_s`` of the last iteration-range capture that has it: rank -> {start, stop}."""
    steps = list(_blocked_steps(manifest))
    return steps[-1][1] if steps else {}


def _follower_holds(log: SchedulerLog, blocked: dict[str, dict], own: tuple[ProfilerHold, ...],
                    charged) -> tuple[ProfilerHold, ...]:
    """The other ranks' profiler holds, seen in rank 0's next plan send (module docstring)."""
    sends = [it.plan_send_ns for it in log.iterations if it.plan_send_ns]
    if len(blocked) < 2 or not sends:
        return ()
    floor = max(FOLLOWER_SEND_FLOOR_NS, FOLLOWER_SEND_RATIO * float(np.median(sends)))
    by_iter = {it.iter: it for it in log.iterations}
    out = []
    for h in own:
        mine = (blocked.get("0") or {}).get(h.what)
        others = [(r, b[h.what]) for r, b in blocked.items()
                  if r != "0" and isinstance(b.get(h.what), (int, float))]
        if not others:
            continue
        rank, sec = max(others, key=lambda x: x[1])
        nxt = by_iter.get(h.iter + 1)
        if (isinstance(mine, (int, float)) and sec <= mine) or nxt is None or not nxt.plan_send_ns:
            continue
        if nxt.plan_send_ns >= floor:
            out.append(ProfilerHold(nxt.iter, min(nxt.plan_send_ns, int(round(sec * 1e9))), f"{h.what} on rank {rank}",
                                    charged(nxt.iter), "event log and capture manifest", int(rank)))
    return tuple(out)


def _setting(cap: dict, key: str) -> Any:
    v = (cap.get("settings") or {}).get(key)
    return v.get("value") if isinstance(v, dict) else v


def _manifest_holds(manifest: dict | None, numbers: set[int], charged) -> tuple[ProfilerHold, ...]:
    out = []
    for cap, blocked in _blocked_steps(manifest):
        skip, count = _setting(cap, "skip") or 0, _setting(cap, "count")
        if not isinstance(skip, int) or not isinstance(count, int) or count < 1 or "0" not in blocked:
            continue
        for what, n in (("start", skip), ("stop", skip + count - 1)):
            sec = blocked["0"].get(what)
            if isinstance(sec, (int, float)) and n in numbers:
                out.append(ProfilerHold(n, int(round(sec * 1e9)), what, charged(n), "capture manifest"))
    return tuple(out)


def wait_causes(log: SchedulerLog) -> WaitCauses:
    n = {"token": 0, "max_num_seqs": 0, "needs": 0, "other": 0}
    chunks = 0
    held: set[str] = set()
    for it in log.iterations:
        for d in it.decisions:
            if d.action == "chunk":
                chunks += 1
                held.add(d.request_id)
            elif d.action == "wait":
                word = d.reason.split(" ", 1)[0] if d.reason else ""
                n[word if word in n else "other"] += 1
                if word == "token":
                    held.add(d.request_id)
    return WaitCauses(n["token"], n["max_num_seqs"], n["needs"], n["other"], chunks, len(held), len(log.arrivals))


def _row(run: list[Iteration], exception: str | None = None) -> LogRow:
    kinds: dict[str, int] = {}
    for it in run:
        kinds[it.kind] = kinds.get(it.kind, 0) + 1
    seqs = [len(it.members) for it in run]
    dur = [it.duration_ns for it in run]
    acts = [d.action for it in run for d in it.decisions]
    kv = [it.kv_in_use for it in run if it.kv_in_use is not None]
    return LogRow(
        run[0].iter,
        run[-1].iter,
        run[0].t_start_ns,
        run[-1].t_end_ns,
        len(run),
        kinds,
        min(seqs),
        max(seqs),
        sum(it.prefill_tokens for it in run),
        acts.count("admit"),
        acts.count("finish"),
        acts.count("chunk"),
        acts.count("wait"),
        float(np.median(dur)),
        max(dur),
        kv[-1] if kv else None,
        exception,
    )


def exceptions(log: SchedulerLog, stall_iters, holds: tuple[ProfilerHold, ...]) -> dict[int, str]:
    """Iteration -> why it is a row of its own (the first reason that applies)."""
    out: dict[int, str] = {}
    for h in holds:
        out.setdefault(h.charged_iter, f"profiler {h.what}")
    for n in stall_iters:
        out.setdefault(n, "stall")
    for it in log.iterations:
        if any(d.action == "preempt" for d in it.decisions):
            out.setdefault(it.iter, "preemption")
    if log.iterations:
        out.setdefault(log.iterations[0].iter, "first iteration")
    return out


def fold(log: SchedulerLog, special: dict[int, str], ratio: float) -> list[LogRow]:
    rows: list[LogRow] = []
    run: list[Iteration] = []
    lo = hi = 0
    for it in log.iterations:
        why = special.get(it.iter)
        n = len(it.members)
        if run and (why is not None or max(hi, n) > ratio * min(lo, n) + 1):
            rows.append(_row(run))
            run = []
        if why is not None:
            rows.append(_row([it], why))
            continue
        lo, hi = (min(lo, n), max(hi, n)) if run else (n, n)
        run.append(it)
    if run:
        rows.append(_row(run))
    return rows


def advise(log: SchedulerLog, fit, preemptions: int, waits: WaitCauses) -> Advice | None:
    if preemptions:
        return Advice("more-kv", preemptions=preemptions, waits=waits)
    if fit is None or fit.b_decode_ns_per_seq is None or fit.a_ns <= 0:
        return None
    peak = max((len(it.members) for it in log.iterations), default=0)
    if waits.on_budget:
        kind = "token-budget"
    elif waits.kv_blocks and waits.kv_blocks >= waits.max_num_seqs:
        kind = "kv-wait"
    elif waits.max_num_seqs:
        kind = "raise-batch"
    elif waits.other:
        return None       # held back by something this model does not name: no advice
    else:
        kind = "load-bound"
    return Advice(kind, waits=waits, peak_batch=peak)


def serving_story(
    log: SchedulerLog, *, stall_iters, holds: tuple[ProfilerHold, ...], fit, preemptions: int
) -> ServingStory:
    """The folded log, wait causes and advice of one run (``stall_iters``: the engine stalls'
    iteration numbers; ``holds``: :func:`profiler_holds`)."""
    special = exceptions(log, stall_iters, holds)
    rows: list[LogRow] = []
    ratio = FOLD_RATIOS[-1]
    for ratio in FOLD_RATIOS:
        rows = fold(log, special, ratio)
        if len(rows) <= MAX_ROWS:
            break
    waits = wait_causes(log)
    band = ratio if np.isfinite(ratio) else None
    return ServingStory(tuple(rows), band, waits, holds, advise(log, fit, preemptions, waits))
