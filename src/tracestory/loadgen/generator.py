"""Streaming load against an OpenAI-compatible HTTP server: every request timed, none lost.

Arrivals
--------
* ``target_qps``: an open-loop Poisson process. Inter-arrival gaps are exponential with mean
  ``1 / target_qps`` drawn from ``numpy.random.default_rng(seed)``; arrivals are planned up
  front for ``[0, duration)`` (capped at ``num_requests``) and sent on schedule whether or not
  earlier requests have answered, so a slow server builds a queue instead of slowing the load.
* ``concurrency``: ``N`` workers, each sending its next request when the previous one ends,
  until ``duration`` has passed or ``num_requests`` have been started.

Prompt lengths are uniform integers in ``[prompt_len_min, prompt_len_max]`` from a second
stream of the same seed (``default_rng([seed, 1])``), so two runs with one seed send the same
prompts. A prompt of ``n`` tokens is ``tracestory.serve.prompt_of_tokens(n, seed)`` when the
reference server package provides it (its tokenizer makes it exactly ``n`` tokens), else ``n``
space-separated short words (about ``n`` tokens for common BPE tokenizers).

Per request
-----------
Times are ``time.perf_counter_ns()`` offsets from the run start. A streamed chunk whose text
(``choices[0].text``; chat: ``choices[0].delta.content``) is non-empty is one token event:
TTFT = first token event - send; ITL = gaps between consecutive token events (a server that
packs several tokens in one chunk shows one event); E2E = ``data: [DONE]`` - send. Token
counts come from the stream's ``usage`` object when the server sends one
(``stream_options.include_usage`` is asked for), else output = token events and input = the
planned prompt length; each record says which.

Failures (``error_kind``): ``connection_refused``, ``connection_error`` (other connect
failures), ``http_status`` (with ``http_status``), ``timeout`` (no ``[DONE]`` within
``timeout_s`` of the send), ``malformed_stream`` (not ``text/event-stream``, a line that is
not SSE, a data payload that is not a JSON object, or the stream ended without ``[DONE]``),
``stream_error`` (the server put an ``error`` object in the stream), ``server_disconnect``
(connection closed or reset mid-response), ``cancelled`` (still pending at the global
deadline ``duration + timeout`` or at Ctrl-C), ``other``.

Guarantees: the run ends by the global deadline; every planned request (open loop) or started
request (concurrency) has exactly one record, because records are built at the end from one
state object per request, whatever state each task reached. On Ctrl-C the run stops, the
unfinished requests are recorded as ``cancelled`` and the result is returned with
``interrupted=True``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ToolNotFound, UsageError

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
ERROR_KINDS = ("connection_refused", "connection_error", "http_status", "timeout", "malformed_stream",
               "stream_error", "server_disconnect", "cancelled", "other")


@dataclass(frozen=True)
class LoadConfig:
    url: str                                  # server base URL, e.g. http://127.0.0.1:8000
    model: str
    endpoint: str = "completions"             # "completions" | "chat"
    target_qps: float | None = None           # open loop (exactly one of target_qps / concurrency)
    concurrency: int | None = None            # closed loop
    duration_s: float = 60.0
    num_requests: int | None = None
    prompt_len_min: int = 512
    prompt_len_max: int = 1024
    max_new_tokens: int = 512
    seed: int = 0
    slo_ttft_s: float | None = 0.5
    slo_itl_s: float | None = 0.05
    timeout_s: float = 30.0
    ignore_eos: bool = False                  # send vLLM's ``ignore_eos`` (exact output lengths)

    @property
    def mode(self) -> str:
        return "poisson" if self.target_qps is not None else "concurrency"

    @property
    def request_url(self) -> str:
        return self.url.rstrip("/") + ENDPOINTS[self.endpoint]

    def validate(self) -> None:
        if (self.target_qps is None) == (self.concurrency is None):
            raise UsageError("load: expected exactly one of --target-qps or --concurrency")
        if self.endpoint not in ENDPOINTS:
            raise UsageError(f"load: expected --endpoint completions or chat, found {self.endpoint!r}")
        if not self.url.startswith(("http://", "https://")):
            raise UsageError(f"load: expected an http:// or https:// URL, found {self.url!r}")
        checks = [("--target-qps", self.target_qps, 0), ("--concurrency", self.concurrency, 0),
                  ("--duration", self.duration_s, 0), ("--timeout", self.timeout_s, 0),
                  ("--num-requests", self.num_requests, 0), ("--prompt-len-min", self.prompt_len_min, 0),
                  ("--max-new-tokens", self.max_new_tokens, 0)]
        for flag, v, lo in checks:
            if v is not None and not (v > lo and math.isfinite(v)):
                raise UsageError(f"load: expected {flag} > {lo}, found {v}")
        if self.prompt_len_max < self.prompt_len_min:
            raise UsageError(f"load: expected --prompt-len-max >= --prompt-len-min ({self.prompt_len_min}), "
                             f"found {self.prompt_len_max}")


@dataclass(frozen=True)
class RequestRecord:
    """One request. Times are ns from the run start; ``None`` = did not happen / unknown."""

    index: int
    scheduled_ns: int | None        # planned send time (open loop); None under concurrency
    send_ns: int | None             # None: never sent
    end_ns: int | None              # [DONE], failure or cancellation time
    ok: bool
    error_kind: str | None          # one of ERROR_KINDS, None when ok
    http_status: int | None
    error: str | None
    ttft_ns: int | None
    itl_ns: tuple[int, ...]
    e2e_ns: int | None              # only for ok requests
    prompt_tokens: int
    prompt_tokens_source: str       # "usage" | "planned"
    output_tokens: int
    output_tokens_source: str       # "usage" | "chunks"
    response_id: str | None

    @property
    def failure_key(self) -> str | None:
        """What the summary counts this failure under: the kind, or ``http_<code>``."""
        if self.ok:
            return None
        if self.error_kind == "http_status" and self.http_status is not None:
            return f"http_{self.http_status}"
        return self.error_kind

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "itl_ns": list(self.itl_ns)}


@dataclass(frozen=True)
class LoadProgress:
    planned: int | None             # None under concurrency without --num-requests
    sent: int
    finished: int
    ok: int
    failed: int


@dataclass(frozen=True)
class LoadResult:
    config: LoadConfig
    records: tuple[RequestRecord, ...]
    t0_unix_ns: int                 # wall-clock time of the run start (offset 0)
    elapsed_ns: int                 # run start to the last request's end (or the deadline)
    send_window_ns: int             # window in which requests were started (duration or less)
    interrupted: bool               # Ctrl-C
    deadline_hit: bool              # requests were still pending at duration + timeout


# ------------------------------------------------------------------ planning


def arrival_offsets_ns(target_qps: float, duration_s: float, seed: int, cap: int | None = None) -> np.ndarray:
    """Poisson arrival times (ns from start) in ``[0, duration)``, at most ``cap`` of them."""
    rng = np.random.default_rng(seed)
    mean = 1.0 / target_qps
    expected = target_qps * duration_s
    times = np.empty(0)
    t = 0.0
    while t < duration_s and (cap is None or times.size < cap):
        # Draw in blocks sized for the expected count; another block only when needed.
        block = rng.exponential(mean, size=int(expected + 6 * math.sqrt(expected) + 16))
        new = t + np.cumsum(block)
        times = np.concatenate([times, new])
        t = float(new[-1])
    times = times[times < duration_s]
    if cap is not None:
        times = times[:cap]
    return np.round(times * 1e9).astype(np.int64)


class PromptLengths:
    """Prompt length of request ``i``: uniform integers from ``default_rng([seed, 1])``, drawn in
    index order, so the sequence does not depend on the arrival mode or the timing."""

    def __init__(self, lo: int, hi: int, seed: int):
        self._rng = np.random.default_rng([seed, 1])
        self._lo, self._hi = lo, hi
        self._values = np.empty(0, dtype=np.int64)

    def __getitem__(self, i: int) -> int:
        while i >= self._values.size:
            self._values = np.concatenate([self._values, self._rng.integers(self._lo, self._hi + 1, size=1024)])
        return int(self._values[i])


_WORDS = ("the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "as", "with", "be", "at")


def _fallback_prompt(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), size=n))


def prompt_function() -> Callable[[int, int], str]:
    """The reference server's prompt-of-N-tokens rule when it exists, else the word fallback."""
    try:
        from ..serve import prompt_of_tokens  # type: ignore[attr-defined]
    except ImportError:
        return _fallback_prompt
    return prompt_of_tokens


