"""Worker processes that decode a large Kineto trace's chunks while this process reads the text.

Model
-----
One decoding thread cannot keep up with inflating: per byte of JSON, msgspec's typed decode and
building columns from its structs cost about twice what ``zlib`` does. So for a large trace the
reading process only inflates and cuts the events array into chunks
(:func:`~.kineto_text.stream_document`); each chunk's bytes go to one of :func:`decode_workers`
worker processes, which decodes it and builds its columns exactly as a one-process read would
(:func:`~.kineto._decode_part`: the chunk's own string pool, warnings and counters), and the
results are merged in file order (:meth:`~.kineto._Builder.merge`). At most ``workers + 1``
chunks are in flight, so memory stays bounded by a few chunks beside the kept columns.

How many workers
----------------
``TRACESTORY_KINETO_WORKERS`` (an integer; ``1`` or ``0`` keeps the one-process read). Default
:data:`DEFAULT_WORKERS`: **1, the one-process read**, chosen by measurement (docs/PERFORMANCE.md,
"Worker processes"): on the shared 2-core VM the workers cost 20-50% more CPU (results pickled
back, the last chunk decoded here while the workers idle) and gave no wall time back under load.
Since the compiled scanner (:mod:`.kineto_native`) decodes a chunk in about a third of the time,
the workers are slower than one process even on a quiet machine (107 MiB: 0.63 s of load against
0.35 s), so the one-process read is the only one worth having where the scanner is built.
A larger default is never more than the CPUs this process may use. With workers asked for, none:

* for a trace of less than :data:`MIN_TEXT_BYTES` of JSON (from the file size, or for gzip the
  stream's own size field): starting workers would cost more than it saves;
* in a process that is itself a worker (a rank read in parallel by :mod:`tracestory.parallel`
  already uses every core).

Workers start from a ``forkserver`` on Linux (it imports this module once; each worker is a fork
of it, not of the reading process and its threads) and with ``spawn`` elsewhere. They ignore
SIGINT (the reader stops them); a worker that dies fails the parallel read, which the caller
then does again in one process.

Limits
------
Exactness is kept by not being clever: a chunk that a worker cannot decode as one JSON array
(the cut fell inside a string, the text is damaged) or any other failure of the parallel read
makes the caller read the whole file again in one process, which states the damage exactly as
it always has. Damaged large files therefore cost two reads.
"""

from __future__ import annotations

import os
import signal
import stat
import struct
import sys
from pathlib import Path
from typing import Any, Callable

WORKERS_ENV = "TRACESTORY_KINETO_WORKERS"
DEFAULT_WORKERS = 1
MIN_TEXT_BYTES = 48 << 20
MIN_TEXT_ENV = "TRACESTORY_KINETO_WORKERS_MIN_BYTES"  # for tests: the size threshold


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def text_bytes(path: Path, size: int) -> int:
    """The JSON text's size: the file's, or for gzip the last member's ISIZE field (the size
    modulo 4 GiB; taken as at least the compressed size)."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(size - 4)
            return max(struct.unpack("<I", f.read(4))[0], size)
    except OSError:
        return size


def decode_workers(path: Path, env: dict | None = None) -> int:
    """How many worker processes decode ``path`` (0: decode in this process). See the module doc."""
    env = os.environ if env is None else env
    text = env.get(WORKERS_ENV, "").strip()
    try:
        wanted = int(text) if text else DEFAULT_WORKERS
    except ValueError:
        wanted = DEFAULT_WORKERS
    if not text:
        wanted = min(wanted, _usable_cpus())
    if wanted <= 1:
        return 0
    import multiprocessing   # here, not at the top: the default one-process read never needs it (start-up)

    if multiprocessing.parent_process() is not None:
        return 0
    try:
        minimum = int(env.get(MIN_TEXT_ENV, "") or MIN_TEXT_BYTES)
    except ValueError:
        minimum = MIN_TEXT_BYTES
    try:
        st = os.stat(path)
    except OSError:
        return 0
    if not stat.S_ISREG(st.st_mode):   # never open a FIFO or a device here (opening one may block)
        return 0
    return wanted if text_bytes(path, st.st_size) >= minimum else 0


def _quiet() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Handle:
    """A submitted chunk: ``get()`` gives its result or re-raises the worker's exception (a
    worker that died raises ``BrokenProcessPool`` instead of leaving the reader waiting)."""

    def __init__(self, future):
        self._future = future

    def get(self):
        return self._future.result()


class ChunkPool:
    """``workers`` processes running ``fn(*args)``; :meth:`submit` returns a handle whose
    ``get()`` gives the result (re-raising a worker's exception).

    Workers come from a ``forkserver`` on Linux (``spawn`` elsewhere): forking the reading process
    itself, which may hold other threads (a server's, a progress bar's, a test runner's) and
    their locks, can leave a child blocked on a lock no thread will release, and a plain
    ``multiprocessing.Pool`` then waits for its result forever."""

    def __init__(self, workers: int, fn: Callable[..., Any]):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload([__name__])  # the server imports the decoder once
        self.fn = fn
        self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_quiet)

    def submit(self, *args) -> _Handle:
        return _Handle(self.pool.submit(self.fn, *args))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ChunkPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Ready:
    """A result computed in this process, with the handle's ``get()``."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value
