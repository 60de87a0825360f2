"""The OpenAI-compatible HTTP front end (aiohttp) and the engine thread behind it.

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming as SSE
``data: {...}`` chunks ending with ``data: [DONE]``, or one JSON response), ``GET /health``
(200 while the engine thread runs, else 503), ``GET /v1/models``. Prompts follow the token rule
of :mod:`tracestory.serve` (one token per word, or a list of token ids). Request fields used:
``prompt`` / ``messages``, ``max_tokens`` (chat also ``max_completion_tokens``; default 16),
``stream``, ``ignore_eos``; ``model`` is accepted whatever it names; sampling fields
(temperature, top_p, stop, ...) are ignored: decoding is greedy. ``n`` must be 1.

Streams: one chunk per generated token (completions: ``choices[0].text = " t<id>"``; chat:
``choices[0].delta.content``, the first one also carrying ``role``), then a last chunk with
``finish_reason`` and ``usage`` ({prompt,completion,total}_tokens), then ``[DONE]``. A request
that fails after the stream started gets a ``data: {"error": {...}}`` chunk before ``[DONE]``.
Errors are OpenAI-shaped ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad
request, 500 for an engine error or an injected failure, 503 while shutting down.

Failure injection (``fail_rate`` F, for tests of a load generator's error accounting): the k-th
accepted request (k = 1, 2, ..., completions and chat counted together) fails with HTTP 500
before any token iff ``floor(k·F) > floor((k-1)·F)``: exactly ``floor(N·F)`` of the first N
fail, evenly spread (F = 0.5: every second request). It is logged as arrival + finish ``error``.

Engine: one thread owns the scheduler and the model. HTTP handlers hand it requests and aborts
through a queue; it runs iterations while there is work, writes the event log, and pushes
tokens into per-request asyncio queues (``call_soon_threadsafe``). A client that disconnects
cancels its handler, which aborts the request (finish ``cancelled``).

Shutdown (SIGINT/SIGTERM, or :meth:`ServerHandle.stop`): the engine stops after the current
iteration, in-flight requests finish as ``cancelled`` (their streams get an error chunk and
``[DONE]``), the listener closes and the event log is closed.
"""

from __future__ import annotations

import asyncio
import json
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import token_text, tokenize
from .eventlog import EventLog
from .scheduler import Finish, RequestRejected, Scheduler, request_problem


class Engine:
    """The engine thread: scheduler + model + event log. Thread-safe :meth:`submit`/:meth:`abort`."""

    def __init__(self, scheduler: Scheduler, model, log: EventLog):
        self.scheduler, self.model, self.log = scheduler, model, log
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

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _finish_now(self, fin: Finish, sink: Callable | None) -> None:
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
                except RequestRejected as e:
                    self._finish_now(Finish(rid, "error", len(prompt), 0, str(e)), sink)
            else:
                fin = self.scheduler.abort(item[1], "cancelled", "client disconnected")
                if fin is not None:
                    self._finish_now(fin, self._sinks.pop(fin.request_id, None))

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
                for rid in result.first_tokens:
                    log.first_token(t_end, rid)
                for rid, tok in result.new_tokens:
                    sink = self._sinks.get(rid)
                    if sink is not None:
                        sink("token", tok)
                for fin in result.finished:
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
            log.flush()


# ---------------------------------------------------------------------------- HTTP
def _error(status: int, message: str, etype: str, param: str | None = None):
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": etype, "param": param, "code": None}},
                             status=status)


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _int_field(body: dict, names: tuple[str, ...], default: int) -> int:
    for name in names:
        if body.get(name) is not None:
            v = body[name]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _BadRequest(f"'{name}' must be an integer >= 1, got {v!r}", name)
            return v
    return default


