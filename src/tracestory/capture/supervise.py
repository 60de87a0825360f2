"""Run a capture's commands as supervised children, so no signal takes the capture with it.

Model:

* Each command runs in **its own session** (process group). A Ctrl-C typed at the terminal
  reaches ``tracestory capture`` only; the capture forwards exactly one SIGINT to the child's
  group (the profiler in the child then exports what it has), and a SIGTERM or SIGHUP sent to
  the capture is forwarded as SIGTERM. If the child has not exited ``grace_s`` seconds later
  (or the user presses Ctrl-C again) it gets SIGTERM, then SIGKILL.
* While a capture runs, :func:`interrupts_raise` turns SIGINT, SIGTERM and SIGHUP into
  :class:`CaptureInterrupted` (a ``KeyboardInterrupt`` naming the signal), so the capture can
  record what happened; :meth:`InterruptGuard.hold` makes later signals wait until the
  manifest is written.
* On Linux the child gets SIGTERM if the capture itself dies (``PR_SET_PDEATHSIG``), so a
  SIGKILL of the capture still lets the workload's profiler export.
* A child that dies of a signal (SIGSEGV, SIGABRT, SIGKILL) is reported by name.

Limits: signals are handled only when the capture runs on the main thread (elsewhere Python
cannot install handlers, and a Ctrl-C behaves as before); a child in its own session that
reads the terminal is stopped by SIGTTIN (a profiled workload should not read stdin).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Iterator, Mapping, Sequence

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ESCALATION = ("SIGINT", "SIGTERM", "SIGKILL")
_PR_SET_PDEATHSIG = 1


class CaptureInterrupted(KeyboardInterrupt):
    """A stop request that reached the capture: ``signal`` is ``"SIGINT"``, ``"SIGTERM"``..."""

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal = signal_name


def signal_of(exc: BaseException) -> str:
    """The signal behind an interrupt (a plain KeyboardInterrupt is a SIGINT)."""
    return getattr(exc, "signal", "SIGINT")


def describe_exit(code: int) -> str | None:
    """``None`` for 0, else 'killed by SIGSEGV (Segmentation fault)' or 'exit code 3'."""
    if code == 0:
        return None
    if code < 0:
        try:
            sig = signal.Signals(-code)
            return f"killed by {sig.name} ({signal.strsignal(sig)})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def signal_name(code: int) -> str | None:
    """The signal that ended a child (negative return code), else None."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclass
class InterruptGuard:
    """State of :func:`interrupts_raise`: the first stop signal received, and whether
    signals raise now or only get recorded."""

    received: list[str] = field(default_factory=list)
    holding: bool = False
    sealed: bool = False           # hold() was called: holding stays on whatever a writer restores

    @property
    def first(self) -> str | None:
        return self.received[0] if self.received else None

    def hold(self) -> None:
        """From now on signals are recorded, not raised (the manifest is being finished)."""
        self.holding = self.sealed = True


@contextlib.contextmanager
def interrupts_raise() -> Iterator[InterruptGuard]:
    """SIGINT/SIGTERM/SIGHUP raise :class:`CaptureInterrupted` inside the block (main thread
    only; elsewhere the guard is inert). Previous handlers are restored on exit."""
    guard = InterruptGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return

    def handler(signum, _frame):
        name = signal.Signals(signum).name
        guard.received.append(name)
        if not guard.holding:
            raise CaptureInterrupted(name)

    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in STOP_SIGNALS:
        signal.signal(s, handler)
    try:
        yield guard
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _child_setup() -> None:  # runs in the child between fork and exec
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class ChildExit:
    code: int                      # the return code (negative: killed by that signal)
    error: str | None              # why it failed (None for exit code 0)
    signal: str | None             # the signal that killed it, when one did
    interrupted: str | None        # the stop signal the capture received while it ran
    sent: tuple[str, ...]          # signals the capture sent to its group, in order

    @property
    def stop_signal(self) -> str | None:
        return self.sent[-1] if self.sent else None


def _send(proc: subprocess.Popen, name: str) -> bool:
    try:
        os.killpg(proc.pid, getattr(signal, name))
        return True
    except (ProcessLookupError, PermissionError):
        return False


def run_child(argv: Sequence[str], *, grace_s: float, env: Mapping[str, str] | None = None,
              cwd: str | None = None, stdout: IO | None = None) -> ChildExit:
    """Run ``argv`` in its own session and wait for it, forwarding stop signals (see the
    module docstring). An OSError starting it is returned as exit code 127."""
    blocked = threading.current_thread() is threading.main_thread()
    if blocked:   # no interrupt between the start and the wait: it is delivered inside the wait
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env) if env is not None else None,
                                stdout=stdout, start_new_session=True, preexec_fn=_child_setup)
    except OSError as e:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return ChildExit(127, f"{argv[0]}: {e.strerror or e}", None, None, ())
    return _supervise(proc, grace_s, unblock=blocked)


def _supervise(proc: subprocess.Popen, grace_s: float, *, unblock: bool) -> ChildExit:
    interrupted: str | None = None
    sent: list[str] = []
    deadline: float | None = None
    while True:
        try:
            if unblock:
                unblock = False
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            proc.wait(timeout=timeout)
            break
        except subprocess.TimeoutExpired:
            deadline = _escalate(proc, sent, grace_s)
        except KeyboardInterrupt as e:
            sig = signal_of(e)
            if interrupted is None:
                interrupted = sig
                first = "SIGINT" if sig == "SIGINT" else "SIGTERM"
                if _send(proc, first):
                    sent.append(first)
                deadline = time.monotonic() + grace_s
            else:                       # asked again: do not wait out the grace period
                deadline = _escalate(proc, sent, grace_s)
    code = proc.returncode
    return ChildExit(code, describe_exit(code), signal_name(code), interrupted, tuple(sent))


def _escalate(proc: subprocess.Popen, sent: list[str], grace_s: float) -> float | None:
    last = sent[-1] if sent else None
    nxt = _ESCALATION[min(_ESCALATION.index(last) + 1, 2)] if last in _ESCALATION else "SIGTERM"
    if _send(proc, nxt):
        sent.append(nxt)
    return None if nxt == "SIGKILL" else time.monotonic() + grace_s
