"""Backoff when the server refuses connections, so a closed port is not hammered.

Model: after a request ends with *connection refused*, sending pauses. The next send is a
single **probe** that waits ``first_s`` after the refusal; while the probe is out no other
request is sent. A refused probe doubles the wait (``first_s``, ``2 first_s``, ``4 first_s``, ...
up to ``cap_s``) and sends the next probe after it; a probe that gets any answer from the server
(success, an HTTP error, a broken stream) ends the backoff and sending resumes at the planned
pace. Requests already in flight when the first refusal came are not affected; their own
refusals only start the backoff (they do not lengthen it).

With ``N`` requests in flight when the port closes, at most ``N`` refusals happen before the
pause, then one probe per wait: in ``T`` seconds at most ``N + k`` requests are sent, ``k`` the
number of waits that fit in ``T`` (the limit the tests check).
"""

from __future__ import annotations

import asyncio
import time


class RefusalBackoff:
    """Shared by every sender of a run (one event loop)."""

    def __init__(self, first_s: float = 0.05, cap_s: float = 2.0, clock=time.monotonic):
        self.first_s, self.cap_s, self._clock = first_s, cap_s, clock
        self.wait_s = 0.0               # 0: not backing off
        self.until = 0.0                # clock time before which no probe is sent
        self.refusals = 0               # refusals seen while backing off (run total)
        self.probes = 0
        self._lock = asyncio.Lock()

    @property
    def active(self) -> bool:
        return self.wait_s > 0

    async def admit(self, latest: float | None = None) -> bool:
        """Wait until a request may be sent; True when it goes out as the probe (then
        :meth:`outcome` must be called with ``probe=True``). ``latest``: clock time after
        which the wait is cut short (the caller checks its own window afterwards)."""
        if not self.active:
            return False
        await self._lock.acquire()
        if not self.active:             # the previous probe ended the backoff
            self._lock.release()
            return False
        delay = self.until - self._clock()
        if latest is not None:
            delay = min(delay, latest - self._clock())
        if delay > 0:
            await asyncio.sleep(delay)
        self.probes += 1
        return True

    def release_unused(self) -> None:
        """The admitted probe was not sent (the window closed): let the next sender probe."""
        self.probes -= 1
        self._lock.release()

    def outcome(self, refused: bool, probe: bool) -> None:
        """Report how a request ended: ``refused`` = connection refused."""
        if refused:
            self.refusals += 1
            if probe:
                self.wait_s = min(self.cap_s, max(self.first_s, self.wait_s * 2))
                self.until = self._clock() + self.wait_s
            elif not self.active:
                self.wait_s = self.first_s
                self.until = self._clock() + self.wait_s
        elif probe:
            self.wait_s = 0.0
        if probe:
            self._lock.release()