class Api:
    """The aiohttp handlers over one :class:`Engine`."""

    def __init__(self, engine: Engine, model_name: str, vocab: int, fail_rate: float = 0.0):
        if not 0.0 <= fail_rate <= 1.0:
            raise ValueError(f"fail_rate must be in [0, 1], got {fail_rate}")
        self.engine, self.model_name, self.vocab, self.fail_rate = engine, model_name, vocab, fail_rate
        self._accepted = 0
        self._next_id = 0
        self.created = int(time.time())

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request):
        from aiohttp import web

        if self.engine.alive:
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "unavailable"}, status=503)

    async def models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "tracestory"}]})

    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat(self, request):
        return await self._handle(request, chat=True)

    # ------------------------------------------------------------------ parsing
    def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise _BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
            ids = []
            for i, msg in enumerate(msgs):
                content = msg.get("content") if isinstance(msg, dict) else None
                if isinstance(content, list):   # content parts: the text ones
                    content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
                if not isinstance(content, str):
                    raise _BadRequest(f"messages[{i}].content must be a string", "messages")
                ids += tokenize(content, self.vocab)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]            # a batch of one
            if isinstance(prompt, str):
                ids = tokenize(prompt, self.vocab)
            elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                bad = [t for t in prompt if not 0 <= t < self.vocab]
                if bad:
                    raise _BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab})", "prompt")
                ids = list(prompt)
            else:
                raise _BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)",
                                  "prompt")
        if not ids:
            raise _BadRequest("the prompt has no tokens", "messages" if chat else "prompt")
        return ids

    def _inject_failure(self) -> bool:
        self._accepted += 1
        k, f = self._accepted, self.fail_rate
        # tiny epsilon: 0.1 * 10 is 0.9999999999999999 in floating point
        return math.floor(k * f + 1e-9) > math.floor((k - 1) * f + 1e-9)

    # ------------------------------------------------------------------ one request
    async def _handle(self, request, *, chat: bool):
        try:
            try:
                body = await request.json()
            except (ValueError, UnicodeDecodeError):
                raise _BadRequest("the request body is not valid JSON") from None
            if not isinstance(body, dict):
                raise _BadRequest("the request body must be a JSON object")
            ids = self._prompt_ids(body, chat)
            max_new = _int_field(body, ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",), 16)
            if body.get("n") not in (None, 1):
                raise _BadRequest("only n = 1 is supported", "n")
            stream, ignore_eos = bool(body.get("stream", False)), bool(body.get("ignore_eos", False))
            problem = request_problem(self.engine.scheduler.config, len(ids), max_new)
            if problem is not None:
                raise _BadRequest(problem, "max_tokens")
        except _BadRequest as e:
            return _error(400, str(e), "invalid_request_error", e.param)
        self._next_id += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self._next_id}"
        if not self.engine.alive:
            return _error(503, "server shutting down", "server_error")
        if self.fail_rate > 0 and self._inject_failure():
            log = self.engine.log
            log.arrival(log.now_ns(), rid, len(ids), max_new, ignore_eos)
            log.finish(log.now_ns(), Finish(rid, "error", len(ids), 0, "injected failure (fail_rate)"))
            return _error(500, f"injected failure for {rid} (fail_rate {self.fail_rate:g})", "server_error")
        q: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def sink(kind, payload) -> None:          # called on the engine thread
            try:
                loop.call_soon_threadsafe(q.put_nowait, (kind, payload))
            except RuntimeError:                  # the event loop is already closed: nobody listens
                pass

        self.engine.submit(rid, ids, max_new, ignore_eos, sink)
        try:
            if stream:
                return await self._stream(request, q, rid, chat, len(ids))
            return await self._whole(q, rid, chat, len(ids))
        except (asyncio.CancelledError, ConnectionError):
            self.engine.abort(rid)            # client went away: free its blocks
            raise

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

    async def _stream(self, request, q, rid, chat, prompt_tokens):
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj) -> None:
            await resp.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

        n_out = 0
        while True:
            kind, payload = await q.get()
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

    async def _whole(self, q, rid, chat, prompt_tokens):
        from aiohttp import web

        tokens = []
        while True:
            kind, payload = await q.get()
            if kind == "token":
                tokens.append(payload)
                continue
            fin: Finish = payload
            break
        if fin.reason not in ("length", "stop"):
            status = 503 if fin.reason == "cancelled" else 500
            return _error(status, f"request {fin.reason}: {fin.error}", "server_error")
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
                    ready: Callable[[str], None] | None = None, install_signals: bool = True) -> None:
    """Listen on ``host:port`` (0: any free port) until ``stop`` is set (or SIGINT/SIGTERM when
    ``install_signals``), then shut down: engine first, then the listener, then the log."""
    import signal

    from aiohttp import web

    runner = web.AppRunner(api.app(), handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    loop = asyncio.get_running_loop()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        engine.start()
        bound = runner.addresses[0]
        if ready is not None:
            h = bound[0] if ":" not in bound[0] else f"[{bound[0]}]"
            ready(f"http://{h}:{bound[1]}")
        await stop.wait()
    finally:
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        await loop.run_in_executor(None, engine.stop)
        await runner.cleanup()
        engine.log.close()


def start_in_thread(engine: Engine, api: Api, host: str = "127.0.0.1", port: int = 0,
                    timeout_s: float = 30.0) -> ServerHandle:
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
            loop.run_until_complete(serve_app(engine, api, host, port, stop=stop, ready=ready, install_signals=False))
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
