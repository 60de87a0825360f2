"""Run one function over many rank files in parallel; only its small results come back.

Model
-----
``map_ranks(paths, fn)`` is a map over files. One task = one file: the task reads the file, calls
``fn(trace)`` on each Trace it holds (one for a Kineto trace, one per process for an nsys report)
and returns ``fn``'s results. An item of ``paths`` is either a
:class:`~tracestory.ingest.ranks.RankSource` from :func:`~tracestory.ingest.ranks.rank_sources`
(read with :func:`~tracestory.ingest.ranks.load_source`, which fills in the rank from the file
name when the trace has none, exactly as :func:`~tracestory.ingest.ranks.load_ranks` does) or a
plain path (read with :func:`tracestory.ingest.load_file`). The Trace itself never
leaves the task, so the parent's memory holds the results only, and each worker holds at most
one rank's tables at a time. ``fn`` should return something small and picklable (a summary
dataclass, not a Trace).

Where the tasks run:

* ``workers=1`` (or a single file): in this process, one file after the other; no pool.
  ``workers=None`` does the same when the files total less than ``SMALL_INPUT_BYTES`` on disk:
  starting a worker (a fresh interpreter importing numpy and tracestory, ~0.3 s) would cost more
  than reading a few small traces.
* default: a ``concurrent.futures.ProcessPoolExecutor`` with ``min(files, usable CPUs)`` worker
  processes started with ``spawn``: workers import tracestory afresh, inherit nothing from the
  parent (no forked locks or threads, no copy-on-write of the parent's memory), and behave the
  same on Linux and macOS. ``fn`` must therefore be picklable by reference: a module-level
  function (checked up front). As with any spawn pool, a script that calls ``map_ranks`` must do
  so under ``if __name__ == "__main__":`` (each worker imports the main module).
* ``dask_address``: the same tasks on a ``dask.distributed`` cluster (``Client(address)``;
  ``"local"`` starts a ``LocalCluster`` of ``workers`` single-threaded worker processes on
  127.0.0.1 and stops it afterwards). Workers open the files by the paths given, so the files
  must be visible to every worker at the same path (a shared file system), and tracestory must be
  installed where the workers run.

Results are in rank order: sorted by ``trace.meta.rank`` (traces without a rank after the
others), ties and unknown ranks in the order of ``paths`` and, within one file, in the order the
reader returns its traces. There can be more results than paths (an nsys report with several
processes gives one result per process).

Errors
------
A task never raises across the process boundary: it returns a failure record (the exception's
class name, message and formatted traceback as text), because some of our exceptions
(:class:`~tracestory.errors.TraceFormatError`) take several constructor arguments and would not
survive pickling. The parent raises :class:`RankError` (a
:class:`~tracestory.errors.TracestoryError`, so the CLI prints one line) whose message names the
file. The first failure to arrive stops the map: pending tasks are cancelled. A worker process
that dies (out of memory, a signal) is reported the same way, naming the files that were still
unfinished. ``progress(done_files, total_files)`` is called in the calling process after each file.
"""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from .errors import TracestoryError, UsageError
from .ingest import load_file
from .ingest.ranks import load_source

Progress = Callable[[int, int], None]

# Below this many bytes of input files, workers=None reads them in this process (see above).
SMALL_INPUT_BYTES = 4 << 20


class RankError(TracestoryError):
    """One rank file could not be read or summarized. ``path`` is the file; ``kind`` the class
    name of the original exception; ``worker_traceback`` its traceback as text (for debugging a
    failure that happened in another process)."""

    def __init__(self, path: str, message: str, kind: str = "", worker_traceback: str = ""):
        self.path = path
        self.kind = kind
        self.worker_traceback = worker_traceback
        super().__init__(message)

    def __reduce__(self):  # picklable, unlike an exception whose __init__ takes several arguments
        return (RankError, (self.path, str(self), self.kind, self.worker_traceback))


@dataclass(frozen=True)
class _Done:
    """A task's results: ``(rank or None, fn(trace))`` for each trace of the file."""

    results: tuple


@dataclass(frozen=True)
class _Failed:
    path: str
    kind: str
    message: str
    tracestory: bool
    worker_traceback: str


def _display(item) -> str:
    """The file an item of ``paths`` names, as error messages show it."""
    return os.fspath(getattr(item, "path", item))


def _load(item) -> list:
    if isinstance(item, (str, os.PathLike)):
        kind, value = load_file(item)
        if kind != "traces":
            raise UsageError(f"{os.fspath(item)}: expected a rank trace (Kineto or Nsight Systems), "
                             "found an Nsight Compute report")
        return value

    return load_source(item)


def _rank_task(item, fn: Callable) -> _Done | _Failed:
    """Read one file and apply ``fn`` to each of its traces. Runs in a worker; never raises."""
    try:
        return _Done(tuple((t.meta.rank, fn(t)) for t in _load(item)))
    except Exception as e:  # noqa: BLE001 -- every failure is reported, with its file, by the parent
        return _Failed(_display(item), type(e).__name__, str(e), isinstance(e, TracestoryError),
                       traceback.format_exc())


def _raise(failure: _Failed) -> None:
    msg = failure.message
    if not failure.tracestory:
        # A bug or an unexpected condition in fn or a reader: keep the exception's class name.
        msg = f"{failure.kind}: {msg}"
    if failure.path not in msg:
        msg = f"{failure.path}: {msg}"
    raise RankError(failure.path, msg, failure.kind, failure.worker_traceback)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _ordered(done: Sequence[_Done]) -> list:
    keyed = []
    for i, d in enumerate(done):
        for j, (rank, result) in enumerate(d.results):
            keyed.append(((rank is None, rank if rank is not None else 0, i, j), result))
    keyed.sort(key=lambda kr: kr[0])
    return [r for _, r in keyed]


