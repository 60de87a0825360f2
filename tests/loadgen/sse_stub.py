"""A stub OpenAI-style SSE server for the load generator's tests: request number k (arrival
order) behaves as its behaviour table says (a normal stream, HTTP 500/429, plain JSON, a slow
answer, a disconnect, bad JSON, an error object, a non-SSE line, no [DONE]); a body with
``"stream": false`` gets one JSON completion of ``max_tokens`` words. The usage object is
``{"prompt_tokens": 1000 + k % 24, "completion_tokens": max_tokens}`` (under 1024: a count the
load generator's bounds accept for a short prompt) unless ``usages[k]`` replaces it (a server
reporting nonsense)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
from aiohttp import web


class Stub:
    """Streams ``max_tokens`` chunks; request number k (0-based, arrival order) behaves as
    ``behaviors.get(k, "ok")``."""

    def __init__(self, behaviors=None, usage=True, delay_s=0.001, usages=None):
        self.behaviors, self.usage, self.delay_s, self.usages = behaviors or {}, usage, delay_s, usages or {}
        self.n = 0
        self.bodies = []

    async def handle(self, request):
        body = await request.json()
        k, self.n = self.n, self.n + 1
        self.bodies.append(body)
        b = self.behaviors.get(k, "ok")
        chat = request.path.endswith("/chat/completions")
        if b == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if b == "429":
            return web.json_response({"error": {"message": "slow down"}}, status=429)
        if b == "json":
            return web.json_response({"choices": [{"text": "x"}]})
        if b == "slow":
            await asyncio.sleep(5)
        if body.get("stream") is False:   # one JSON completion: max_tokens words, usage when asked
            await asyncio.sleep(self.delay_s * body["max_tokens"])
            text = "".join(f" t{i}" for i in range(body["max_tokens"]))
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            doc = {"id": f"c{k}", "choices": [choice]}
            if self.usage:
                doc["usage"] = self.usages.get(k, {"prompt_tokens": 1000 + k % 24,
                                                   "completion_tokens": body["max_tokens"]})
            return web.json_response(doc)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj):
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        if chat:  # role-only first delta: not a token
            await send({"id": f"c{k}", "choices": [{"delta": {"role": "assistant"}}]})
        for i in range(body["max_tokens"]):
            await asyncio.sleep(self.delay_s)
            await resp.write(b": keep-alive\n\n")
            piece = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
            await send({"id": f"c{k}", "choices": [piece]})
            if b == "disconnect" and i == 1:
                request.transport.close()
                return resp
        if b == "badjson":
            await resp.write(b"data: {not json\n\n")
        if b == "stream_error":
            await send({"error": {"message": "engine died"}})
        if b == "notsse":
            await resp.write(b"hello there\n\n")
        if self.usage:
            await send({"choices": [], "usage": self.usages.get(k, {"prompt_tokens": 1000 + k % 24,
                                                                     "completion_tokens": body["max_tokens"]})})
        if b != "nodone":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture(name="stub_server")
def stub_server_fixture():
    """Start a Stub in a background event loop; yields (start(stub) -> url)."""
    started = []

    def start(stub: Stub, port: int = 0, routes=()) -> str:
        """``routes``: extra ``(method, path, handler)`` (the profile endpoints of a fake server)."""
        app = web.Application()
        app.router.add_post("/v1/completions", stub.handle)
        app.router.add_post("/v1/chat/completions", stub.handle)
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        loop.run_until_complete(runner.setup())
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        loop.run_until_complete(web.SockSite(runner, sock).start())
        threading.Thread(target=loop.run_forever, daemon=True).start()
        started.append((loop, runner))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for loop, runner in started:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