def request_body(cfg: LoadConfig, prompt: str) -> dict:
    body: dict = {"model": cfg.model, "max_tokens": cfg.max_new_tokens, "stream": True,
                  "stream_options": {"include_usage": True}}
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    return body


# ------------------------------------------------------------------ one request


class _Malformed(Exception):
    pass


class _StreamError(Exception):
    pass


class _State:
    """Mutable progress of one request; turned into a RequestRecord at the end of the run."""

    __slots__ = (
        "done",
        "end_ns",
        "error",
        "http_status",
        "index",
        "kind",
        "planned_prompt",
        "response_id",
        "scheduled_ns",
        "send_ns",
        "token_ns",
        "usage_output",
        "usage_prompt",
    )

    def __init__(self, index: int, scheduled_ns: int | None, planned_prompt: int):
        self.index, self.scheduled_ns, self.planned_prompt = index, scheduled_ns, planned_prompt
        self.send_ns = self.end_ns = self.http_status = self.usage_prompt = self.usage_output = None
        self.kind = self.error = self.response_id = None
        self.token_ns: list[int] = []
        self.done = False

    def fail(self, kind: str, message: str, now: int, http_status: int | None = None) -> None:
        self.kind, self.error, self.http_status, self.end_ns = kind, message, http_status, now

    def record(self, cancel_reason: str, now: int) -> RequestRecord:
        kind, error, end = self.kind, self.error, self.end_ns
        ok = self.done and kind is None
        if not ok and kind is None:  # never finished: the run stopped it
            kind, end = "cancelled", now
            error = cancel_reason if self.send_ns is not None else f"{cancel_reason}; never sent"
        tok = self.token_ns
        ttft = tok[0] - self.send_ns if tok and self.send_ns is not None else None
        itl = tuple(int(x) for x in np.diff(np.asarray(tok, dtype=np.int64))) if len(tok) > 1 else ()
        prompt_src = "usage" if isinstance(self.usage_prompt, int) else "planned"
        out_src = "usage" if isinstance(self.usage_output, int) else "chunks"
        return RequestRecord(
            index=self.index, scheduled_ns=self.scheduled_ns, send_ns=self.send_ns, end_ns=end, ok=ok,
            error_kind=None if ok else kind, http_status=self.http_status, error=None if ok else error,
            ttft_ns=ttft, itl_ns=itl, e2e_ns=end - self.send_ns if ok else None,
            prompt_tokens=self.usage_prompt if prompt_src == "usage" else self.planned_prompt,
            prompt_tokens_source=prompt_src,
            output_tokens=self.usage_output if out_src == "usage" else len(tok),
            output_tokens_source=out_src, response_id=self.response_id)


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
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            st.usage_prompt = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            st.usage_output = usage["completion_tokens"]
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


