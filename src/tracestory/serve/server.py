"""The OpenAI-compatible HTTP front end (aiohttp) over the engine thread (:mod:`.engine`).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming as SSE
``data: {...}`` chunks ending with ``data: [DONE]``, or one JSON response), ``GET /health``
(200 while the engine thread runs and makes progress, else 503 with ``status`` and ``reason``;
a failed event log is named in the 200 answer, see below), ``GET /v1/models`` (the served model names),
``GET /v1/models/{id}`` (one of them; 404 with an OpenAI error for another id),
``GET /metrics`` (Prometheus text format, :mod:`.metrics`; 501 without prometheus-client),
``POST /start_profile`` / ``POST /stop_profile`` (torch.profiler into ``--profiler-dir``,
:mod:`.profiling`; 404 without it, as vLLM's).
Prompts follow the token rule of :mod:`.tokens` (one token per word, or a list of token ids).
Request fields used: ``model``, ``prompt`` / ``messages``, ``max_tokens`` (chat also
``max_completion_tokens``; default 16), ``stream``, ``ignore_eos``. Decoding is greedy: a field
asking for something else (``temperature`` > 0, ``logprobs``, ``tools``, ``response_format``,
stop strings, ``n`` > 1, an unknown field, ...) is answered 400 naming it, never ignored
(:mod:`.request_fields`).

Model names: a request whose ``model`` is not one of the served names gets HTTP 404
(``NotFoundError``, "The model `X` does not exist.", as vLLM answers); a request without
``model`` is served by the first name. Responses carry the first served name.

Streams: one chunk per generated token (completions: ``choices[0].text = " t<id>"``; chat:
``choices[0].delta.content``, the first one also carrying ``role``), then a last chunk with
``finish_reason`` and ``usage`` ({prompt,completion,total}_tokens), then ``[DONE]``. A request
that fails after the stream started gets a ``data: {"error": {...}}`` chunk before ``[DONE]``.
Errors are OpenAI-shaped ``{"error": {"message", "type", "param", "code"}}``: 400 for every client
mistake (body not JSON or nested too deep, any field of the wrong type: :mod:`.request_body`),
404 for an unknown model, 408 when a body does not arrive within the idle timeout, 413 for a
body over ``max_request_bytes``, 429 (``Retry-After``) when ``max_num_seqs + max_waiting``
requests are already admitted, 503 (``Retry-After``) while shutting down or when the bodies being
read pass ``max_inflight_bytes`` (:mod:`.admission`), 504 when the per-request deadline
(``request_timeout_s``, from admission) passes (a stream gets an error chunk and ``[DONE]``; the
request is cancelled in the engine, its KV blocks freed), 500 only for an engine error or an
injected failure. Connections: :mod:`.guard` (idle/header timeout, connection limit).

Failure injection (``fail_rate`` F, for tests of a load generator's error accounting): the k-th
accepted request (k = 1, 2, ..., completions and chat counted together) fails with HTTP 500
before any token iff ``floor(k·F) > floor((k-1)·F)``: exactly ``floor(N·F)`` of the first N
fail, evenly spread (F = 0.5: every second request). It is logged as arrival + finish ``error``.

A client that disconnects cancels its handler, which aborts the request in the engine (finish
``cancelled``), streaming or not: aiohttp cancels the handler when the connection is lost
(``handler_cancellation``), and a handler also looks at its transport at every token and every
:data:`POLL_S` seconds of waiting, so a whole (non-streaming) response is cancelled, its KV
blocks freed, even where that cancellation does not come (older aiohttp, a connection aiohttp
has not yet seen close).

A stalled engine (:mod:`.progress`: one step, e.g. a forward waiting in a collective for a
stopped tensor-parallel rank, running longer than ``stall_timeout_s``): ``/health`` answers 503
``{"status": "stalled", "reason": ...}``, a new request gets 503 with the reason and
``Retry-After``, and a request waiting for tokens is cancelled within :data:`POLL_S` seconds
(503 with the reason; a stream gets an error chunk and ``[DONE]``) instead of hanging. When the
step returns, ``/health`` is 200 again.

A failed event-log write (full disk) ends the log, not the server (:mod:`.eventlog`): ``/health``
stays 200 and adds ``"event_log": {"error": ..., "lines_lost": N}``; ``/metrics`` counts the lost
lines (``tracestory:event_log_lines_lost_total``).

Shutdown (SIGINT/SIGTERM, or :meth:`ServerHandle.stop`): the engine stops after the current
iteration, in-flight requests finish as ``cancelled`` (their streams get an error chunk and
``[DONE]``), the listener closes and the event log is closed. A stalled engine is given 2 s,
not 30, to end its step (it will not: the process exits with the step still waiting).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .admission import RETRY_AFTER_S, Admission
from .engine import Engine
from .guard import LISTEN_BACKLOG, ConnectionGuard, default_max_connections
from .metrics import MISSING_HINT
from .profiling import ProfilerError, ServerProfiler
from .request_body import BadRequest, load_json, parse_request
from .request_fields import unsupported_field
from .scheduler import Finish, request_problem
from .tokens import token_text

POLL_S = 0.5       # a handler waiting for tokens checks its client and the engine's progress this often

# ---------------------------------------------------------------------------- HTTP
@dataclass(frozen=True)
class ServerLimits:
    """What one client, or all of them together, may take (the ``tracestory serve`` flags)."""

    max_waiting: int = 64                  # admitted beyond max_num_seqs before 429
    max_connections: int | None = None     # None: below the open-file limit (guard.default_max_connections)
    idle_timeout_s: float = 15.0           # no complete request head for this long: connection closed
    request_timeout_s: float = 600.0       # from admission to the last token; then cancelled, KV freed
    max_request_bytes: int = 8 * 2**20     # one body (413 above)
    max_inflight_bytes: int = 64 * 2**20   # all bodies being read and parsed (503 above)
    stall_timeout_s: float = 60.0          # one engine step longer than this: /health 503, requests fail (.progress)

    def __post_init__(self):
        for name in ("max_waiting", "max_request_bytes", "max_inflight_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "request_timeout_s", "stall_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerLimits.{name} must be > 0, got {getattr(self, name)}")


def _error(status: int, message: str, etype: str, param: str | None = None, code: int | None = None,
           retry_after: int | None = None):
    from aiohttp import web

    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response({"error": {"message": message, "type": etype, "param": param, "code": code}},
                             status=status, headers=headers)


class Api:
    """The aiohttp handlers over one :class:`Engine`."""

    def __init__(self, engine: Engine, served_model_names: str | Sequence[str], vocab: int, fail_rate: float = 0.0,
                 limits: ServerLimits | None = None, profiler_dir: str | None = None):
        if not 0.0 <= fail_rate <= 1.0:
            raise ValueError(f"fail_rate must be in [0, 1], got {fail_rate}")
        names = (served_model_names,) if isinstance(served_model_names, str) else tuple(served_model_names)
        if not names:
            raise ValueError("expected at least one served model name")
        self.served_model_names = names
        self.model_name = names[0]
        self.engine, self.vocab, self.fail_rate = engine, vocab, fail_rate
        self.limits = limits or ServerLimits()
        self.admission = Admission(engine.scheduler.config.max_num_seqs + self.limits.max_waiting,
                                   self.limits.max_request_bytes, self.limits.max_inflight_bytes, engine.metrics)
        self._accepted = 0
        self._next_id = 0
        self.created = int(time.time())
        device = str(getattr(getattr(engine, "model", None), "device", "cpu"))
        self.profiler = ServerProfiler(profiler_dir, cuda=device.startswith("cuda")) if profiler_dir else None

    def app(self):
        from aiohttp import web

        # a body over max_request_bytes is refused by _read_body first; aiohttp's own cap backs it up
        app = web.Application(client_max_size=self.limits.max_request_bytes)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model_id:.+}", self.model_info)
        app.router.add_post("/start_profile", self.start_profile)
        app.router.add_post("/stop_profile", self.stop_profile)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request):
        from aiohttp import web

        if not self.engine.alive:
            return web.json_response({"status": "unavailable", "reason": self._down_reason()}, status=503)
        why = self.engine.stalled(self.limits.stall_timeout_s)
        if why is not None:
            return web.json_response({"status": "stalled", "reason": why}, status=503)
        body: dict = {"status": "ok"}
        log = self.engine.log
        if log.failure is not None:
            body["event_log"] = {"error": log.failure, "lines_lost": log.lines_lost}
        return web.json_response(body)

    def _down_reason(self) -> str:
        err = getattr(self.engine, "error", None)
        return f"engine failed: {err!r}" if err is not None else "server shutting down"

    async def models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "tracestory"}
            for name in self.served_model_names]})

    async def model_info(self, request):
        """``GET /v1/models/{id}``: the model object, or 404 as for a request naming an unknown model."""
        from aiohttp import web

        name = request.match_info["model_id"]
        if name not in self.served_model_names:
            return _error(404, f"The model `{name}` does not exist.", "NotFoundError", "model", code=404)
        return web.json_response({"id": name, "object": "model", "created": self.created, "owned_by": "tracestory"})

    async def start_profile(self, request):
        return await self._profile(start=True)

    async def stop_profile(self, request):
        return await self._profile(start=False)

    async def _profile(self, *, start: bool):
        """Start or stop torch.profiler off the event loop (:mod:`.profiling`)."""
        from aiohttp import web

        if self.profiler is None:
            return _error(404, "profiling is off: start tracestory serve with --profiler-dir DIR",
                          "NotFoundError", code=404)
        loop = asyncio.get_running_loop()
        try:
            if start:
                await loop.run_in_executor(None, self.profiler.start)
                return web.json_response({"status": "started", "folder": str(self.profiler.folder)})
            path = await loop.run_in_executor(None, self.profiler.stop)
        except ProfilerError as e:
            return _error(e.status, str(e), "invalid_request_error" if e.status < 500 else "server_error",
                          code=e.status)
        return web.json_response({"status": "stopped", "trace": str(path)})

    async def metrics(self, request):
        from aiohttp import web

        m = self.engine.metrics
        if m is None:
            return web.Response(status=501, text=MISSING_HINT + "\n")
        body, content_type = m.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat(self, request):
        return await self._handle(request, chat=True)

    def _inject_failure(self) -> bool:
        self._accepted += 1
        k, f = self._accepted, self.fail_rate
        # tiny epsilon: 0.1 * 10 is 0.9999999999999999 in floating point
        return math.floor(k * f + 1e-9) > math.floor((k - 1) * f + 1e-9)

    # ------------------------------------------------------------------ one request
    async def _read_body(self, request):
        """The parsed request (:class:`CompletionRequest`), or an error response to send."""
        from aiohttp import web

        adm = self.admission
        reserved, status, message = adm.reserve_body(request.content_length)
        if status is not None:
            return _error(status, message, "invalid_request_error" if status == 413 else "server_error",
                          retry_after=RETRY_AFTER_S if status == 503 else None)
        try:
            raw = await asyncio.wait_for(request.read(), self.limits.idle_timeout_s)
            body = load_json(raw)
        except (asyncio.TimeoutError, web.HTTPRequestEntityTooLarge) as e:
            too_big = isinstance(e, web.HTTPRequestEntityTooLarge)
            adm.refuse("body_too_large" if too_big else "timeout")
            return _error(413 if too_big else 408,
                          f"the request body is larger than {self.limits.max_request_bytes} bytes" if too_big else
                          f"the request body did not arrive within {self.limits.idle_timeout_s:g} s",
                          "invalid_request_error")
        except BadRequest as e:
            adm.refuse("bad_request")
            return _error(400, str(e), "invalid_request_error", e.param)
        except ConnectionError:
            # the client left before its body was whole (fewer bytes than its Content-Length): no one
            # is left to answer; counted, and the handler ends without a traceback
            adm.refuse("client_gone")
            return _error(400, "the request body ended before its Content-Length", "invalid_request_error")
        finally:
            adm.release_body(reserved)
        try:
            req = parse_request(body, chat=request.path.endswith("/chat/completions"), vocab=self.vocab)
            if req.model and req.model not in self.served_model_names:
                adm.refuse("unknown_model")
                return _error(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model", code=404)
            refused = unsupported_field(body, chat=request.path.endswith("/chat/completions"))
            if refused is not None:
                raise refused
            problem = request_problem(self.engine.scheduler.config, len(req.prompt_ids), req.max_new_tokens)
            if problem is not None:
                raise BadRequest(problem, "max_tokens")
        except BadRequest as e:
            adm.refuse("bad_request")
            return _error(400, str(e), "invalid_request_error", e.param)
        return req

    async def _handle(self, request, *, chat: bool):
        from aiohttp import web

        if not self.engine.alive:
            self.admission.refuse("shutting_down")
            return _error(503, "server shutting down", "server_error", retry_after=RETRY_AFTER_S)
        why = self.engine.stalled(self.limits.stall_timeout_s)
        if why is not None:
            self.admission.refuse("stalled")
            return _error(503, why, "server_error", retry_after=RETRY_AFTER_S)
        req = await self._read_body(request)
        if isinstance(req, web.StreamResponse):
            return req
        ids, max_new = req.prompt_ids, req.max_new_tokens
        self._next_id += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self._next_id}"
        if not self.engine.alive:
            self.admission.refuse("shutting_down")
            return _error(503, "server shutting down", "server_error", retry_after=RETRY_AFTER_S)
        if self.fail_rate > 0 and self._inject_failure():
            log = self.engine.log
            log.arrival(log.now_ns(), rid, len(ids), max_new, req.ignore_eos)
            log.finish(log.now_ns(), Finish(rid, "error", len(ids), 0, "injected failure (fail_rate)"))
            return _error(500, f"injected failure for {rid} (fail_rate {self.fail_rate:g})", "server_error")
        if not self.admission.try_admit():
            return _error(429, f"{self.admission.max_admitted} requests admitted (max_num_seqs + max_waiting); "
                               "retry later", "rate_limit_error", retry_after=RETRY_AFTER_S, code=429)
        q: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def sink(kind, payload) -> None:          # called on the engine thread
            try:
                loop.call_soon_threadsafe(q.put_nowait, (kind, payload))
            except RuntimeError:                  # the event loop is already closed: nobody listens
                pass

        deadline = loop.time() + self.limits.request_timeout_s
        self.engine.submit(rid, ids, max_new, req.ignore_eos, sink)
        try:
            if req.stream:
                return await self._stream(request, q, rid, chat, len(ids), deadline)
            return await self._whole(request, q, rid, chat, len(ids), deadline)
        except asyncio.CancelledError:
            self.engine.abort(rid)            # client went away: free its blocks
            raise
        except ConnectionError:               # found gone while waiting or writing: nobody reads an answer
            self.engine.abort(rid)
            return web.Response(status=499, text="client closed the connection")   # aiohttp drops it quietly
        finally:
            self.admission.done()

    async def _next(self, request, q: asyncio.Queue, rid: str, deadline: float):
        """The next engine item. A client whose connection is gone raises ``ConnectionResetError``
        (looked at on every call and every :data:`POLL_S` seconds of waiting; the caller aborts
        the request); after :data:`POLL_S` seconds without an item a stalled engine cancels the
        request and returns a ``finish`` item with the reason; at the deadline the request is
        cancelled (its KV blocks freed) and a ``finish`` item says so."""
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client disconnected")
        if not q.empty():
            return q.get_nowait()
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - loop.time()
            try:
                return await asyncio.wait_for(q.get(), max(min(left, POLL_S), 0.0))
            except asyncio.TimeoutError:
                pass
            if loop.time() >= deadline:
                why = f"request deadline of {self.limits.request_timeout_s:g} s passed"
                self.engine.abort(rid, why)
                self.admission.refuse("timeout")
                return "finish", Finish(rid, "timeout", 0, 0, why)
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("client disconnected")
            why = self.engine.stalled(self.limits.stall_timeout_s)
            if why is not None:
                self.engine.abort(rid, why)
                self.admission.refuse("stalled")
                return "finish", Finish(rid, "cancelled", 0, 0, why)

    def _chunk(self, rid: str, chat: bool, text: str | None, finish: str | None, first: bool) -> dict:
        if chat:
            delta = {} if text is None else ({"role": "assistant", "content": text} if first else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": self.created,
                "model": self.model_name, "choices": [choice]}

    @staticmethod
    def _usage(prompt_tokens: int, n_out: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": n_out, "total_tokens": prompt_tokens + n_out}

    async def _stream(self, request, q, rid, chat, prompt_tokens, deadline):
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj) -> None:
            await resp.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

        n_out = 0
        while True:
            kind, payload = await self._next(request, q, rid, deadline)
            if kind == "token":
                await send(self._chunk(rid, chat, token_text(payload), None, first=n_out == 0))
                n_out += 1
                continue
            fin: Finish = payload
            if fin.reason in ("length", "stop"):
                last = self._chunk(rid, chat, None, fin.reason, first=False)
                last["usage"] = self._usage(prompt_tokens, n_out)
                await send(last)
            else:
                await send({"error": {"message": f"request {fin.reason}: {fin.error}", "type": "server_error",
                                      "param": None, "code": None}})
            await send(b"[DONE]")
            break
        await resp.write_eof()
        return resp

    async def _whole(self, request, q, rid, chat, prompt_tokens, deadline):
        from aiohttp import web

        tokens = []
        while True:
            kind, payload = await self._next(request, q, rid, deadline)
            if kind == "token":
                tokens.append(payload)
                continue
            fin: Finish = payload
            break
        if fin.reason not in ("length", "stop"):
            status = {"cancelled": 503, "timeout": 504}.get(fin.reason, 500)
            return _error(status, f"request {fin.reason}: {fin.error}", "server_error",
                          retry_after=RETRY_AFTER_S if status == 503 else None)
        text = "".join(token_text(t) for t in tokens)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": fin.reason} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": fin.reason})
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": self.created, "model": self.model_name, "choices": [choice],
                                  "usage": self._usage(prompt_tokens, len(tokens))})


# ---------------------------------------------------------------------------- running it
@dataclass
class ServerHandle:
    """A server started by :func:`start_in_thread`: ``url`` and :meth:`stop`."""

    url: str
    engine: Engine
    _loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event
    _thread: threading.Thread

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)


async def serve_app(engine: Engine, api: Api, host: str, port: int, *, stop: asyncio.Event,
                    ready: Callable[[str], None] | None = None, install_signals: bool = True,
                    handler_cancellation: bool = True) -> None:
    """Listen on ``host:port`` (0: any free port) until ``stop`` is set (or SIGINT/SIGTERM when
    ``install_signals``), then shut down: engine first, then the listener, then the log.
    ``handler_cancellation=False`` (tests of the handlers' own transport check) keeps aiohttp
    from cancelling a handler whose client left."""
    import signal

    from aiohttp import web

    limits = api.limits
    runner = web.AppRunner(api.app(), handler_cancellation=handler_cancellation, access_log=None, shutdown_timeout=5.0,
                           keepalive_timeout=limits.idle_timeout_s)
    await runner.setup()
    loop = asyncio.get_running_loop()
    listener = None
    try:
        guard = ConnectionGuard(runner.server, limits.max_connections or default_max_connections(),
                                api.admission.refuse, head_timeout_s=limits.idle_timeout_s)
        listener = await loop.create_server(guard, host, port, backlog=LISTEN_BACKLOG)
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        engine.start()
        bound = listener.sockets[0].getsockname()
        if ready is not None:
            h = bound[0] if ":" not in bound[0] else f"[{bound[0]}]"
            ready(f"http://{h}:{bound[1]}")
        await stop.wait()
    finally:
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        # a stalled engine (a forward waiting on a stopped rank) will not end its step: do not wait for it
        stalled = engine.stalled(limits.stall_timeout_s) is not None
        await loop.run_in_executor(None, engine.stop, 2.0 if stalled else 30.0)
        if listener is not None:
            listener.close()
        await runner.cleanup()
        engine.log.close()


def start_in_thread(engine: Engine, api: Api, host: str = "127.0.0.1", port: int = 0,
                    timeout_s: float = 30.0, *, handler_cancellation: bool = True) -> ServerHandle:
    """Run the server on its own event-loop thread (no signal handlers); returns once listening."""
    got: dict = {}
    ready_evt = threading.Event()

    def main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        got["loop"], got["stop"] = loop, stop

        def ready(url: str) -> None:
            got["url"] = url
            ready_evt.set()

        try:
            loop.run_until_complete(serve_app(engine, api, host, port, stop=stop, ready=ready, install_signals=False,
                                              handler_cancellation=handler_cancellation))
        except BaseException as e:  # noqa: BLE001 -- handed to the starting thread, which raises
            got["error"] = e
            ready_evt.set()
        finally:
            loop.close()

    t = threading.Thread(target=main, name="tracestory-http", daemon=True)
    t.start()
    if not ready_evt.wait(timeout_s) or "error" in got:
        raise RuntimeError(f"server did not start on {host}:{port}: {got.get('error', 'timeout')!r}")
    return ServerHandle(got["url"], engine, got["loop"], got["stop"], t)
