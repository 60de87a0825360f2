"""GPU telemetry sampler overhead: CPU time per sample, and the CPU share of the sampler thread.

Run from the repository root::

    PYTHONPATH=src python3 benchmarks/telemetry_overhead.py [--seconds 3] [--rate 20] [--gpus 1 8]

For each NVML source (the fake NVML of :mod:`tracestory.telemetry.fake`, always; the real one
through ``nvidia-ml-py`` when NVML initialises on this machine) and GPU count:

* **tight loop**: ``Sampler._take`` called back to back ``--tight`` times on the caller's
  thread (readings + JSON line + buffered write, no sleeping); CPU ns per sample from
  ``time.thread_time_ns`` (the median of 5 runs). This is the cost of one sample.
* **threaded**: the sampler thread at ``--rate`` Hz for ``--seconds`` while the main thread
  sleeps; the process's CPU time (``time.process_time_ns``, user + system, every thread)
  over that wall time, minus the same measured without a sampler: the share of one core the
  sampler costs at that rate. The sampler's own thread-CPU per sample (its ``end`` record's
  ``cpu_ns_per_sample``) is reported next to it.

Prints one Markdown table (the numbers docs/PERFORMANCE.md quotes) and the machine it ran on.
The real-NVML rows need a GPU and a driver; on a machine without them only the fake rows print.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from tracestory.telemetry.fake import FakeGpu, FakeNvml
from tracestory.telemetry.nvml import PynvmlSource, TelemetryUnavailable
from tracestory.telemetry.sampler import Sampler


def tight_ns_per_sample(make_source, path: Path, n: int) -> float:
    runs = []
    for _ in range(5):
        s = Sampler(make_source(), path, rate_hz=100)
        s.start()
        s._stop.set()                        # stop the thread; sample on this thread only
        s._thread.join()
        c0 = time.thread_time_ns()
        for _ in range(n):
            s._take()
        runs.append((time.thread_time_ns() - c0) / n)
        s.stop()
    return statistics.median(runs)


def process_cpu_share(seconds: float, make_source=None, path: Path | None = None, rate: float = 20.0):
    """(CPU seconds per wall second of the whole process, sampler cpu_ns_per_sample or None)."""
    s = Sampler(make_source(), path, rate_hz=rate).start() if make_source else None
    c0, w0 = time.process_time_ns(), time.monotonic_ns()
    time.sleep(seconds)
    c1, w1 = time.process_time_ns(), time.monotonic_ns()
    per_sample = None
    if s is not None:
        s.stop()
        per_sample = s.cpu_ns / s.samples
    return (c1 - c0) / (w1 - w0), per_sample


def real_source_factory(gpus: int):
    try:
        src = PynvmlSource()
        src.init()
        count = src.device_count()
        src.shutdown()
    except TelemetryUnavailable as e:
        return None, str(e)
    if count < 1:
        return None, "NVML sees no GPU"
    return (PynvmlSource, f"real NVML, {count} GPU(s)") if gpus == 1 else (None, "")


READINGS = ("sm_clock_mhz", "mem_clock_mhz", "power_mw", "energy_mj", "temperature_c", "utilization",
            "clock_event_mask")


def per_reading_us(n: int = 50) -> list[tuple[str, float, float]]:
    """Wall and CPU time of each NVML reading the sampler makes (real NVML, GPU 0), median of n."""
    src = PynvmlSource()
    src.init()
    try:
        h = src.handle(0)
        rows = []
        for name in READINGS:
            fn = getattr(src, name)
            wall, cpu = [], []
            for _ in range(n):
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                try:
                    fn(h)
                except Exception:   # a reading this device lacks: its cost still counts
                    pass
                wall.append(time.perf_counter_ns() - w0)
                cpu.append(time.thread_time_ns() - c0)
            rows.append((name, sorted(wall)[n // 2] / 1e3, sorted(cpu)[n // 2] / 1e3))
        return rows
    finally:
        src.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="threaded run per case (default 3)")
    ap.add_argument("--rate", type=float, default=20.0, help="sampler rate in the threaded run (default 20 Hz)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 8], help="fake GPU counts (default 1 8)")
    ap.add_argument("--tight", type=int, default=2000, help="samples per tight-loop run (default 2000)")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "telemetry.jsonl"
        idle, _ = process_cpu_share(args.seconds)
        cases = [(f"fake NVML, {g} GPU(s)", lambda g=g: FakeNvml([FakeGpu() for _ in range(g)])) for g in args.gpus]
        real, why = real_source_factory(1)
        if real is not None:
            cases.append((why, real))
        for label, make in cases:
            tight = tight_ns_per_sample(make, path, args.tight if "fake" in label else max(200, args.tight // 10))
            share, per_sample = process_cpu_share(args.seconds, make, path, args.rate)
            rows.append((label, tight, per_sample, max(0.0, share - idle)))
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if real is None:
        print(f"real NVML: not measured ({why})")
    print(f"\n| source | CPU per sample, tight loop (us) | CPU per sample, thread at {args.rate:g} Hz (us) "
          f"| extra CPU at {args.rate:g} Hz (% of one core) |")
    print("| --- | ---: | ---: | ---: |")
    for label, tight, per_sample, share in rows:
        print(f"| {label} | {tight / 1e3:.1f} | {per_sample / 1e3:.1f} | {share * 100:.2f} |")
    if real is not None:
        print("\n| NVML reading (GPU 0) | wall per call, median (us) | CPU per call, median (us) |")
        print("| --- | ---: | ---: |")
        for name, wall, cpu in per_reading_us():
            print(f"| {name} | {wall:.1f} | {cpu:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
