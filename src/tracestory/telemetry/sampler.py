"""The GPU telemetry sampler: NVML readings at a fixed rate, in a daemon thread, as JSON lines.

Model
-----
:class:`Sampler` reads every visible GPU through an :class:`~.nvml.NvmlSource` (SM and memory
clocks, power, the total-energy counter, temperature, GPU/memory utilisation, clock event
reasons) ``rate_hz`` times a second (10-100 Hz, default 20). Each sample is stamped twice,
before its readings: ``t_unix_ns`` = ``time.time_ns()`` (Unix epoch ns, the clock of Kineto's
``baseTimeNanoseconds`` and of the scheduler event log's ``t0_unix_ns``) and ``t_mono_ns`` =
``time.monotonic_ns()`` (the clock of the scheduler event log's ``t_ns``, whose origin ``t0`` the
log's ``meta`` pins to ``t0_unix_ns``). The header holds one ``(t0_unix_ns, t0_mono_ns)`` pair
taken together, so either stamp converts to the other.

The first sample is taken when the sampler starts and one more when it stops, so even a run
shorter than one period has both ends of its energy counter. Deadlines are absolute: a sample
that comes late does not shift the next ones; periods missed entirely (the thread did not run)
are counted as ``late`` in the ``end`` record rather than sampled twice.

File (``telemetry.jsonl``, format in docs/FORMATS.md and docs/TELEMETRY.md): one ``header``
line, one ``sample`` line per sample, one ``end`` line when the sampler stops. Lines are
flushed every ``flush_s`` seconds (default 1 s), so a killed run keeps all but its last
second; a last line cut short is reported by the reader as damage, never dropped silently.

Overhead: one sample is ``7 x GPUs`` NVML calls plus one ``json.dumps``; the thread's own CPU
time (``time.thread_time_ns``) is summed and written in the ``end`` record
(``cpu_ns_per_sample``); ``benchmarks/telemetry_overhead.py`` measures it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ..errors import UsageError
from .nvml import FieldUnsupported, NvmlSource, TelemetryUnavailable
from .reasons import decode_reasons

SCHEMA = "tracestory.telemetry/1"
FILE_NAME = "telemetry.jsonl"
DEFAULT_HZ = 20.0
MIN_HZ, MAX_HZ = 10.0, 100.0

# field in a sample -> (NvmlSource method, unit); utilisation is read once for two fields
FIELDS = {"sm_mhz": "MHz", "mem_mhz": "MHz", "power_w": "W", "energy_mj": "mJ (counter since driver load)",
          "temp_c": "degrees C", "util_gpu": "%", "util_mem": "%", "reasons_mask": "NVML clock event bitmask",
          "reasons": "names of the set bits"}
# The energy counter is read at the first and last sample and once per this period in between:
# one nvmlDeviceGetTotalEnergyConsumption took 3.2 ms (wall and CPU) on the lent H100/H200 VMs,
# against 2-4 us for each other reading, so reading it at 20 Hz cost 8% of a core. Energy over
# a span is the counter's difference, linearly interpolated between its reads.
ENERGY_PERIOD_S = 1.0

_READINGS = ("sm_mhz", "mem_mhz", "power_w", "energy_mj", "temp_c", "util", "reasons_mask")

CLOCKS = {"t_unix_ns": "time.time_ns(): Unix epoch ns (Kineto baseTimeNanoseconds, scheduler log t0_unix_ns)",
          "t_mono_ns": "time.monotonic_ns(): CLOCK_MONOTONIC ns (the scheduler event log's clock)"}


def check_rate(rate_hz: float) -> float:
    rate = float(rate_hz)
    if not (MIN_HZ <= rate <= MAX_HZ):
        raise UsageError(f"telemetry rate: expected {MIN_HZ:g} to {MAX_HZ:g} Hz, found {rate_hz!r}")
    return rate


class Sampler:
    """Sample ``source`` into ``path`` (None: sample without writing, e.g. only for energy reads)."""

    def __init__(self, source: NvmlSource, path: str | Path | None = None, *, rate_hz: float = DEFAULT_HZ,
                 flush_s: float = 1.0, label: str | None = None, energy_period_s: float = ENERGY_PERIOD_S):
        self.source = source
        self.path = Path(path) if path is not None else None
        self.rate_hz = check_rate(rate_hz)
        self.flush_s = float(flush_s)
        self.energy_period_s = float(energy_period_s)
        self._last_energy = None
        self.label = label
        self.samples = 0
        self.late = 0
        self.cpu_ns = 0
        self.devices: list[dict[str, Any]] = []
        self._handles: list[Any] = []
        self._skip: list[set[str]] = []
        self._fh: TextIO | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last_flush = 0
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Sampler:
        """Initialise NVML, write the header and the first sample, start the thread. Raises
        :class:`~.nvml.TelemetryUnavailable` (NVML unusable) or ``UsageError`` (path not writable)."""
        self.source.init()
        try:
            n = self.source.device_count()
            if n < 1:
                raise TelemetryUnavailable("NVML sees no GPU")
            self._handles = [self.source.handle(i) for i in range(n)]
            self._skip = [set() for _ in range(n)]
            for i, h in enumerate(self._handles):
                self._probe(i, h)
            self.devices = [{"index": i, "name": self.source.name(h), "uuid": self.source.uuid(h),
                             "pci_bus_id": self.source.pci_bus_id(h), "unsupported": sorted(self._skip[i])}
                            for i, h in enumerate(self._handles)]
        except (TelemetryUnavailable, FieldUnsupported) as e:
            self.source.shutdown()
            raise TelemetryUnavailable(str(e)) from None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 -- open until stop()
            except OSError as e:
                self.source.shutdown()
                raise UsageError(f"{self.path}: expected a writable telemetry file, found {e.strerror or e}") from None
        t0_unix, t0_mono = time.time_ns(), time.monotonic_ns()
        self._write({"type": "header", "schema": SCHEMA, "source": "nvml", "rate_hz": self.rate_hz,
                     "energy_period_s": self.energy_period_s, "t0_unix_ns": t0_unix, "t0_mono_ns": t0_mono, "clocks": CLOCKS, "units": FIELDS,
                     "driver_version": self.source.driver_version(), "devices": self.devices,
                     "host": socket.gethostname(), "pid": os.getpid(), "label": self.label,
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
        self._started = True
        self._take(energy=True)
        self._flush()
        self._thread = threading.Thread(target=self._run, name="tracestory-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last sample, write the ``end`` record, close the file, shut NVML down."""
        if not self._started:
            return
        self._started = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._take(energy=True)
        self._write({"type": "end", "t_unix_ns": time.time_ns(), "t_mono_ns": time.monotonic_ns(),
                     "samples": self.samples, "late": self.late,
                     "cpu_ns_per_sample": self.cpu_ns / self.samples if self.samples else None})
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self.source.shutdown()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading
    def _probe(self, i: int, h: Any) -> None:
        for what in _READINGS:
            try:
                self._read(h, what)
            except FieldUnsupported:
                self._skip[i].add(what)

    def _read(self, h: Any, what: str):
        s = self.source
        if what == "sm_mhz":
            return s.sm_clock_mhz(h)
        if what == "mem_mhz":
            return s.mem_clock_mhz(h)
        if what == "power_w":
            return s.power_mw(h) / 1000.0
        if what == "energy_mj":
            return s.energy_mj(h)
        if what == "temp_c":
            return s.temperature_c(h)
        if what == "util":
            return s.utilization(h)
        return s.clock_event_mask(h)

    def read_gpu(self, i: int, energy: bool = True) -> dict[str, Any]:
        """One GPU's readings now (``None`` for a reading it does not support, and for the
        energy counter when ``energy`` is False)."""
        h = self._handles[i]
        rec: dict[str, Any] = {"i": i}
        for what in _READINGS:
            val = None
            if what not in self._skip[i] and (energy or what != "energy_mj"):
                try:
                    val = self._read(h, what)
                except FieldUnsupported:
                    val = None
            if what == "util":
                rec["util_gpu"], rec["util_mem"] = val if val is not None else (None, None)
            elif what == "reasons_mask":
                rec["reasons_mask"] = val
                rec["reasons"] = list(decode_reasons(val)) if val is not None else None
            else:
                rec[what] = val
        return rec

    def energy_mj(self, index: int = 0) -> int | None:
        """The GPU's total-energy counter now (mJ), or None when it has none."""
        if not self._handles or index >= len(self._handles) or "energy_mj" in self._skip[index]:
            return None
        try:
            return self.source.energy_mj(self._handles[index])
        except FieldUnsupported:
            return None

    def index_of_uuid(self, uuid: str | None) -> int | None:
        """The NVML index of the GPU whose UUID ends with ``uuid`` (torch drops the ``GPU-`` prefix)."""
        if not uuid:
            return None
        want = str(uuid).lower().removeprefix("gpu-")
        for d in self.devices:
            if d["uuid"] and d["uuid"].lower().removeprefix("gpu-") == want:
                return d["index"]
        return None

    # ------------------------------------------------------------------ loop
    def _take(self, energy: bool = False) -> None:
        c0 = time.thread_time_ns()
        t_unix, t_mono = time.time_ns(), time.monotonic_ns()
        energy = energy or self._last_energy is None or t_mono - self._last_energy >= self.energy_period_s * 1e9
        if energy:
            self._last_energy = t_mono
        gpus = [self.read_gpu(i, energy) for i in range(len(self._handles))]
        self._write({"type": "sample", "t_unix_ns": t_unix, "t_mono_ns": t_mono, "gpus": gpus})
        self.samples += 1
        if t_mono - self._last_flush >= self.flush_s * 1e9:
            self._flush()
        self.cpu_ns += time.thread_time_ns() - c0

    def _run(self) -> None:
        period = int(1e9 / self.rate_hz)
        deadline = time.monotonic_ns() + period
        while not self._stop.wait(max(0, deadline - time.monotonic_ns()) / 1e9):
            self._take()
            deadline += period
            now = time.monotonic_ns()
            if deadline <= now:                       # whole periods missed: count, do not catch up
                missed = (now - deadline) // period + 1
                self.late += int(missed)
                deadline += missed * period

    def _write(self, obj: dict[str, Any]) -> None:
        if self._fh is None:
            return
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self._lock:
            if self._fh is not None:
                self._fh.write(line)

    def _flush(self) -> None:
        self._last_flush = time.monotonic_ns()
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
