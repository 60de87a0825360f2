"""``POST /start_profile`` and ``POST /stop_profile`` of ``tracestory serve --profiler-dir DIR``.

The same endpoints as vLLM (with ``VLLM_TORCH_PROFILER_DIR``) and SGLang, so ``tracestory load
--profile`` and ``vllm bench serve --profile`` drive it. Start opens a ``torch.profiler``
session (CPU, and CUDA when the model is on a GPU; shapes recorded) over **every thread**
(``profile_all_threads``), so the engine thread's iterations are in it; stop closes it and writes
one Kineto trace, ``DIR/tracestory-serve-<pid>-<n>.pt.trace.json`` (written beside and renamed,
so a reader never sees half a file), whose path the answer gives. torch's own check of "is a
profiler recording" is per thread, so :func:`tracestory.region` on the engine thread would not
mark its iterations; a region listener (:class:`RegionMarks`) opens the
``record_function("iteration N")`` there while a session runs. A start while a session runs,
or a stop without one, is a 409; a torch without ``profile_all_threads`` cannot see the engine
thread, so start says so (501) instead of writing an empty trace. Without ``--profiler-dir``
the endpoints answer 404, as vLLM's do without its variable. torch is imported on first start.
The profiler's first start sets Kineto up (about 2 s on a CPU); libkineto wants that done on
the thread that loaded torch, so the server does one empty CPU session when it is built (with
``--profiler-dir`` only), and later starts, off the event loop, take milliseconds.
Limits: one session at a time; under tensor parallelism only the process that answers HTTP
(rank 0) is profiled; the trace holds whatever ran between start and stop (SGLang's
``num_steps`` and other body fields are not read: the body is ignored).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ..capture.region import add_listener, remove_listener


class RegionMarks:
    """A region listener: on a thread where torch's per-thread profiler flag is off, each region
    entry opens ``torch.profiler.record_function(name)`` (recorded by a profiler over every
    thread) and its exit closes it. A region entered before the listener was added is skipped."""

    def __init__(self, torch):
        self.torch = torch
        self._local = threading.local()

    def _stack(self) -> list:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def on_enter(self, name: str) -> None:
        if self.torch.autograd._profiler_enabled():   # region() marks it itself on this thread
            return
        rf = self.torch.profiler.record_function(name)
        rf.__enter__()
        self._stack().append((name, rf))

    def on_exit(self, name: str) -> None:
        stack = self._stack()
        if stack and stack[-1][0] == name:
            stack.pop()[1].__exit__(None, None, None)


class ProfilerError(Exception):
    """A start or stop that cannot be done: ``status`` is the HTTP answer."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ServerProfiler:
    """One torch.profiler session at a time, traces written into ``folder``."""

    def __init__(self, folder: str | os.PathLike, cuda: bool):
        self.folder = Path(folder)
        self.cuda = cuda
        self._lock = threading.Lock()
        self._session = None
        self._marks: RegionMarks | None = None
        self._count = 0
        self._set_up()

    @staticmethod
    def _set_up() -> None:
        """One empty CPU session on the building thread (module docstring)."""
        from torch.profiler import ProfilerActivity, profile

        session = profile(activities=[ProfilerActivity.CPU])
        session.start()
        session.stop()

    @property
    def running(self) -> bool:
        return self._session is not None

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        with self._lock:
            if self._session is not None:
                raise ProfilerError(409, "the profiler is already running; POST /stop_profile first")
            try:
                config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
            except (AttributeError, TypeError):
                raise ProfilerError(501, f"torch {torch.__version__} has no profile_all_threads: its profiler "
                                         "cannot see the engine thread") from None
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            session = profile(activities=activities, record_shapes=True, experimental_config=config)
            session.start()
            self._session = session
            self._marks = RegionMarks(torch)
            add_listener(self._marks)

    def stop(self) -> Path:
        with self._lock:
            session, self._session = self._session, None
            if session is None:
                raise ProfilerError(409, "the profiler is not running; POST /start_profile first")
            remove_listener(self._marks)
            self._marks = None
            session.stop()
            self._count += 1
            path = self.folder / f"tracestory-serve-{os.getpid()}-{self._count}.pt.trace.json"
            tmp = path.with_name(path.name + ".partial")
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                session.export_chrome_trace(str(tmp))
                os.replace(tmp, path)
            except OSError as e:
                raise ProfilerError(500, f"{path}: cannot write the trace ({e.strerror or e})") from None
            return path
