"""``tracestory.region(name)``: one marker for every recorder.

A region is a named span of the workload (``"BENCHMARK"``, ``"decode_step"``). Entering it

1. notifies the capture listeners (the ``tracestory capture torch --range NAME`` controller
   starts or stops torch.profiler here, or calls ``cudaProfilerStart/Stop`` under nsys/ncu);
2. pushes an NVTX range in the default domain, so ``nsys --capture-range=nvtx
   --nvtx-capture NAME`` and ``ncu --nvtx --nvtx-include "NAME/"`` see it (the ``nvtx``
   package when installed, else ``torch.cuda.nvtx`` when CUDA is available);
3. opens a ``torch.profiler.record_function(name)`` when torch is already imported and a
   torch profiler is recording, so the region shows up as a ``user_annotation`` in Kineto.

Exit undoes the three in reverse order, so a profiler the listener starts at entry sees the
whole region, and one it stops at exit sees the region closed.

Cost: when nothing records, an enter/exit pair is a few attribute reads plus the NVTX
push/pop (a no-op call into libnvtx without an attached tool). torch is never imported
here: it is looked up in ``sys.modules``, so marking a workload does not load torch.

Limits: the NVTX backend is resolved once per process (re-resolved if torch gets imported
later); a ``region`` object used as a context manager is not reentrant across threads (make
one per use); used as a decorator it opens a fresh region per call.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from typing import Any, Callable, Protocol


class RegionListener(Protocol):
    """Told about every region entry and exit (before NVTX on entry, after it on exit)."""

    def on_enter(self, name: str) -> None: ...

    def on_exit(self, name: str) -> None: ...

    # optional: ``on_exit_raised(name)`` instead of ``on_exit`` when an exception leaves the region


_listeners: list[RegionListener] = []

# NVTX backend: (push, pop) or None; resolved lazily. _nvtx_saw_torch records whether torch
# was loaded when we resolved, so a later torch import can still enable torch.cuda.nvtx.
_nvtx: tuple[Callable[[str], Any], Callable[[], Any]] | None = None
_nvtx_resolved = False
_nvtx_saw_torch = False


_notes: dict[str, int] = {}


def note(key: str, ns: int) -> None:
    """Record that ``ns`` nanoseconds of the workload's thread went to one part of a region, for
    whoever times the region: ``profiler_ns`` (a recorder: the torch profiler's start or stop, so
    its time is not read as the engine's), or a part of the server's launch (``plan_send_ns``,
    ``input_wait_ns``, ``replay_ns``). The server adds the notes to the iteration's event-log line
    (:func:`take_notes`). Summed per key until taken; a process that never takes them (a
    tensor-parallel follower) keeps one running sum per key."""
    _notes[key] = _notes.get(key, 0) + int(ns)


@contextlib.contextmanager
def timed(key: str):
    """:func:`note` the time the ``with`` block took (``time.perf_counter_ns``) under ``key``;
    nothing when the block raises (no time is left behind for a later iteration's line)."""
    t = time.perf_counter_ns()
    yield
    note(key, time.perf_counter_ns() - t)


def take_notes() -> dict[str, int]:
    """The notes recorded since the last call (empty when none), and forget them."""
    if not _notes:
        return {}
    out = dict(_notes)
    _notes.clear()
    return out


def add_listener(listener: RegionListener) -> None:
    """Register a capture controller; it is called on every region entry and exit."""
    _listeners.append(listener)


def remove_listener(listener: RegionListener) -> None:
    """Unregister a listener added with :func:`add_listener` (no error if absent)."""
    try:
        _listeners.remove(listener)
    except ValueError:
        pass


def _resolve_nvtx() -> tuple[Callable[[str], Any], Callable[[], Any]] | None:
    global _nvtx, _nvtx_resolved, _nvtx_saw_torch
    torch = sys.modules.get("torch")
    if _nvtx_resolved and (_nvtx is not None or _nvtx_saw_torch or torch is None):
        return _nvtx
    _nvtx_resolved, _nvtx_saw_torch, _nvtx = True, torch is not None, None
    try:
        import nvtx  # the standalone NVIDIA package: works without torch

        _nvtx = (lambda name: nvtx.push_range(message=name), nvtx.pop_range)
        return _nvtx
    except Exception:  # not installed, or its C library failed to load
        pass
    if torch is not None:
        try:
            if torch.cuda.is_available():
                from torch.cuda import nvtx as tnvtx

                _nvtx = (tnvtx.range_push, tnvtx.range_pop)
        except Exception:  # a CPU build has no _nvtx extension
            _nvtx = None
    return _nvtx


def _torch_recording(torch: Any) -> bool:
    try:
        return bool(torch.autograd._profiler_enabled())
    except Exception:
        return False


class region:
    """Context manager and decorator marking a named region of the workload.

    >>> with region("BENCHMARK"):
    ...     step()
    >>> @region("decode_step")
    ... def decode(...): ...
    """

    __slots__ = ("name", "_stack")

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise ValueError(f"region name must be a non-empty string, got {name!r}")
        self.name = name
        self._stack: list[tuple[Callable[[], Any] | None, Any]] = []

    def __enter__(self) -> "region":
        name = self.name
        for listener in tuple(_listeners):
            listener.on_enter(name)
        nv = _resolve_nvtx()
        if nv is not None:
            nv[0](name)
        rf = None
        torch = sys.modules.get("torch")
        if torch is not None and _torch_recording(torch):
            rf = torch.profiler.record_function(name)
            rf.__enter__()
        self._stack.append((nv[1] if nv is not None else None, rf))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        pop, rf = self._stack.pop()
        if rf is not None:
            rf.__exit__(exc_type, exc, tb)
        if pop is not None:
            pop()
        for listener in tuple(_listeners):
            cut = getattr(listener, "on_exit_raised", None) if exc_type is not None else None
            if cut is not None:
                cut(self.name)     # left by an exception: the listener may not count it
            else:
                listener.on_exit(self.name)
        return None

    def __call__(self, fn: Callable) -> Callable:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with region(name):
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"region({self.name!r})"
