"""Connection limit and slow-header defence in front of aiohttp's request handlers.

Header and idle timeouts: the guard closes a connection whose first request head has not
arrived ``head_timeout_s`` after it opened (counted as ``head_timeout``), and aiohttp's own
``keepalive_timeout`` (set by :mod:`.server`) closes a connection idle after a response (recent
aiohttp also starts that timer at connect; the guard's timer does not depend on it). So a socket
that sends half a request line, or nothing, or idles after a response, is closed after
``idle_timeout_s``. A request head that arrived is not timed here (the per-request deadline of
:mod:`.server` is).

The limit: :class:`ConnectionGuard` wraps each accepted connection's protocol and keeps at most
``max_connections`` open. When a new connection would pass the limit, the oldest connection that
has not yet sent a complete request head (``\\r\\n\\r\\n`` seen) is closed to make room, so idle
or slow-header sockets cannot lock out ``/health`` or real clients; when every open connection
has sent its head, the new one gets ``503`` with ``Retry-After`` and is closed. Both count as
refusals (``connection_evicted``, ``connection_limit``). The default limit stays below the
process's open-file limit, so ``accept`` does not fail with "Too many open files".

Limit of the head detection: only the first request head of a connection is looked for; a
keep-alive connection that already sent one is never evicted (aiohttp's idle timeout closes it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

HEAD_END = b"\r\n\r\n"
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s")
_REFUSAL_BODY = (b'{"error": {"message": "too many open connections; retry later", "type": "server_error", '
                 b'"param": null, "code": 503}}')


LISTEN_BACKLOG = 64


def default_max_connections(reserve: int = 64, ceiling: int = 1024) -> int:
    """Room below the open-file limit: ``soft RLIMIT_NOFILE`` minus the files open now, minus
    ``reserve``, minus four listen backlogs (asyncio accepts up to a backlog of sockets per loop
    iteration, and an evicted socket is closed about three iterations after the one that
    replaces it was accepted), at most ``ceiling``, at least 16."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return ceiling
    if soft == resource.RLIM_INFINITY:
        return ceiling
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 64
    return max(16, min(ceiling, soft - open_now - reserve - 4 * LISTEN_BACKLOG))


class _Guarded(asyncio.Protocol):
    """One connection: forwards every protocol call to aiohttp's handler, watching for the head."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self.head_seen = False
        self.evicted = False
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.guard.opened(self):
            body = _REFUSAL_BODY
            transport.write(_REFUSAL % (len(body), body))
            transport.close()
            return
        if self.guard.head_timeout_s is not None:
            self._timer = asyncio.get_running_loop().call_later(self.guard.head_timeout_s, self._head_late)
        self.inner.connection_made(transport)

    def _head_late(self) -> None:
        self._timer = None
        if not self.head_seen and self.transport is not None and not self.transport.is_closing():
            self.guard.refuse("head_timeout")
            self.transport.abort()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if not self.head_seen:
            if HEAD_END in self._tail + data[:3] or HEAD_END in data:
                self.head_seen = True
                self._tail = b""
                self._stop_timer()
            else:
                self._tail = data[-3:]
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        self._stop_timer()
        if self.guard.closed(self):
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """The protocol factory for ``loop.create_server``: aiohttp's factory behind a connection limit."""

    def __init__(self, inner_factory: Callable[[], asyncio.Protocol], max_connections: int,
                 refuse: Callable[[str], None] | None = None, head_timeout_s: float | None = None):
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.inner_factory, self.max_connections = inner_factory, max_connections
        self.head_timeout_s = head_timeout_s
        self._refuse = refuse or (lambda reason: None)
        self._open: dict[_Guarded, None] = {}     # insertion order: oldest first

    def refuse(self, reason: str) -> None:
        self._refuse(reason)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self, self.inner_factory())

    def opened(self, conn: _Guarded) -> bool:
        """Register ``conn``; False when it must be refused."""
        if len(self._open) >= self.max_connections:
            victim = next((c for c in self._open if not c.head_seen), None)
            if victim is None:
                self.refuse("connection_limit")
                return False
            self.refuse("connection_evicted")
            self._open.pop(victim, None)
            victim.transport.abort()          # its connection_lost still reaches aiohttp
            victim.evicted = True
        self._open[conn] = None
        return True

    def closed(self, conn: _Guarded) -> bool:
        """Forget ``conn``; True when aiohttp knew it (it was not refused)."""
        if conn in self._open:
            del self._open[conn]
            return True
        return conn.evicted
