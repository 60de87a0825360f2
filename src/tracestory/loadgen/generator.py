"""Streaming load against an OpenAI-compatible HTTP server: every request timed, none lost.

Arrivals and bounds (:mod:`.config`, :mod:`.arrivals`, :mod:`.backoff`)
-------------------------------------------------------------------------
Requests are planned up front at the times of :func:`~.arrivals.arrival_offsets_ns` (at most
``max_requests`` of them; an infinite rate with only a duration plans them one by one as slots
free up, a closed loop) and sent in index order when due, each once a slot is free: at most
``max_concurrency`` (else ``max_in_flight``) requests are in flight, so neither the number of
tasks nor the memory grows with the rate. A request waiting for a slot is sent late; its record
keeps both the planned (``scheduled_ns``) and the real send time. After a *connection refused*
sending pauses (:class:`~.backoff.RefusalBackoff`). With ``duration_s`` no request is sent once
the window ``[0, duration)`` has closed; those left are *not sent*.

Per request
-----------
Times are ``time.perf_counter_ns()`` offsets from the run start. A streamed chunk whose text
(``choices[0].text``; chat: ``choices[0].delta.content``) is non-empty is one token event:
TTFT = first token event - send; ITL = gaps between consecutive token events (a server that
packs several tokens in one chunk shows one event); E2E = ``data: [DONE]`` - send. Token
counts come from the stream's ``usage`` object when the server sends one
(``stream_options.include_usage`` is asked for), else output = token events and input = the
planned prompt length; each record says which. A ``usage`` that fails :func:`.usage.check_usage`
is never used: the request is the failure ``bad_usage``, its error naming the field and the bound.

Non-streaming (``--no-stream``): one JSON response per request (``choices[0].text``; chat:
``choices[0].message.content``). E2E = the whole response read - send; TTFT, ITL and TPOT are
not measured (None: the client sees every token at once). Output tokens come from ``usage``,
else from the text counted by the prompt source's rule (``output_tokens_source`` ``"text"``).

Outcomes (``error_kind``): None (OK); failures of a sent request: ``connection_refused``,
``connection_error`` (other connect failures), ``http_status`` (with ``http_status``),
``timeout`` (no ``[DONE]`` within ``timeout_s`` of the send), ``malformed_stream`` (not
``text/event-stream``, a line that is not SSE, a data payload that is not a JSON object, or the
stream ended without ``[DONE]``; without streaming, a response that is not a JSON completion),
``stream_error`` (the server put an ``error`` object in the stream), ``server_disconnect`` (connection closed or
reset mid-response), ``bad_usage`` (the response completed but its ``usage`` is not a credible count for the
request: negative, not an integer, far more completion tokens than ``max_tokens``, a prompt count far from ours;
:mod:`.usage` states the bounds), ``cancelled`` (in
flight at the global deadline ``duration + timeout`` or at Ctrl-C), ``other``; and
``not_sent``: planned, never sent (the window closed, the deadline, Ctrl-C). ``not_sent`` is not
a failure.

Guarantees: every planned request has exactly one record, handed to ``on_record`` as soon as it
is known (when the request ends; the not-sent and cancelled ones when the run stops), so a
caller that streams them to disk loses none. The run ends by the global deadline when there is
a duration. On Ctrl-C the run stops, in-flight requests are recorded as ``cancelled``, the
rest as ``not_sent``, and the result is returned with ``interrupted=True``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ToolNotFound
from .arrivals import arrival_offsets_ns, ramp_offsets_ns
from .backoff import RefusalBackoff
from .body import request_body
from .config import LoadConfig
from .datasets import Prompt, PromptSource, TokenizerChoice, load_tokenizer
from .prompts import prompt_source
from .usage import check_usage, choices_per_request

ERROR_KINDS = ("connection_refused", "connection_error", "http_status", "timeout", "malformed_stream",
               "stream_error", "server_disconnect", "bad_usage", "cancelled", "other", "not_sent")


@dataclass(frozen=True)
class RequestRecord:
    """One planned request. Times are ns from the run start; ``None`` = did not happen / unknown."""

    index: int
    scheduled_ns: int | None        # planned send time; None in a closed loop
    send_ns: int | None             # None: never sent
    end_ns: int | None              # [DONE], failure or cancellation time
    ok: bool
    error_kind: str | None          # one of ERROR_KINDS, None when ok
    http_status: int | None
    error: str | None
    ttft_ns: int | None
    itl_ns: tuple[int, ...]
    e2e_ns: int | None              # only for ok requests
    prompt_tokens: int              # 0 when never sent
    prompt_tokens_source: str       # "usage" | "planned" | "none"
    output_tokens: int
    output_tokens_source: str       # "usage" | "chunks" | "text" (non-streaming) | "none"
    response_id: str | None

    @property
    def sent(self) -> bool:
        return self.send_ns is not None

    @property
    def failure_key(self) -> str | None:
        """What the summary counts this failure under: the kind, or ``http_<code>``; None when
        OK or never sent."""
        if self.ok or self.error_kind == "not_sent":
            return None
        if self.error_kind == "http_status" and self.http_status is not None:
            return f"http_{self.http_status}"
        return self.error_kind

    @property
    def tpot_ns(self) -> float | None:
        """Time per output token after the first: ``(e2e - ttft) / (output_tokens - 1)``; 0 for
        an OK request of one token (as vLLM counts it), None when not OK."""
        if not self.ok or self.e2e_ns is None or self.ttft_ns is None:
            return None
        return (self.e2e_ns - self.ttft_ns) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "itl_ns": list(self.itl_ns)}


@dataclass(frozen=True)
class LoadProgress:
    planned: int | None             # None in a closed loop with only a duration
    sent: int
    finished: int
    ok: int
    failed: int


@dataclass(frozen=True)
class LoadResult:
    config: LoadConfig
    records: tuple[RequestRecord, ...]
    t0_unix_ns: int                 # wall-clock time of the run start (offset 0)
    elapsed_ns: int                 # run start to the last request's end (or the stop)
    send_window_ns: int             # window in which requests were sent
    interrupted: bool               # Ctrl-C
    deadline_hit: bool              # requests were still in flight at duration + timeout
    capped_at: int | None = None    # planning stopped at --max-requests
    waited_for_slot: int = 0        # requests that found every slot taken when due
    prompts: TokenizerChoice | None = None
    inexact_prompts: int = 0        # prompts whose token length could not be made exact
    dataset_reused: bool = False    # the dataset's pairs were used more than once
    refusal_probes: int = 0         # probes sent while backing off after connection refused


# ------------------------------------------------------------------ one request


class _Malformed(Exception):
    pass


class _StreamError(Exception):
    pass


class _State:
    """Mutable progress of one sent request; turned into its RequestRecord when it ends."""

    __slots__ = (
        "choices",
        "done",
        "end_ns",
        "error",
        "exact",
        "http_status",
        "index",
        "kind",
        "max_tokens",
        "planned_prompt",
        "prompt_bytes",
        "rec",
        "response_id",
        "scheduled_ns",
        "send_ns",
        "text_tokens",
        "token_ns",
        "usage_output",
        "usage_prompt",
    )

    def __init__(self, index: int, scheduled_ns: int | None, prompt: Prompt, exact: bool = False, choices: int = 1):
        self.index, self.scheduled_ns, self.planned_prompt = index, scheduled_ns, prompt.prompt_len
        self.max_tokens, self.prompt_bytes, self.exact = prompt.output_len, len(prompt.text.encode()), exact
        self.choices = choices
        self.send_ns = self.end_ns = self.http_status = None
        self.usage_prompt: object = None        # as the server sent it (checked in record())
        self.usage_output: object = None
        self.kind = self.error = self.response_id = self.rec = None
        self.token_ns: list[int] = []
        self.text_tokens: int | None = None     # non-streaming: output tokens counted from the text
        self.done = False

    def fail(self, kind: str, message: str, now: int, http_status: int | None = None) -> None:
        self.kind, self.error, self.http_status, self.end_ns = kind, message, http_status, now

    def record(self, stop_reason: str, now: int) -> RequestRecord:
        kind, error, end = self.kind, self.error, self.end_ns
        ok = self.done and kind is None
        if not ok and kind is None:  # never finished: the run stopped it
            if self.send_ns is None:
                return not_sent_record(self.index, self.scheduled_ns, stop_reason)
            kind, end, error = "cancelled", now, f"cancelled: {stop_reason}"
        tok = self.token_ns
        bad = None
        if self.usage_prompt is not None or self.usage_output is not None:
            bad = check_usage(self.usage_prompt, self.usage_output, max_tokens=self.max_tokens,
                              planned_prompt=self.planned_prompt, prompt_bytes=self.prompt_bytes, exact=self.exact,
                              token_events=len(tok) if self.text_tokens is None else None, choices=self.choices)
            if bad is not None and ok:      # a completed request with a count we cannot believe
                ok, kind, error = False, "bad_usage", bad
        ttft = tok[0] - self.send_ns if tok and self.send_ns is not None else None
        itl = tuple(int(x) for x in np.diff(np.asarray(tok, dtype=np.int64))) if len(tok) > 1 else ()
        prompt_src = "usage" if bad is None and self.usage_prompt is not None else "planned"
        out_src = "usage" if bad is None and self.usage_output is not None else \
            "chunks" if self.text_tokens is None else "text"
        return RequestRecord(
            index=self.index, scheduled_ns=self.scheduled_ns, send_ns=self.send_ns, end_ns=end, ok=ok,
            error_kind=None if ok else kind, http_status=self.http_status, error=None if ok else error,
            ttft_ns=ttft, itl_ns=itl, e2e_ns=end - self.send_ns if ok else None,
            prompt_tokens=self.usage_prompt if prompt_src == "usage" else self.planned_prompt,
            prompt_tokens_source=prompt_src,
            output_tokens={"usage": self.usage_output, "text": self.text_tokens}.get(out_src, len(tok)),
            output_tokens_source=out_src, response_id=self.response_id)


def not_sent_record(index: int, scheduled_ns: int | None, reason: str) -> RequestRecord:
    """The record of a planned request that was never sent."""
    return RequestRecord(index=index, scheduled_ns=scheduled_ns, send_ns=None, end_ns=None, ok=False,
                         error_kind="not_sent", http_status=None, error=f"not sent: {reason}", ttft_ns=None,
                         itl_ns=(), e2e_ns=None, prompt_tokens=0, prompt_tokens_source="none", output_tokens=0,
                         output_tokens_source="none", response_id=None)


def _take_usage(usage: object, st: _State) -> None:
    """Keep the counts of a ``usage`` object as sent (``null`` or absent: not reported); they are
    checked when the record is made."""
    if isinstance(usage, dict):
        if usage.get("prompt_tokens") is not None:
            st.usage_prompt = usage["prompt_tokens"]
        if usage.get("completion_tokens") is not None:
            st.usage_output = usage["completion_tokens"]


def _on_event(data: bytes, t: int, st: _State, chat: bool) -> bool:
    """Handle one SSE data payload; True at ``[DONE]``."""
    if data.strip() == b"[DONE]":
        return True
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise _Malformed(f"data payload is not JSON: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise _Malformed(f"data payload is not a JSON object: {data[:80]!r}")
    if obj.get("error") is not None:
        err = obj["error"]
        raise _StreamError(str(err.get("message", err) if isinstance(err, dict) else err)[:300])
    if st.response_id is None and isinstance(obj.get("id"), str):
        st.response_id = obj["id"]
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c = choices[0]
        text = (c.get("delta") or {}).get("content") if chat else c.get("text")
        if text:
            st.token_ns.append(t)
    _take_usage(obj.get("usage"), st)
    return False


async def _consume_sse(resp, st: _State, chat: bool, clock: Callable[[], int]) -> None:
    data: list[bytes] = []
    data_t = 0
    async for raw in resp.content:
        t = clock()
        line = raw.rstrip(b"\r\n")
        if not line:  # blank line: dispatch the event
            if data:
                if _on_event(b"\n".join(data), data_t, st, chat):
                    st.done, st.end_ns = True, data_t
                    return
                data = []
            continue
        if line.startswith(b":"):  # SSE comment / keep-alive
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            if not data:
                data_t = t
            data.append(value[1:] if value.startswith(b" ") else value)
        elif name not in (b"event", b"id", b"retry"):
            raise _Malformed(f"not an SSE line: {line[:80]!r}")
    if data and _on_event(b"\n".join(data), data_t, st, chat):
        st.done, st.end_ns = True, data_t
        return
    raise _Malformed("stream ended without data: [DONE]")


async def _consume_json(resp, st: _State, chat: bool, count: Callable[[str], int], clock: Callable[[], int]) -> None:
    """A non-streaming response: one JSON completion."""
    ctype = resp.headers.get("Content-Type", "")
    if "json" not in ctype:
        raise _Malformed(f"expected Content-Type application/json, found {ctype or 'none'!r}")
    raw = await resp.read()
    t = clock()
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _Malformed(f"response is not JSON: {raw[:80]!r}") from None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Malformed(f"response has no choices: {raw[:80]!r}")
    c = choices[0]
    text = (c.get("message") or {}).get("content") if chat else c.get("text")
    if isinstance(obj.get("id"), str):
        st.response_id = obj["id"]
    _take_usage(obj.get("usage"), st)
    st.text_tokens = count(text) if isinstance(text, str) else 0
    st.done, st.end_ns = True, t


async def _one_request(session, cfg: LoadConfig, body: dict, st: _State, clock: Callable[[], int],
                       count: Callable[[str], int]) -> None:
    import aiohttp

    st.send_ns = clock()
    accept = "text/event-stream" if cfg.stream else "application/json"
    try:
        async with asyncio.timeout(cfg.timeout_s):
            async with session.post(cfg.request_url, json=body, headers={"Accept": accept}) as resp:
                if resp.status != 200:
                    try:
                        text = (await resp.content.read(400)).decode("utf-8", "replace")
                    except (aiohttp.ClientError, ConnectionError):
                        text = ""
                    st.fail("http_status", f"HTTP {resp.status}: {text.strip()[:200]}", clock(), resp.status)
                    return
                if not cfg.stream:
                    await _consume_json(resp, st, cfg.chat, count, clock)
                    return
                ctype = resp.headers.get("Content-Type", "")
                if "text/event-stream" not in ctype:
                    raise _Malformed(f"expected Content-Type text/event-stream, found {ctype or 'none'!r}")
                await _consume_sse(resp, st, cfg.chat, clock)
    except TimeoutError:
        what = "[DONE]" if cfg.stream else "response"
        st.fail("timeout", f"no {what} within --timeout {cfg.timeout_s:g} s of the send", clock())
    except aiohttp.ClientConnectorError as e:
        refused = isinstance(getattr(e, "os_error", None), ConnectionRefusedError)
        st.fail("connection_refused" if refused else "connection_error", str(e), clock())
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError,
            ConnectionError) as e:
        st.fail("server_disconnect", f"{type(e).__name__}: {e}", clock())
    except _Malformed as e:
        st.fail("malformed_stream", str(e), clock())
    except _StreamError as e:
        st.fail("stream_error", f"server error in stream: {e}", clock())
    except ValueError as e:  # aiohttp: an SSE line longer than its buffer limit
        st.fail("malformed_stream", f"unreadable stream: {e}", clock())
    except aiohttp.ClientError as e:
        st.fail("connection_error", f"{type(e).__name__}: {e}", clock())
    except Exception as e:  # noqa: BLE001  one request's bug must not end the run
        st.fail("other", f"{type(e).__name__}: {e}", clock())


# ------------------------------------------------------------------ the run


def planned_offsets_ns(cfg: LoadConfig):
    """The planned send times (None in a closed loop planned as slots free up)."""
    if cfg.ramp_up_strategy is not None:
        return ramp_offsets_ns(cfg.ramp_up_strategy, cfg.ramp_up_start_rps, cfg.ramp_up_end_rps,
                               count=cfg.planned_count, burstiness=cfg.burstiness, seed=cfg.seed,
                               duration_s=cfg.duration_s)
    if cfg.open_ended:
        return None
    return arrival_offsets_ns(cfg.request_rate, burstiness=cfg.burstiness, seed=cfg.seed,
                              duration_s=cfg.duration_s, count=cfg.planned_count)


def run_load(cfg: LoadConfig, progress: Callable[[LoadProgress], None] | None = None,
             on_record: Callable[[RequestRecord], None] | None = None,
             prompts: PromptSource | None = None) -> LoadResult:
    """Run the load and return every planned request's record (see the module docstring).
    With a duration, blocks for at most ``duration + timeout`` seconds (plus teardown)."""
    cfg.validate()
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ToolNotFound("aiohttp", "install the load extra: pip install 'tracestory[load]'") from None
    if prompts is None:
        prompts = prompt_source(cfg, load_tokenizer(cfg.tokenizer))
    prompts[0]  # a dataset with nothing usable is refused here, before anything is sent
    return asyncio.run(_run(cfg, prompts, progress, on_record))


async def _run(cfg: LoadConfig, prompts: PromptSource, progress, on_record) -> LoadResult:
    import aiohttp

    start = time.perf_counter_ns()
    t0_unix = time.time_ns()

    def clock() -> int:
        return time.perf_counter_ns() - start

    window_ns = round(cfg.duration_s * 1e9) if cfg.duration_s is not None else None
    deadline_s = cfg.duration_s + cfg.timeout_s if cfg.duration_s is not None else None
    offsets = planned_offsets_ns(cfg)
    planned = None if offsets is None else int(offsets.size)
    capped = offsets is not None and offsets.size == cfg.max_requests and (
        (cfg.num_requests or 0) > cfg.max_requests
        or (cfg.num_requests is None and cfg.duration_s is not None))
    states: list[_State] = []
    tasks: set[asyncio.Task] = set()
    slot = asyncio.Semaphore(cfg.in_flight_limit)
    backoff = RefusalBackoff(clock=lambda: clock() / 1e9)
    counts = {"sent": 0, "finished": 0, "ok": 0, "waited": 0}
    stop_reason = "the run ended"
    choices = choices_per_request(cfg.extra_body)   # sequences per request: the usage sums them

    def report() -> None:
        if progress is not None:
            progress(LoadProgress(planned, counts["sent"], counts["finished"], counts["ok"],
                                  counts["finished"] - counts["ok"]))

    def emit(rec: RequestRecord) -> None:
        if on_record is not None:
            on_record(rec)

    def window_closed() -> bool:
        return window_ns is not None and clock() >= window_ns

    async def send(session, st: _State, body: dict, probe: bool) -> None:
        counts["sent"] += 1
        report()
        try:
            await _one_request(session, cfg, body, st, clock, prompts.count)
        finally:
            slot.release()
            backoff.outcome(st.kind == "connection_refused", probe)
        st.rec = st.record(stop_reason, clock())
        counts["finished"] += 1
        counts["ok"] += st.rec.ok
        emit(st.rec)
        report()

    async def dispatch(session) -> None:
        nonlocal capped, stop_reason
        i = 0
        while True:
            if offsets is not None:
                if i >= offsets.size:
                    return
                due: int | None = int(offsets[i])
                delay = (due - clock()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
            elif i >= cfg.max_requests:
                capped = True
                return
            else:
                due = None
            if window_closed():
                stop_reason = "the send window (--duration) closed"
                return
            if slot.locked():
                counts["waited"] += 1
            await slot.acquire()
            probe = await backoff.admit(latest=window_ns / 1e9 if window_ns is not None else None)
            if window_closed():
                slot.release()
                if probe:
                    backoff.release_unused()
                stop_reason = "the send window (--duration) closed"
                return
            prompt = prompts[i]
            st = _State(i, due, prompt, exact=prompts.choice.exact, choices=choices)
            states.append(st)
            t = asyncio.create_task(send(session, st, request_body(cfg, prompt), probe))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1

    interrupted = deadline_hit = False
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=None))
    report()
    try:
        async with asyncio.timeout(deadline_s):
            await dispatch(session)
            while tasks:
                await asyncio.wait(set(tasks))
    except TimeoutError:
        deadline_hit = True
        stop_reason = f"the global deadline (duration + timeout = {deadline_s:g} s)"
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task; finish the records
        interrupted = True
        stop_reason = "interrupted"
    finally:
        pending = list(tasks)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await session.close()
    now = clock()
    records = []
    for st in states:
        if st.rec is None:
            st.rec = st.record(stop_reason, now)
            emit(st.rec)
        records.append(st.rec)
    for i in range(len(states), planned or 0):
        rec = not_sent_record(i, int(offsets[i]), stop_reason)
        emit(rec)
        records.append(rec)
    ends = [r.end_ns for r in records if r.end_ns is not None]
    sends = [r.send_ns for r in records if r.send_ns is not None]
    window = window_ns if window_ns is not None else max(sends, default=0)
    if interrupted:
        window = min(window, now)
    if sends and not any(r.error_kind == "not_sent" for r in records):
        window = min(window, max(sends)) or window
    return LoadResult(config=cfg, records=tuple(records), t0_unix_ns=t0_unix, elapsed_ns=max(ends, default=now),
                      send_window_ns=int(window), interrupted=interrupted, deadline_hit=deadline_hit,
                      capped_at=cfg.max_requests if capped else None, waited_for_slot=counts["waited"],
                      prompts=prompts.choice, inexact_prompts=prompts.inexact, dataset_reused=prompts.reused,
                      refusal_probes=backoff.probes)
