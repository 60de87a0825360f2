"""torch.profiler capture of an in-process workload, driven by :func:`tracestory.region`.

Three modes (mutually exclusive):

* **range** (``--range NAME --skip K --count M``): the profiler starts when occurrence K of
  region NAME opens (0-based, outermost occurrences only: a NAME nested in NAME is part of
  its parent) and stops when occurrence K+M-1 closes, so the trace holds exactly M NAME
  ranges: the runbooks' "20 warm-ups, then one ranged run". A region named ``NAME <suffix>``
  is an occurrence of NAME too (the server's ``iteration 17`` is an occurrence of
  ``iteration``). The profiler is started and stopped on the thread that opens and closes
  the occurrences: torch.profiler records CPU ops only on the thread that started it, so a
  server whose engine thread marks its iterations is profiled on that thread. If that thread
  ends with the range still running, the profiler is stopped from the thread's own teardown
  (a thread-local guard; torch crashes at exit otherwise). A workload that ends before
  occurrence K+M-1 closes fails the capture (its partial trace is kept, but never as a
  complete capture). On a GPU, CUPTI is set up before the workload starts (a throw-away
  start/stop, :func:`_prime_cupti`), so the range's own start costs about 1 ms, not 5 s.
* **schedule** (``--wait W --warmup U --active A``): a ``torch.profiler.schedule`` (repeat=1)
  stepped at the exit of every outermost occurrence of region ``--range NAME``, or of every
  outermost region whatever its name when no ``--range`` is given; the trace holds
  ``ProfilerStep#i`` ranges for the A active steps.
* **whole**: the whole run.

Under Nsight Systems or Nsight Compute (see :func:`~.environment.external_profiler`) no torch
profiler is started (two CUPTI subscribers fail); in range mode one occurrence (K) runs
between ``cudaProfilerStart``/``cudaProfilerStop`` instead, for ``nsys
--capture-range=cudaProfilerApi`` or ``ncu --profile-from-start off``.

The trace is written as ``rank<r>.trace.json.gz`` (``r`` = ``$RANK``, 0 without torchrun);
torch keeps ``distributedInfo`` when the workload initialised ``torch.distributed``.

**Surviving the end of the process.** Every trace is written under a temporary name and
renamed into place (:func:`tracestory.outputs.atomic_path`), so a trace file that exists is
whole. A range is exported as soon as its last occurrence closes (on that thread), not when
the workload ends, so a later crash, kill or Ctrl-C cannot take it. With ``background_export``
(set by ``tracestory capture --load``: a server's engine thread must not stall for seconds while
requests queue) that export runs on a thread of its own and the process waits for it before it
reports; a crash in the moments after the range closes can then take the trace. Either way the
seconds the profiler's start and stop held the workload's thread are recorded
(``start_blocked_s``, ``stop_blocked_s``). ``on_trace(path,
complete)`` is called after each export (the runner records it in its status file). A stop
signal (SIGINT, SIGTERM, SIGHUP) raises ``KeyboardInterrupt`` in the workload
(:func:`~.supervise.interrupts_raise`); the profiler is then stopped and what it holds is
exported; signals arriving during an export wait until it is written. An occurrence left by
an exception (an interrupt included) is not counted as captured.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ToolNotFound, TracestoryError
from ..outputs import atomic_path
from ..units import plural
from . import region as _region
from .environment import external_profiler
from .supervise import CaptureInterrupted, interrupts_raise, signal_of
from .workload import Workload, run_in_process


@dataclass(frozen=True)
class TorchOptions:
    range: str | None = None
    skip: int = 0
    count: int = 1
    wait: int | None = None
    warmup: int | None = None
    active: int | None = None
    with_shapes: bool = False
    memory: bool = False
    flops: bool = False
    stack: bool = False
    background_export: bool = False   # range mode: export on a thread of its own (servers: no stall)

    @property
    def mode(self) -> str:
        if self.active is not None:
            return "schedule"
        if self.range:
            return "range"
        return "whole"


@dataclass(frozen=True)
class TorchCaptureResult:
    exit_code: int
    mode: str                      # "range" | "schedule" | "whole"
    rank: int
    trace_path: str | None         # None when nothing was recorded
    occurrences_seen: int | None   # outermost occurrences of the range region (range mode)
    captured_occurrences: int | None
    external_profiler: str | None  # "nsys" / "ncu" when we ran under one (no torch.profiler)
    error: str | None              # traceback of the workload, or why nothing was captured
    complete: bool = False         # the trace holds everything asked (whole run, range, schedule)
    interrupted: str | None = None  # the stop signal the workload received ("SIGINT", ...)
    # range mode: seconds the profiler held the workload's thread when it started and when it
    # stopped (the export itself runs on another thread), and the occurrence each happened at
    start_blocked_s: float | None = None
    stop_blocked_s: float | None = None


def is_occurrence(region_name: str, range_name: str) -> bool:
    """``NAME`` and ``NAME <suffix>`` (``iteration 17``) are occurrences of range ``NAME``."""
    return region_name == range_name or region_name.startswith(range_name + " ")


class RangeController:
    """Calls ``start`` at outermost occurrence ``skip`` of region ``name`` and ``stop`` after
    occurrence ``skip + count - 1`` closes, on the thread of the region (see the module
    docstring); ``thread`` is the ident of the thread that started."""

    def __init__(self, name: str, skip: int, count: int,
                 start: Callable[[], Any], stop: Callable[[], Any], *, same_thread_stop: bool = False):
        self.name, self.skip, self.count = name, skip, count
        self._start, self._stop = start, stop
        self.same_thread_stop = same_thread_stop
        self.seen = 0
        self.captured = 0
        self.running = False
        self.thread: int | None = None
        self._depth = 0
        self._local = threading.local()

    def _thread_ending(self) -> None:
        """Called on the starting thread as it ends (its thread-local guard is destroyed)."""
        if self.running and self.thread == threading.get_ident():
            self.running = False
            self._stop()

    def on_enter(self, name: str) -> None:
        if not is_occurrence(name, self.name):
            return
        if self._depth == 0:
            if self.seen == self.skip and not self.running:
                self._start()
                self.running, self.thread = True, threading.get_ident()
                if self.same_thread_stop:
                    self._local.guard = _ThreadEndGuard(self)
            self.seen += 1
        self._depth += 1

    def on_exit(self, name: str, *, raised: bool = False) -> None:
        if not is_occurrence(name, self.name):
            return
        self._depth -= 1
        if self._depth == 0 and self.running:
            if not raised:
                self.captured += 1
            if self.seen >= self.skip + self.count:
                self._stop()
                self.running = False
                self._local.__dict__.pop("guard", None)

    def on_exit_raised(self, name: str) -> None:
        """An occurrence left by an exception is cut short: not counted as captured."""
        self.on_exit(name, raised=True)

    @property
    def complete(self) -> bool:
        return self.captured >= self.count

    def finish(self) -> None:
        """Stop a profiler still running when the workload ended early. With
        ``same_thread_stop`` (torch.profiler) only the thread that started it can: from any
        other thread the profiler is left running and :attr:`running` stays True."""
        if self.running and (not self.same_thread_stop or self.thread == threading.get_ident()):
            self._stop()
            self.running = False


class _ThreadEndGuard:
    """Lives in a thread-local slot of the thread that started the profiler; CPython destroys
    it on that same thread when the thread ends."""

    def __init__(self, controller: RangeController):
        self.controller = controller

    def __del__(self) -> None:
        try:
            self.controller._thread_ending()
        except Exception:  # noqa: BLE001 -- a destructor must not raise; finish() reports the state
            pass


class StepController:
    """Calls ``step`` at the exit of every outermost region named ``name`` (any name when
    ``name`` is None)."""

    def __init__(self, step: Callable[[], Any], name: str | None = None):
        self._step, self._name, self._depth, self.steps = step, name, 0, 0
        self.stopping = False      # set once the workload ended: a trace written now is partial

    def on_enter(self, name: str) -> None:
        if self._name is None or is_occurrence(name, self._name):
            self._depth += 1

    def on_exit(self, name: str) -> None:
        if self._name is None or is_occurrence(name, self._name):
            self._depth -= 1
            if self._depth == 0:
                self.steps += 1
                self._step()


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def trace_name(rank: int) -> str:
    return f"rank{rank}.trace.json.gz"


def _import_torch():
    try:
        import torch
        import torch.profiler  # noqa: F401
    except ImportError:
        raise ToolNotFound("torch", "install PyTorch (`pip install torch`) to capture with torch.profiler") from None
    return torch


def capture_in_process(workload: Workload, opts: TorchOptions, out_dir: str | Path,
                       *, force_profiler_api: bool = False,
                       on_trace: Callable[[str, bool], Any] | None = None) -> TorchCaptureResult:
    """Run ``workload`` here under torch.profiler (or the CUDA profiler API under nsys/ncu).

    ``on_trace(path, complete)`` is called after each trace file is written (see the module
    docstring for when that is)."""
    torch = _import_torch()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = _rank()
    external = external_profiler() or ("api" if force_profiler_api else None)
    mode = opts.mode
    if external:
        return _run_under_external(torch, workload, opts, rank, external)

    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    path = out_dir / trace_name(rank)
    written: list[bool] = []          # one entry per export; True when it held everything asked
    export_errors: list[str] = []
    controller: Any = None

    def export(p, complete: bool = False) -> None:
        """Write the trace whole or not at all; never raise into the workload."""
        was_holding, guard.holding = guard.holding, True   # a signal now waits for the file
        before = len(guard.received)
        try:
            with atomic_path(path) as tmp:
                p.export_chrome_trace(str(tmp))   # torch gzips when the name ends in .gz
            written.append(complete)
            if on_trace is not None:
                on_trace(str(path), complete)
        except (TracestoryError, OSError, RuntimeError) as e:
            export_errors.append(f"{path}: the trace could not be written ({e})")
        finally:
            guard.holding = was_holding or guard.sealed
        if not was_holding and not guard.sealed and len(guard.received) > before:   # deliver the signal that waited
            if threading.current_thread() is threading.main_thread():
                raise CaptureInterrupted(guard.received[-1])
            os.kill(os.getpid(), _signum(guard.received[-1]))

    kwargs: dict[str, Any] = dict(activities=activities, record_shapes=opts.with_shapes,
                                  profile_memory=opts.memory, with_flops=opts.flops,
                                  with_stack=opts.stack)
    if mode == "schedule":
        kwargs["schedule"] = schedule(wait=opts.wait or 0, warmup=opts.warmup or 0,
                                      active=opts.active or 1, repeat=1)
        kwargs["on_trace_ready"] = lambda p: export(p, complete=controller is not None and not controller.stopping)
    prof = profile(**kwargs)
    if mode == "range" and torch.cuda.is_available():
        _prime_cupti(profile, activities)

    exporters: list[threading.Thread] = []
    blocked: dict[str, float] = {}
    if mode == "range":
        def start_range() -> None:
            t0 = time.perf_counter()
            prof.start()
            blocked["start"] = time.perf_counter() - t0
            _region.note("profiler_ns", int(blocked["start"] * 1e9))

        def stop_range() -> None:
            t0 = time.perf_counter()
            prof.stop()
            blocked["stop"] = time.perf_counter() - t0
            _region.note("profiler_ns", int(blocked["stop"] * 1e9))
            if controller.captured >= opts.count and not opts.background_export:
                export(prof, complete=True)           # the whole range: written now, not at exit
            elif controller.captured >= opts.count:   # the same, not on the workload's thread
                t = threading.Thread(target=export, args=(prof,), kwargs={"complete": True},
                                     name="tracestory-trace-export")
                t.start()
                exporters.append(t)

        controller = RangeController(opts.range or "", opts.skip, opts.count, start_range, stop_range,
                                     same_thread_stop=True)
    elif mode == "schedule":
        controller = StepController(prof.step, opts.range)
    error = None
    code = 1
    interrupted: str | None = None     # a stop signal that ended the workload
    with interrupts_raise() as guard:   # export() sees this guard from here on
        try:
            if controller is not None:
                _region.add_listener(controller)
            if mode != "range":
                prof.start()
            code = run_in_process(workload)
        except KeyboardInterrupt as e:
            interrupted = signal_of(e)
            code = 128 + _signum(interrupted)
        except Exception:
            error = traceback.format_exc()
        finally:
            guard.hold()                    # later signals wait: what follows writes the trace
            if controller is not None:
                _region.remove_listener(controller)
            if mode == "schedule":
                controller.stopping = True
            if mode == "range":
                controller.finish()
            else:
                prof.stop()
            for t in exporters:             # the range's export, started on the workload's thread
                t.join()
        received = guard.first
    seen = captured = None
    complete = False
    if mode == "range":
        seen, captured = controller.seen, controller.captured
        complete = controller.complete and any(written)
        if controller.running:     # still open on a thread that has ended: nothing to export
            if error is None and interrupted is None:
                error = _range_open(opts, captured)
        elif controller.thread is not None and not written:
            export(prof, complete=False)   # what the profiler holds: a range cut short
        if interrupted is not None and not complete:
            error = (f"interrupted by {interrupted}: {captured} of --count {opts.count} occurrences of region "
                     f"{opts.range!r} were captured ({seen} seen)")
        elif not captured and error is None and interrupted is None:
            error = _range_missed(opts, seen)
        elif not controller.complete and error is None and interrupted is None:
            error = _range_short(opts, seen, captured)
    elif mode == "whole":
        export(prof, complete=interrupted is None and error is None)
        complete = bool(written) and written[-1]
        if interrupted is not None:
            error = f"interrupted by {interrupted}: the trace holds the run until then"
    else:
        complete = any(written)
        if interrupted is not None and not complete:
            error = f"interrupted by {interrupted} after {controller.steps} schedule steps"
        elif not written and error is None:
            error = (f"the schedule needs {(opts.wait or 0) + (opts.warmup or 0) + (opts.active or 1)} "
                     f"steps (exits of {'region ' + repr(opts.range) if opts.range else 'outermost regions'}); "
                     f"the workload had {controller.steps}, so nothing was captured")
    if export_errors:
        error = "; ".join(([error] if error else []) + export_errors)
        complete = False
    if interrupted is None and code == 0 and error is None:
        exit_code = 0
    elif interrupted is not None:
        exit_code = code
    else:
        exit_code = code if code != 0 else 1
    return TorchCaptureResult(exit_code, mode, rank, str(path) if written else None, seen, captured, None,
                              error, complete, interrupted or received, _round(blocked.get("start")),
                              _round(blocked.get("stop")))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _signum(name: str) -> int:
    import signal

    try:
        return int(getattr(signal, name))
    except (AttributeError, TypeError):
        return 2


def _prime_cupti(profile, activities) -> None:
    """Pay CUPTI's one-time set-up before the workload runs, not when the range opens.

    The first ``start()`` of a process blocks its thread for about 5 s on an H200 (torch 2.11);
    after a throw-away start/stop here the range's own start takes about 1 ms
    (``benchmarks/gpu/profiler_start_cost.py``, docs/BENCHMARKS.md). For a server that matters:
    a 5-s stall on the engine thread at the first captured iteration would fill the queue, and
    the captured window would show the catch-up, not the steady state.
    """
    p = profile(activities=activities)
    p.start()
    p.stop()


def _range_missed(opts: TorchOptions, seen: int | None) -> str:
    return (f"region {opts.range!r} occurred {plural(seen or 0, 'time')}; expected at least "
            f"{opts.skip + 1} (--skip {opts.skip}) so nothing was captured")


def _range_short(opts: TorchOptions, seen: int, captured: int) -> str:
    return (f"region {opts.range!r} occurred {plural(seen, 'time')}; --skip {opts.skip} --count {opts.count} needs "
            f"{opts.skip + opts.count}, so only {captured} of {opts.count} were captured (the partial trace "
            f"is kept apart, not as a complete capture)")


def _range_open(opts: TorchOptions, captured: int) -> str:
    return (f"region {opts.range!r}: {captured} of --count {opts.count} occurrences were captured when the "
            f"workload ended; the profiler was started on the thread that opened them and cannot be stopped "
            f"from another, so no trace was written: lower --count or give the workload more occurrences "
            f"(a longer --load)")


def _run_under_external(torch, workload: Workload, opts: TorchOptions, rank: int,
                        external: str) -> TorchCaptureResult:
    """One occurrence between cudaProfilerStart/Stop; never torch.profiler (no nesting)."""
    controller = None
    if opts.range and torch.cuda.is_available():
        cudart = torch.cuda.cudart()

        def start():
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()

        def stop():
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()

        controller = RangeController(opts.range, opts.skip, 1, start, stop)
        _region.add_listener(controller)
    error = None
    code = 1
    interrupted = None
    with interrupts_raise() as guard:
        try:
            code = run_in_process(workload)
        except KeyboardInterrupt as e:
            interrupted = signal_of(e)
            code = 128 + _signum(interrupted)
        except Exception:
            error = traceback.format_exc()
        finally:
            guard.hold()
            if controller is not None:
                _region.remove_listener(controller)
                controller.finish()
    seen = controller.seen if controller else None
    captured = controller.captured if controller else None
    if interrupted is not None and not captured:
        error = f"interrupted by {interrupted}" + (f" before occurrence {opts.skip} of region {opts.range!r} "
                                                  "ended" if controller else "")
    elif controller is not None and not captured and error is None:
        error = _range_missed(opts, seen)
    complete = error is None
    return TorchCaptureResult(code if error is None or code != 0 else 1, "range" if opts.range else "whole",
                              rank, None, seen, captured, external, error, complete, interrupted or guard.first)
