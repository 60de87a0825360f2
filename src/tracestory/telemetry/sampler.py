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

Energy counter resets
---------------------
NVML's total-energy counter counts from the last driver load; a driver reload or GPU reset
starts it again from 0. A reading lower than the one before is taken as such a reset: the
counter written (``energy_mj``, and what :meth:`Sampler.energy_mj` returns) is continued, the
segments summed (the reading before the drop is added to every later reading), so energy over
any span is never negative. Each reset is listed in the ``end`` record's ``energy_resets``
(GPU, ``t_mono_ns``, the readings before and after). Lost: the energy between the last read
before the reset and the reset itself (at most one ``energy_period_s``); a reset after which
the counter is already above the reading before it cannot be seen.

Telemetry never fails the run it watches
----------------------------------------
A reading that raises (an NVML error after the start, a bug in a source) or returns a value
that is not a finite non-negative number is recorded as ``null``; an error outside the readings
(the file cannot be written, the thread fails) stops the sampling thread; neither reaches the
caller, and :meth:`Sampler.stop` never raises. Each such event is kept (once per GPU and reading)
in :attr:`Sampler.incomplete` and in the ``end`` record's ``incomplete`` list, so a reader states
"telemetry incomplete: <reason>" instead of taking a gap for a quiet GPU.
"""

from __future__ import annotations

import json
import math
import os
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


class _BadValue(Exception):
    """A reading that is not a finite non-negative number."""

    def __init__(self, value: Any):
        super().__init__(repr(value)[:60])
        self.value = value


def _count(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


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
        self.incomplete: list[str] = []             # why the telemetry is incomplete (module docstring)
        self._noted: set[str] = set()
        self.energy_resets: list[dict[str, Any]] = []
        self._energy_raw: list[int | None] = []     # last raw counter reading per GPU
        self._energy_offset: list[int] = []         # summed segments before the last reset per GPU
        self._energy_lock = threading.Lock()

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
            self._energy_raw, self._energy_offset = [None] * n, [0] * n
            for i, h in enumerate(self._handles):
                self._probe(i, h)
            self.devices = [{"index": i, "name": self.source.name(h), "uuid": self.source.uuid(h),
                             "pci_bus_id": self.source.pci_bus_id(h), "unsupported": sorted(self._skip[i])}
                            for i, h in enumerate(self._handles)]
        except (TelemetryUnavailable, FieldUnsupported) as e:
            self._shutdown_source()
            raise TelemetryUnavailable(str(e)) from None
        except Exception as e:  # noqa: BLE001  a broken NVML (or source) means no telemetry, not a failed run
            self._shutdown_source()
            raise TelemetryUnavailable(f"NVML failed while starting ({type(e).__name__}: {e})") from None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 -- open until stop()
            except OSError as e:
                self._shutdown_source()
                raise UsageError(f"{self.path}: expected a writable telemetry file, found {e.strerror or e}") from None
        try:
            self._begin()
        except Exception as e:  # noqa: BLE001  e.g. the header cannot be written: no telemetry, said so
            self._close_file()
            self._shutdown_source()
            raise TelemetryUnavailable(f"the telemetry could not start ({type(e).__name__}: {e})") from None
        self._thread = threading.Thread(target=self._run, name="tracestory-telemetry", daemon=True)
        self._thread.start()
        return self

    def _begin(self) -> None:
        """The header and the first sample."""
        import socket   # here, not at the top: reading a telemetry file imports this package (start-up)

        t0_unix, t0_mono = time.time_ns(), time.monotonic_ns()
        self._write({"type": "header", "schema": SCHEMA, "source": "nvml", "rate_hz": self.rate_hz,
                     "energy_period_s": self.energy_period_s, "t0_unix_ns": t0_unix, "t0_mono_ns": t0_mono, "clocks": CLOCKS, "units": FIELDS,
                     "driver_version": self.source.driver_version(), "devices": self.devices,
                     "host": socket.gethostname(), "pid": os.getpid(), "label": self.label,
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
        self._started = True
        self._take(energy=True)
        self._flush()

    def stop(self) -> None:
        """Take a last sample, write the ``end`` record, close the file, shut NVML down. Never
        raises: what goes wrong is kept in :attr:`incomplete` (module docstring)."""
        if not self._started:
            return
        self._started = False
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            self.note("thread", "the sampling thread ended before the run did")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                self.note("thread", "the sampling thread did not stop within 5 s")
        try:
            self._take(energy=True)
        except Exception as e:  # noqa: BLE001
            self.note("last sample", f"the last sample failed ({type(e).__name__}: {e})")
        try:
            self._write({"type": "end", "t_unix_ns": time.time_ns(), "t_mono_ns": time.monotonic_ns(),
                         "samples": self.samples, "late": self.late,
                         "cpu_ns_per_sample": self.cpu_ns / self.samples if self.samples else None,
                         "energy_resets": self.energy_resets, "incomplete": self.incomplete})
        except Exception as e:  # noqa: BLE001
            self.note("end", f"the end record could not be written ({type(e).__name__}: {e})")
        self._close_file()
        self._shutdown_source()

    def note(self, key: str, reason: str) -> None:
        """Keep why the telemetry is incomplete (once per ``key``)."""
        with self._lock:
            if key not in self._noted:
                self._noted.add(key)
                self.incomplete.append(reason)

    @property
    def incomplete_reason(self) -> str | None:
        """``telemetry incomplete: <reasons>``, or None when nothing went wrong."""
        return f"telemetry incomplete: {'; '.join(self.incomplete)}" if self.incomplete else None

    def _close_file(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except Exception as e:  # noqa: BLE001  (a full disk on the last flush)
                self.note("close", f"the telemetry file could not be closed ({type(e).__name__}: {e})")

    def _shutdown_source(self) -> None:
        try:
            self.source.shutdown()
        except Exception as e:  # noqa: BLE001
            self.note("shutdown", f"NVML shutdown failed ({type(e).__name__}: {e})")

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading
    def _probe(self, i: int, h: Any) -> None:
        for what in _READINGS:
            try:
                self._read(h, what, i)
            except FieldUnsupported:
                self._skip[i].add(what)
            except Exception as e:  # noqa: BLE001  a reading that fails at the start is not read again
                self._skip[i].add(what)
                self.note(f"{i}:{what}", f"GPU {i} {what}: not read ({type(e).__name__}: {e})")

    def _read(self, h: Any, what: str, i: int):
        s = self.source
        if what == "sm_mhz":
            v = s.sm_clock_mhz(h)
        elif what == "mem_mhz":
            v = s.mem_clock_mhz(h)
        elif what == "power_w":
            mw = s.power_mw(h)
            v = mw / 1000.0 if _count(mw) else mw
        elif what == "energy_mj":
            return self._energy(i, s.energy_mj(h))
        elif what == "temp_c":
            v = s.temperature_c(h)
        elif what == "util":
            v = s.utilization(h)
            if isinstance(v, tuple) and len(v) == 2 and all(_count(x) for x in v):
                return v
            raise _BadValue(v)
        else:
            v = s.clock_event_mask(h)
        if not _count(v) or (what == "reasons_mask" and not isinstance(v, int)):
            raise _BadValue(v)
        return v

    def _energy(self, i: int, raw: Any) -> int:
        """The continued counter of GPU ``i`` from a raw reading (module docstring: resets)."""
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise _BadValue(raw)
        with self._energy_lock:
            last = self._energy_raw[i]
            if last is not None and raw < last:
                self._energy_offset[i] += last
                self.energy_resets.append({"gpu": i, "t_mono_ns": time.monotonic_ns(), "before_mj": last,
                                           "after_mj": raw})
            self._energy_raw[i] = raw
            return self._energy_offset[i] + raw

    def read_gpu(self, i: int, energy: bool = True) -> dict[str, Any]:
        """One GPU's readings now (``None`` for a reading it does not support, and for the
        energy counter when ``energy`` is False)."""
        h = self._handles[i]
        rec: dict[str, Any] = {"i": i}
        for what in _READINGS:
            val = None
            if what not in self._skip[i] and (energy or what != "energy_mj"):
                try:
                    val = self._read(h, what, i)
                except FieldUnsupported as e:   # supported at the start: an NVML error now
                    self.note(f"{i}:{what}", f"GPU {i} {what}: NVML error after the start ({e}); null where it failed")
                except _BadValue as e:
                    self.note(f"{i}:{what}", f"GPU {i} {what}: not a finite non-negative number ({e.value!r:.60}); "
                                             "null where it was")
                except Exception as e:  # noqa: BLE001  a broken reading must not end the sampling
                    self.note(f"{i}:{what}", f"GPU {i} {what}: {type(e).__name__}: {e}; null where it failed")
            if what == "util":
                rec["util_gpu"], rec["util_mem"] = val if val is not None else (None, None)
            elif what == "reasons_mask":
                rec["reasons_mask"] = val
                rec["reasons"] = list(decode_reasons(val)) if val is not None else None
            else:
                rec[what] = val
        return rec

    def energy_mj(self, index: int = 0) -> int | None:
        """The GPU's total-energy counter now (mJ, continued across resets: module docstring), or
        None when it has none or the reading fails (kept in :attr:`incomplete`)."""
        if not self._handles or index >= len(self._handles) or "energy_mj" in self._skip[index]:
            return None
        try:
            return self._read(self._handles[index], "energy_mj", index)
        except Exception as e:  # noqa: BLE001
            self.note(f"{index}:energy_mj", f"GPU {index} energy_mj: {type(e).__name__}: {e}")
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
            try:
                self._take()
            except Exception as e:  # noqa: BLE001  the thread ends; the run it watches goes on
                self.note("thread", f"sampling stopped ({type(e).__name__}: {e})")
                return
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