async def _one_request(session, cfg: LoadConfig, body: dict, st: _State, clock: Callable[[], int]) -> None:
    import aiohttp

    st.send_ns = clock()
    try:
        async with asyncio.timeout(cfg.timeout_s):
            async with session.post(cfg.request_url, json=body, headers={"Accept": "text/event-stream"}) as resp:
                if resp.status != 200:
                    try:
                        text = (await resp.content.read(400)).decode("utf-8", "replace")
                    except (aiohttp.ClientError, ConnectionError):
                        text = ""
                    st.fail("http_status", f"HTTP {resp.status}: {text.strip()[:200]}", clock(), resp.status)
                    return
                ctype = resp.headers.get("Content-Type", "")
                if "text/event-stream" not in ctype:
                    raise _Malformed(f"expected Content-Type text/event-stream, found {ctype or 'none'!r}")
                await _consume_sse(resp, st, cfg.endpoint == "chat", clock)
    except TimeoutError:
        st.fail("timeout", f"no [DONE] within --timeout {cfg.timeout_s:g} s of the send", clock())
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


def run_load(cfg: LoadConfig, progress: Callable[[LoadProgress], None] | None = None) -> LoadResult:
    """Run the load and return every request's record. Blocks for at most
    ``duration + timeout`` seconds (plus connection teardown)."""
    cfg.validate()
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ToolNotFound("aiohttp", "install the load extra: pip install 'tracestory[load]'") from None
    return asyncio.run(_run(cfg, progress))


