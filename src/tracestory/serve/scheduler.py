"""A continuous-batching scheduler: which tokens of which requests run in the next iteration.

Pure logic (no torch, no clock): the engine calls :meth:`Scheduler.schedule` for a
:class:`Plan`, runs the model over it, and hands the sampled tokens to
:meth:`Scheduler.complete`.

State of a request: its *known tokens* are ``prompt + output`` and ``computed`` of them have
their K/V in the cache. A step over a request computes the next ``n`` known tokens; when that
reaches the last known token, the model's logits there give the next output token ("samples").
So a fresh request is a prefill (``n`` up to the prompt length), then one token per iteration
(decode: the input is the previous output token). The cache holds ``prompt + output - 1``
tokens at the end, which is what :meth:`Scheduler.add_request` checks against the capacity.

One iteration (:meth:`Scheduler.schedule`), with a budget of ``max_batch_tokens`` tokens:

1. **decode first**: every running request in decode (one known token left to compute), oldest
   first, one token each;
2. **running prefills**: requests admitted earlier whose prompt is not all computed, oldest
   first, a chunk of ``min(remaining, budget left, tokens that fit in free blocks)`` tokens
   (``chunk`` decision with the reason when that is less than the remainder);
3. **admission**: waiting requests in arrival order (FCFS, the head blocks the rest), while
   ``running < max_num_seqs``, budget is left and the free blocks hold the head's next chunk
   (``admit`` with "F blocks free >= N needed", else ``wait`` with the shortfall).

**Preemption (recompute)**: when a running request cannot get a block for its next token
(decode) or for any token of its chunk (prefill), the youngest running request (latest
arrival; possibly the one asking) gives up all its blocks and goes back to the waiting queue
in arrival order; its output so far is kept and, when readmitted, it re-prefills
``prompt + output`` (``computed`` back to 0). A request whose final size fits the cache always
completes: the oldest running request can always take blocks from younger ones.

**Fairness (optional, ``fair_wait_iterations`` N)**: FCFS alone lets long streams that fill
the KV cache (or every ``max_num_seqs`` slot) keep a short request waiting until one of them
ends. With N set, when the waiting head has waited N iterations and is blocked by blocks or by
``max_num_seqs``, the running requests that have run at least N iterations since their
admission are preempted, most output tokens first, until the head fits (none is preempted when
they cannot make it fit). A request preempted this way is requeued at the *back* of the waiting
queue as if it had just arrived (it loses its seniority), so under pressure the requests take
turns of at least N iterations each: round-robin with a quantum of N iterations, paid for with
the recomputation of the preempted request's prompt and output. N = None (the default here) is
plain FCFS.

A request finishes with ``length`` at ``max_new_tokens`` output tokens, or ``stop`` when it
samples the configured EOS id (unless ``ignore_eos``); its blocks are freed in that iteration.
Every admit/chunk/wait/preempt/finish is a :class:`Decision` with a human-readable reason.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import TracestoryError
from .kv_cache import BlockManager, blocks_for


class RequestRejected(TracestoryError):
    """A request the scheduler can never run (empty, too long for the cache, duplicate id)."""


@dataclass(frozen=True)
class SchedulerConfig:
    block_size: int = 16
    num_blocks: int = 512
    max_batch_tokens: int = 256
    max_num_seqs: int = 32
    eos_token_id: int | None = None
    fair_wait_iterations: int | None = None   # None: plain FCFS (see the module docstring)

    def __post_init__(self):
        for name in ("block_size", "num_blocks", "max_batch_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.fair_wait_iterations is not None and self.fair_wait_iterations < 1:
            raise ValueError(f"SchedulerConfig.fair_wait_iterations must be >= 1, got {self.fair_wait_iterations}")


def request_problem(config: SchedulerConfig, prompt_tokens: int, max_new_tokens: int) -> str | None:
    """Why a request of this size can never run with ``config`` (None when it can). The cache
    must hold ``prompt + max_new_tokens - 1`` tokens: the last output token is never fed back."""
    cap = config.num_blocks * config.block_size
    if prompt_tokens < 1:
        return "expected a prompt of at least 1 token, found 0"
    if max_new_tokens < 1:
        return f"expected max_new_tokens >= 1, found {max_new_tokens}"
    if prompt_tokens + max_new_tokens - 1 > cap:
        return (f"prompt {prompt_tokens} + max_new_tokens {max_new_tokens} needs {prompt_tokens + max_new_tokens - 1} "
                f"KV slots, the cache holds {cap} ({config.num_blocks} blocks x {config.block_size} tokens)")
    return None


@dataclass(frozen=True)
class Decision:
    request_id: str
    action: str                      # admit | chunk | wait | preempt | finish
    reason: str


@dataclass(frozen=True)
class Member:
    """One request's share of an iteration: compute ``token_ids`` at positions ``start..``."""

    request_id: str
    phase: str                       # prefill | decode
    start: int                       # position of the first token computed
    token_ids: tuple[int, ...]
    block_table: tuple[int, ...]     # the request's blocks, covering positions 0..context-1
    chunked: bool                    # prefill that stops before the last known token
    samples: bool                    # ends at the last known token: a next token is sampled

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context(self) -> int:
        """Tokens in the request's cache after this step."""
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class Plan:
    iteration: int
    members: tuple[Member, ...]
    decisions: tuple[Decision, ...]
    blocks_allocated: int
    blocks_freed: int                # by preemption while scheduling

    @property
    def num_tokens(self) -> int:
        return sum(m.tokens for m in self.members)


