"""A fake NVML whose readings the caller sets: for tests and the overhead benchmark.

``FakeNvml(gpus=[FakeGpu(...)])`` implements :class:`tracestory.telemetry.nvml.NvmlSource`.
Every reading returns the :class:`FakeGpu`'s current attribute (change it while a sampler runs
to change what the next sample sees); ``energy_mj`` is the counter as set, plus ``power_w``
integrated over real time when ``integrate_energy`` is true. A field listed in
``unsupported`` raises :class:`~tracestory.telemetry.nvml.FieldUnsupported`. ``fail_init``
makes :meth:`FakeNvml.init` fail the way a machine without a driver does. ``calls`` counts
readings, so a test can check how often the sampler asked.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .nvml import FieldUnsupported, TelemetryUnavailable


@dataclass
class FakeGpu:
    name: str = "Fake GPU"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    power_w: float = 300.0
    energy_mj: int = 0
    temp_c: int = 50
    util_gpu: int = 100
    util_mem: int = 50
    clock_event_mask: int = 0
    unsupported: set[str] = field(default_factory=set)


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu] | None = None, *, fail_init: str | None = None,
                 integrate_energy: bool = False):
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.fail_init = fail_init
        self.integrate_energy = integrate_energy
        self.calls = 0
        self.initialised = False
        self._lock = threading.Lock()
        self._t_last = time.monotonic_ns()

    def _get(self, i: int, what: str):
        with self._lock:
            self.calls += 1
            g = self.gpus[i]
            if what in g.unsupported:
                raise FieldUnsupported(f"{what}: Not Supported")
            return getattr(g, what)

    def init(self) -> None:
        if self.fail_init:
            raise TelemetryUnavailable(self.fail_init)
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    def driver_version(self) -> str | None:
        return "fake"

    def device_count(self) -> int:
        return len(self.gpus)

    def handle(self, index: int) -> int:
        return index

    def name(self, h: int) -> str:
        return self.gpus[h].name

    def uuid(self, h: int) -> str | None:
        return self.gpus[h].uuid

    def pci_bus_id(self, h: int) -> str | None:
        return f"00000000:{h + 1:02X}:00.0"

    def sm_clock_mhz(self, h: int) -> int:
        return self._get(h, "sm_mhz")

    def mem_clock_mhz(self, h: int) -> int:
        return self._get(h, "mem_mhz")

    def power_mw(self, h: int) -> int:
        return int(round(self._get(h, "power_w") * 1000))

    def energy_mj(self, h: int) -> int:
        if self.integrate_energy:
            with self._lock:
                now = time.monotonic_ns()
                for g in self.gpus:
                    g.energy_mj += int(g.power_w * (now - self._t_last) / 1e6)
                self._t_last = now
        return self._get(h, "energy_mj")

    def temperature_c(self, h: int) -> int:
        return self._get(h, "temp_c")

    def utilization(self, h: int) -> tuple[int, int]:
        return self._get(h, "util_gpu"), self._get(h, "util_mem")

    def clock_event_mask(self, h: int) -> int:
        return self._get(h, "clock_event_mask")