async def _run(cfg: LoadConfig, progress: Callable[[LoadProgress], None] | None) -> LoadResult:
    import aiohttp

    make_prompt = prompt_function()
    lengths = PromptLengths(cfg.prompt_len_min, cfg.prompt_len_max, cfg.seed)
    start = time.perf_counter_ns()
    t0_unix = time.time_ns()
    clock = lambda: time.perf_counter_ns() - start
    duration_ns = int(cfg.duration_s * 1e9)
    deadline_s = cfg.duration_s + cfg.timeout_s
    states: list[_State] = []
    tasks: set[asyncio.Task] = set()
    counts = {"sent": 0, "finished": 0, "ok": 0}
    planned: int | None = cfg.num_requests if cfg.mode == "concurrency" else None

    def report() -> None:
        if progress is not None:
            progress(LoadProgress(planned, counts["sent"], counts["finished"], counts["ok"],
                                  counts["finished"] - counts["ok"]))

    async def send(session, st: _State) -> None:
        # The prompt seed mixes the run seed and the index: distinct prompts, reproducible.
        body = request_body(cfg, make_prompt(st.planned_prompt, cfg.seed * 1_000_003 + st.index))
        counts["sent"] += 1
        report()
        await _one_request(session, cfg, body, st, clock)
        counts["finished"] += 1
        counts["ok"] += st.done and st.kind is None
        report()

    interrupted = deadline_hit = False
    cancel_reason = "cancelled"
    connector = aiohttp.TCPConnector(limit=0)
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
    try:
        async with asyncio.timeout(deadline_s):
            if cfg.mode == "poisson":
                offsets = arrival_offsets_ns(cfg.target_qps, cfg.duration_s, cfg.seed, cfg.num_requests)
                planned = int(offsets.size)
                states.extend(_State(i, int(o), lengths[i]) for i, o in enumerate(offsets))
                report()
                for st in states:
                    delay = (st.scheduled_ns - clock()) / 1e9
                    if delay > 0:
                        await asyncio.sleep(delay)
                    t = asyncio.create_task(send(session, st))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
            else:
                next_index = 0

                async def worker() -> None:
                    nonlocal next_index
                    while clock() < duration_ns and (cfg.num_requests is None or next_index < cfg.num_requests):
                        st = _State(next_index, None, lengths[next_index])
                        next_index += 1
                        states.append(st)
                        await send(session, st)

                for _ in range(cfg.concurrency):
                    t = asyncio.create_task(worker())
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))
    except TimeoutError:
        deadline_hit = True
        cancel_reason = f"cancelled at the global deadline (duration + timeout = {deadline_s:g} s)"
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task; finish the records
        interrupted = True
        cancel_reason = "cancelled by interrupt"
    finally:
        pending = list(tasks)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await session.close()
    now = clock()
    records = tuple(st.record(cancel_reason, now) for st in states)
    ends = [r.end_ns for r in records if r.end_ns is not None]
    sends = [r.send_ns for r in records if r.send_ns is not None]
    send_window = duration_ns if not interrupted else min(duration_ns, now)
    if cfg.num_requests is not None and sends and len(records) >= cfg.num_requests:
        send_window = min(send_window, max(sends)) or send_window
    return LoadResult(config=cfg, records=records, t0_unix_ns=t0_unix, elapsed_ns=max(ends, default=now),
                      send_window_ns=int(send_window), interrupted=interrupted, deadline_hit=deadline_hit)