@dataclass(frozen=True)
class Finish:
    request_id: str
    reason: str                      # length | stop | error | cancelled
    prompt_tokens: int
    output_tokens: int
    error: str | None = None


@dataclass(frozen=True)
class StepResult:
    iteration: int
    new_tokens: tuple[tuple[str, int], ...]   # (request_id, token id) in member order
    first_tokens: tuple[str, ...]             # requests that got their first output token
    finished: tuple[Finish, ...]
    decisions: tuple[Decision, ...]           # the finish decisions of this step
    blocks_freed: int                         # by finished requests
    kv_in_use: int
    waiting: int
    running: int


@dataclass(eq=False)
class _Seq:
    request_id: str
    prompt: list[int]
    max_new_tokens: int
    ignore_eos: bool
    order: int                       # arrival order: smaller is older
    output: list[int] = field(default_factory=list)
    computed: int = 0
    preemptions: int = 0
    first_token_sent: bool = False
    waiting_since: int = 0           # iteration it (re)entered the waiting queue
    running_since: int = 0           # iteration it was last admitted

    @property
    def known(self) -> int:
        return len(self.prompt) + len(self.output)

    def tokens(self, start: int, stop: int) -> tuple[int, ...]:
        p = len(self.prompt)
        return tuple(self.prompt[start:stop]) + tuple(self.output[max(start - p, 0):max(stop - p, 0)])

    @property
    def decoding(self) -> bool:
        return bool(self.output) and self.known - self.computed == 1