def map_ranks(paths: Iterable, fn: Callable[[Any], Any], *, workers: int | None = None,
              dask_address: str | None = None, progress: Progress | None = None) -> list:
    """``fn(trace)`` for every trace of every file in ``paths``, in rank order.

    ``paths``: file paths or :class:`~tracestory.ingest.ranks.RankSource` items, one file each.
    ``workers``: worker processes (default ``min(files, usable CPUs)``, or none for inputs under
    ``SMALL_INPUT_BYTES``); 1 runs in this process.
    With ``dask_address`` it is the number of workers of a ``"local"`` cluster and is otherwise
    ignored (the cluster has the workers it has). See the module docstring for the model.
    """
    files = [os.fspath(p) if isinstance(p, (str, os.PathLike)) else p for p in paths]
    if workers is not None and workers < 1:
        raise UsageError(f"workers must be at least 1, found {workers}")
    if not files:
        return []
    if dask_address is not None:
        # No pickle check here: dask ships fn with cloudpickle, which also handles lambdas and closures.
        return _ordered(_run_dask(files, fn, dask_address, workers, progress))
    n = min(len(files), workers if workers is not None else _usable_cpus())
    if n <= 1 or (workers is None and _total_bytes(files) < SMALL_INPUT_BYTES):
        return _ordered(_run_inline(files, fn, progress))
    _check_picklable(fn)
    return _ordered(_run_pool(files, fn, n, progress))


def _total_bytes(files: list) -> int:
    total = 0
    for f in files:
        try:
            total += os.stat(_display(f)).st_size
        except OSError:  # a missing file is reported by the task that reads it
            pass
    return total


def _check_picklable(fn: Callable) -> None:
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 -- pickle raises several types (PicklingError, AttributeError, TypeError)
        raise UsageError(
            f"the per-rank function {getattr(fn, '__qualname__', fn)!r} cannot be sent to worker processes "
            f"({e}); use a module-level function, or workers=1"
        ) from None


def _accept(slots: list, i: int, r, progress: Progress | None) -> None:
    """File ``i``'s result into its slot (a failure is raised instead), then report progress."""
    if isinstance(r, _Failed):
        _raise(r)
    slots[i] = r
    if progress is not None:
        progress(sum(x is not None for x in slots), len(slots))


def _run_inline(files: list, fn: Callable, progress: Progress | None) -> list[_Done]:
    slots: list[_Done | None] = [None] * len(files)
    for i, path in enumerate(files):
        _accept(slots, i, _rank_task(path, fn), progress)
    return slots  # type: ignore[return-value]


def _run_pool(files: list, fn: Callable, n_workers: int, progress: Progress | None) -> list[_Done]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    slots: list[_Done | None] = [None] * len(files)
    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        pending = {pool.submit(_rank_task, path, fn): i for i, path in enumerate(files)}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                i = pending.pop(fut)
                try:
                    r = fut.result()
                except BrokenProcessPool:
                    unfinished = [_display(files[j]) for j in sorted([i, *pending.values()])]
                    raise RankError(_display(files[i]), _died_message(_display(files[i]), unfinished),
                                    "BrokenProcessPool") from None
                _accept(slots, i, r, progress)
    finally:
        # On success nothing is pending; on a failure, drop the queued files instead of reading them.
        pool.shutdown(wait=True, cancel_futures=True)
    return slots  # type: ignore[return-value]


_POOL_HINT = ("out of memory, killed, or it could not start: a script that calls map_ranks needs an "
              "`if __name__ == \"__main__\":` guard")


def _died_message(path: str, unfinished: list[str], hint: str = _POOL_HINT) -> str:
    shown = ", ".join(unfinished[:8]) + (f" and {len(unfinished) - 8} more" if len(unfinished) > 8 else "")
    return f"{path}: a worker process died while rank files were being read ({hint}); unfinished: {shown}"


def _run_dask(files: list, fn: Callable, address: str, workers: int | None,
              progress: Progress | None) -> list[_Done]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise UsageError("--dask needs dask.distributed, which is not installed: pip install tracestory[dask]") from None

    cluster = None
    try:
        if address == "local":
            n = min(len(files), workers if workers is not None else _usable_cpus())
            # One thread per worker: reading a trace is Python-heavy, threads would share one GIL.
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None)
            client = Client(cluster)
        else:
            try:
                client = Client(address, timeout="20s")
            except (OSError, TimeoutError, ValueError) as e:
                raise UsageError(f"dask scheduler {address}: cannot connect ({e})") from None
        with client:
            return _gather_dask(client, as_completed, files, fn, progress)
    finally:
        if cluster is not None:
            cluster.close()


def _gather_dask(client, as_completed, files: list, fn: Callable, progress: Progress | None) -> list[_Done]:
    # pure=False: a rerun must read the file again, not reuse a cached result of the same key.
    futures = client.map(_rank_task, files, fn=fn, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    slots: list[_Done | None] = [None] * len(files)
    try:
        for fut in as_completed(futures):
            i = index[fut.key]
            try:
                r = fut.result()
            except Exception as e:  # noqa: BLE001 -- KilledWorker, CancelledError, a lost connection
                unfinished = [_display(files[j]) for j in range(len(files)) if slots[j] is None]
                hint = f"dask: {type(e).__name__}: {e}"
                raise RankError(_display(files[i]), _died_message(_display(files[i]), unfinished, hint),
                                type(e).__name__) from None
            _accept(slots, i, r, progress)
    finally:
        unfinished = [f for f in futures if not f.done()]
        if unfinished:
            client.cancel(unfinished)
    return slots  # type: ignore[return-value]
