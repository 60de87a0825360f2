"""Benchmark timer: per-repetition device-event timing with time budgets and robust statistics.

Model
-----
``measure(fn)`` runs ``fn`` repeatedly and keeps one duration per repetition (the samples).

* **Warm-up and repeat are time budgets** (milliseconds), as in ``triton.testing.do_bench``:
  a few calls estimate the cost of one call, then ``warmup_ms / estimate`` calls warm up and
  ``rep_ms / estimate`` calls are timed (clamped to ``[min_reps, max_reps]``).
* **On CUDA** each repetition is bracketed by its own pair of CUDA events recorded on the current
  stream; all events are read after one final synchronize, so the host never stalls the queue
  between repetitions. The samples therefore measure device time from the start event to the
  end event, which includes launch gaps between the kernels of one call but not host time
  before the first launch (the queue stays ahead of the device).
* **L2 flush** (``flush_l2=True``): before each repetition a buffer larger than the L2 cache
  (256 MiB; the H200 has 60 MB) is zeroed, outside the timed events, so every repetition starts
  from a cold cache, as ``do_bench`` does by default.
* **Without CUDA** the same loop runs with ``time.perf_counter_ns`` around each call, so the
  statistics and the CLI work in CI on a CPU.
* **Under Nsight Systems / Nsight Compute** (detected from the environment, see
  :func:`tracestory.capture.environment.external_profiler`): after the warm-up, exactly one
  repetition runs between ``cudaProfilerStart`` and ``cudaProfilerStop`` (for
  ``--capture-range=cudaProfilerApi`` / ``--profile-from-start off``), and it is the only sample.
  :func:`set_single_iteration` asks for the same single timed repetition (used by
  ``--profile torch``, so the trace holds one iteration).

Statistics (:func:`summarize`): median, mean, standard deviation (``ddof=1``; 0 for one sample),
min, max, the 10th/25th/75th/90th percentiles (numpy's linear interpolation), IQR = p75 - p25,
and ``spread = (p90 - p10) / median``. A warning is attached when the spread exceeds
``spread_warn`` (default 0.10): the median is then less trustworthy (clock changes, other
work on the GPU, a cache that is warm in some repetitions only).

Energy (CUDA only, when a GPU telemetry sampler is running, :func:`tracestory.telemetry.active`):
NVML's total-energy counter of the measured GPU is read right before the first timed repetition
(after a synchronize) and right after the final synchronize; ``energy_j`` is the difference and
``energy_j_per_rep`` that over the repetitions. It includes whatever ran on that GPU meanwhile
(the L2 flush of ``flush_l2``, ``before_each``, other processes) and idle power; the counter
advances in steps of tens of ms, so a window (``energy_window_ns``) shorter than about 100 ms is
coarse. ``None`` when no sampler runs, the GPU has no counter, or the counter did not advance.

Limits: a call whose work is shorter than the event resolution (~0.5 us) is poorly measured;
use more work per call or a CUDA graph. ``fn`` must be idempotent enough to repeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import telemetry
from ..capture.environment import external_profiler
from .common import region

_FLUSH_BYTES = 256 * 1024 * 1024
_single_iteration = False


def set_single_iteration(on: bool) -> None:
    """Make every :func:`measure` time exactly one repetition (after its warm-up)."""
    global _single_iteration
    _single_iteration = bool(on)


@dataclass(frozen=True)
class TimingStats:
    """Statistics of one measurement, in nanoseconds. ``samples_ns`` keeps every repetition."""

    samples_ns: tuple[float, ...]
    n: int
    median_ns: float
    mean_ns: float
    std_ns: float
    min_ns: float
    max_ns: float
    p10_ns: float
    p25_ns: float
    p75_ns: float
    p90_ns: float
    iqr_ns: float
    spread: float | None          # (p90 - p10) / median; None when the median is 0
    warning: str | None
    clock: str                    # "cuda-events" | "perf_counter" | "cuda-events (profiler, 1 rep)"
    flush_l2: bool
    energy_j: float | None = None           # NVML energy counter over the timed repetitions
    energy_j_per_rep: float | None = None
    energy_window_ns: int | None = None     # host time between the two counter reads

    @property
    def median_ms(self) -> float:
        return self.median_ns / 1e6

    def to_dict(self, with_samples: bool = True) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["samples_ns"] = list(self.samples_ns) if with_samples else None
        return d


def summarize(samples_ns: Sequence[float], *, clock: str = "given", flush_l2: bool = False,
              spread_warn: float = 0.10) -> TimingStats:
    """Statistics of a list of durations (ns). Raises ``ValueError`` on an empty list."""
    a = np.asarray(samples_ns, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no timing samples")
    p10, p25, med, p75, p90 = (float(v) for v in np.percentile(a, [10, 25, 50, 75, 90]))
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    spread = (p90 - p10) / med if med > 0 else None
    warning = None
    if spread is not None and spread > spread_warn:
        warning = (f"large spread: (p90-p10)/median = {spread:.1%} over {a.size} reps "
                   f"(> {spread_warn:.0%}); the median may not be stable")
    return TimingStats(tuple(float(v) for v in a), int(a.size), med, float(a.mean()), std,
                       float(a.min()), float(a.max()), p10, p25, p75, p90, p75 - p25, spread,
                       warning, clock, flush_l2)


def _cuda_available() -> bool:
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return False
    return bool(torch.cuda.is_available())


def _under_external_profiler() -> bool:
    return external_profiler() is not None


def _n_from_budget(budget_ms: float, est_ns: float, lo: int, hi: int) -> int:
    n = int(budget_ms * 1e6 / max(est_ns, 1.0))
    return max(lo, min(hi, n))


def measure(fn: Callable[[], Any], *, warmup_ms: float = 25.0, rep_ms: float = 100.0,
            flush_l2: bool = False, min_reps: int = 5, max_reps: int = 10_000,
            spread_warn: float = 0.10, device: str | None = None,
            before_each: Callable[[], Any] | None = None,
            region_name: str | None = None) -> TimingStats:
    """Time ``fn`` (see the module docstring). ``device`` "cpu" forces the host clock;
    ``before_each`` runs untimed before every repetition (e.g. ``cudagraph_mark_step_begin``);
    ``region_name`` wraps the timed repetitions (not the warm-up) in ``tracestory.region``, so
    a profiler ranged on it (``BENCHMARK``) sees only measured work."""
    use_cuda = device != "cpu" and _cuda_available()
    single = _single_iteration or (use_cuda and _under_external_profiler())
    if region_name:
        timed_region = lambda: region(region_name)
    else:
        import contextlib

        timed_region = contextlib.nullcontext
    if use_cuda:
        return _measure_cuda(fn, warmup_ms, rep_ms, flush_l2, min_reps, max_reps, spread_warn,
                             single, before_each, timed_region)
    return _measure_host(fn, warmup_ms, rep_ms, min_reps, max_reps, spread_warn, single, before_each,
                         timed_region)


def _measure_host(fn, warmup_ms, rep_ms, min_reps, max_reps, spread_warn, single, before_each,
                  timed_region):
    def once() -> int:
        if before_each is not None:
            before_each()
        t0 = time.perf_counter_ns()
        fn()
        return time.perf_counter_ns() - t0

    est = min(once() for _ in range(3))
    for _ in range(_n_from_budget(warmup_ms, est, 1, max_reps)):
        once()
    n = 1 if single else _n_from_budget(rep_ms, est, min_reps, max_reps)
    with timed_region():
        samples = [once() for _ in range(n)]
    return summarize(samples, clock="perf_counter", flush_l2=False, spread_warn=spread_warn)


def _measure_cuda(fn, warmup_ms, rep_ms, flush_l2, min_reps, max_reps, spread_warn, single, before_each,
                  timed_region):
    import torch

    flush = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda") if flush_l2 else None

    def prep():
        if flush is not None:
            flush.zero_()
        if before_each is not None:
            before_each()

    # Estimate one call's device time from 5 back-to-back calls (after a first, possibly
    # compiling, call).
    prep()
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(5):
        prep()
        fn()
    e1.record()
    torch.cuda.synchronize()
    est_ns = e0.elapsed_time(e1) * 1e6 / 5
    for _ in range(_n_from_budget(warmup_ms, est_ns, 1, max_reps)):
        prep()
        fn()
    n = 1 if single else _n_from_budget(rep_ms, est_ns, min_reps, max_reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    if single:
        # The profiled region holds the workload alone: the L2 flush (and before_each) runs
        # before it opens, so a trace of it is not dominated by the flush's memset.
        prep()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    meter = _energy_meter(torch)
    e_start = meter() if meter is not None else None
    with timed_region():
        for i in range(n):
            if not single:
                prep()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
    e_end = meter() if meter is not None else None
    if single:
        torch.cuda.profiler.stop()
    samples = [s.elapsed_time(e) * 1e6 for s, e in zip(starts, ends)]
    clock = "cuda-events (1 rep)" if single else "cuda-events"
    stats = summarize(samples, clock=clock, flush_l2=flush_l2, spread_warn=spread_warn)
    return _with_energy(stats, meter, e_start, e_end, n)


def _energy_meter(torch) -> Callable[[], tuple[int, int] | None] | None:
    """A function reading (energy counter mJ, monotonic ns) of the current CUDA device through the
    running telemetry sampler; None when no sampler runs or the device is not found in NVML."""
    sampler = telemetry.active()
    if sampler is None:
        return None
    dev = torch.cuda.current_device()
    index = None
    try:
        index = sampler.index_of_uuid(str(torch.cuda.get_device_properties(dev).uuid))
    except (AttributeError, RuntimeError):
        pass
    if index is None and len(sampler.devices) == 1:
        index = 0
    if index is None:
        return None

    def read() -> tuple[int, int] | None:
        mj = sampler.energy_mj(index)
        return None if mj is None else (mj, time.monotonic_ns())

    return read


def _with_energy(stats: TimingStats, meter, start, end, n: int) -> TimingStats:
    """``stats`` with the energy between the two counter reads (see the module docstring)."""
    if meter is None or start is None or end is None or end[0] <= start[0] or n < 1:
        return stats
    joules = (end[0] - start[0]) / 1000.0
    return replace(stats, energy_j=joules, energy_j_per_rep=joules / n,
                               energy_window_ns=end[1] - start[1])