class Scheduler:
    """Continuous batching over a :class:`~.kv_cache.BlockManager`. Not thread-safe: one caller."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.kv = BlockManager(config.num_blocks, config.block_size)
        self._seqs: dict[str, _Seq] = {}
        self._waiting: list[_Seq] = []       # by arrival order
        self._running: list[_Seq] = []       # by arrival order
        self._order = 0
        self._iteration = 0

    # ------------------------------------------------------------------ queries
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def iteration(self) -> int:
        """The number the next plan gets."""
        return self._iteration

    def output_of(self, request_id: str) -> list[int]:
        seq = self._seqs.get(request_id)
        return list(seq.output) if seq is not None else []

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt: list[int], max_new_tokens: int, *,
                    ignore_eos: bool = False) -> None:
        """Queue a request (FCFS). Raises :class:`RequestRejected` when it can never run."""
        if request_id in self._seqs:
            raise RequestRejected(f"request {request_id}: expected a new id, found one already queued or running")
        problem = request_problem(self.config, len(prompt), max_new_tokens)
        if problem is not None:
            raise RequestRejected(f"request {request_id}: {problem}")
        seq = _Seq(request_id, list(prompt), int(max_new_tokens), bool(ignore_eos), self._order,
                   waiting_since=self._iteration)
        self._order += 1
        self._seqs[request_id] = seq
        self._waiting.append(seq)      # newest arrival: the end keeps arrival order

    def abort(self, request_id: str, reason: str = "cancelled", error: str | None = None) -> Finish | None:
        """Remove a waiting or running request (client gone, engine error); frees its blocks."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        if seq in self._running:
            self._running.remove(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        self.kv.free(request_id)
        return Finish(request_id, reason, len(seq.prompt), len(seq.output), error)

    def abort_all(self, reason: str = "cancelled", error: str | None = None) -> list[Finish]:
        return [f for rid in list(self._seqs) if (f := self.abort(rid, reason, error)) is not None]

    # ------------------------------------------------------------------ one iteration
    def schedule(self) -> Plan:
        """Pick this iteration's members (and allocate their blocks); see the module docstring."""
        cfg, kv = self.config, self.kv
        st = _PlanState(cfg.max_batch_tokens)
        for seq in list(self._running):                      # 1. decode, oldest first
            if seq not in self._running or not seq.decoding:
                continue
            if st.budget < 1:
                st.decide(seq, "wait", f"token budget of {cfg.max_batch_tokens} used by earlier members")
                continue
            if kv.blocks_needed(seq.request_id, 1) > kv.free_count and not self._make_room(seq, 1, st):
                continue
            self._add_member(seq, 1, st, chunk_reason=None)
        for seq in list(self._running):                      # 2. prefills already running
            if seq not in self._running or seq.decoding or seq.request_id in st.members:
                continue
            if st.budget < 1:
                st.decide(seq, "wait", f"token budget of {cfg.max_batch_tokens} used by earlier members")
                continue
            if kv.tokens_fitting(seq.request_id) < 1 and not self._make_room(seq, 1, st):
                continue
            remaining = seq.known - seq.computed
            fit = kv.tokens_fitting(seq.request_id)
            chunk = min(remaining, st.budget, fit)
            why = None
            if chunk < remaining:
                why = (f"prompt remainder {remaining} > token budget left {st.budget}" if st.budget <= fit
                       else f"prompt remainder {remaining} > {fit} tokens that fit in free KV blocks")
            self._add_member(seq, chunk, st, chunk_reason=why)
        while self._waiting:                                 # 3. admission, FCFS
            seq = self._waiting[0]
            self._take_turns(seq, st)
            if len(self._running) >= cfg.max_num_seqs:
                st.decide(seq, "wait", f"max_num_seqs {cfg.max_num_seqs} requests running")
                break
            if st.budget < 1:
                st.decide(seq, "wait", f"token budget of {cfg.max_batch_tokens} used by running requests")
                break
            remaining = seq.known - seq.computed
            chunk = min(remaining, st.budget)
            need, free = blocks_for(chunk, cfg.block_size), kv.free_count
            if need > free:
                st.decide(seq, "wait", f"needs {need} blocks, {free} free")
                break
            again = f" (recompute {remaining} tokens after preemption)" if seq.preemptions else ""
            st.decide(seq, "admit", f"{free} blocks free >= {need} needed{again}")
            self._waiting.pop(0)
            seq.running_since = self._iteration
            bisect.insort(self._running, seq, key=lambda s: s.order)
            why = f"prompt {remaining} > token budget left {st.budget}" if chunk < remaining else None
            self._add_member(seq, chunk, st, chunk_reason=why)
        # decode members first, then prefills, each in the order they were scheduled
        members = sorted(st.members.values(), key=lambda m: m.phase != "decode")
        plan = Plan(self._iteration, tuple(members), tuple(st.decisions), st.allocated, st.freed)
        self._iteration += 1
        return plan

    def complete(self, plan: Plan, sampled: Mapping[str, int]) -> StepResult:
        """Record that ``plan`` ran: its tokens are in the cache; ``sampled`` holds the next token
        of every member with ``samples`` (requests aborted meanwhile are skipped)."""
        new_tokens, first, finished, decisions, freed = [], [], [], [], 0
        eos = self.config.eos_token_id
        for m in plan.members:
            seq = self._seqs.get(m.request_id)
            if seq is None:
                continue
            seq.computed += m.tokens
            if not m.samples:
                continue
            tok = int(sampled[m.request_id])
            seq.output.append(tok)
            new_tokens.append((seq.request_id, tok))
            if not seq.first_token_sent:
                seq.first_token_sent = True
                first.append(seq.request_id)
            reason = None
            if len(seq.output) >= seq.max_new_tokens:
                reason, text = "length", f"length: {len(seq.output)} of max {seq.max_new_tokens} new tokens"
            elif eos is not None and tok == eos and not seq.ignore_eos:
                reason, text = "stop", f"stop: sampled EOS id {eos} after {len(seq.output)} tokens"
            if reason is not None:
                nblocks = len(self.kv.block_table(seq.request_id))
                finished.append(self.abort(seq.request_id, reason))
                freed += nblocks
                decisions.append(Decision(seq.request_id, "finish", f"{text}; {nblocks} blocks freed"))
        return StepResult(plan.iteration, tuple(new_tokens), tuple(first), tuple(finished), tuple(decisions),
                          freed, self.kv.in_use, len(self._waiting), len(self._running))

    # ------------------------------------------------------------------ helpers
    def _add_member(self, seq: _Seq, n: int, st: _PlanState, *, chunk_reason: str | None) -> None:
        start = seq.computed
        st.allocated += len(self.kv.append(seq.request_id, n))
        end = start + n
        phase = "decode" if seq.decoding else "prefill"
        st.members[seq.request_id] = Member(seq.request_id, phase, start, seq.tokens(start, end),
                                            tuple(self.kv.block_table(seq.request_id)),
                                            chunked=end < seq.known, samples=end == seq.known)
        st.budget -= n
        if chunk_reason is not None:
            st.decide(seq, "chunk", chunk_reason)

    def _make_room(self, seq: _Seq, tokens: int, st: _PlanState) -> bool:
        """Preempt youngest running requests until ``seq`` can take ``tokens`` more tokens.
        False when ``seq`` itself was the youngest and got preempted."""
        while self.kv.tokens_fitting(seq.request_id) < tokens:
            victim = self._running[-1]
            free = self.kv.free_count
            self._preempt(victim, st, f"KV cache full ({free} blocks free) when {seq.request_id} needed a block; "
                                      f"youngest running request, recompute later")
            if victim is seq:
                return False
        return True

    def _take_turns(self, head: _Seq, st: _PlanState) -> None:
        """Fairness (module docstring): preempt long-served running requests for a head that
        waited ``fair_wait_iterations``; they go to the back of the waiting queue."""
        cfg, n = self.config, self.config.fair_wait_iterations
        if n is None or self._iteration - head.waiting_since < n or st.budget < 1:
            return
        need = blocks_for(min(head.known - head.computed, st.budget), cfg.block_size)
        seats_short = len(self._running) + 1 - cfg.max_num_seqs
        if need <= self.kv.free_count and seats_short <= 0:
            return
        served = sorted((s for s in self._running if self._iteration - s.running_since >= n),
                        key=lambda s: (-len(s.output), -s.order))
        victims, free = [], self.kv.free_count
        for s in served:
            if free >= need and len(victims) >= seats_short:
                break
            victims.append(s)
            free += len(self.kv.block_table(s.request_id))
        if free < need or len(victims) < seats_short:
            return
        for s in victims:
            self._preempt(s, st, f"fairness: {head.request_id} waited {self._iteration - head.waiting_since} "
                                 f"iterations; this one ran {self._iteration - s.running_since} iterations "
                                 f"({len(s.output)} tokens out), requeued at the back")
            s.order = self._order                 # a fresh arrival: behind everything waiting
            self._order += 1
            self._waiting.remove(s)
            self._waiting.append(s)

    def _preempt(self, seq: _Seq, st: _PlanState, reason: str) -> None:
        st.freed += self.kv.free(seq.request_id)
        m = st.members.pop(seq.request_id, None)
        if m is not None:                 # already scheduled this iteration: give its tokens back
            st.budget += m.tokens
        seq.computed = 0
        seq.preemptions += 1
        seq.waiting_since = self._iteration
        self._running.remove(seq)
        bisect.insort(self._waiting, seq, key=lambda s: s.order)
        st.decide(seq, "preempt", reason)


@dataclass
class _PlanState:
    budget: int
    members: dict[str, Member] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    allocated: int = 0
    freed: int = 0

    def decide(self, seq: _Seq, action: str, reason: str) -> None:
        self.decisions.append(Decision(seq.request_id, action, reason))
