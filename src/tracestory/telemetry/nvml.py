"""The one place that talks to NVML: a small adapter the sampler reads through.

:class:`NvmlSource` is the interface (what the sampler needs, nothing more); :class:`PynvmlSource`
implements it over ``nvidia-ml-py`` (module ``pynvml``, imported here and only when a sampler
starts); tests and the overhead benchmark pass :class:`tracestory.telemetry.fake.FakeNvml`
instead, so no test patches ``pynvml``.

Units are NVML's: clocks in MHz, power in mW, the total-energy counter in mJ (since the driver
was loaded), temperature in degrees C, utilisation in percent, clock event reasons as a bitmask.
A reading the device does not support raises :class:`FieldUnsupported`; the sampler then
records ``null`` for it and stops asking.

Limits (NVML's, stated so a reader does not over-read the numbers): on Ampere and newer
(except GA100) ``nvmlDeviceGetPowerUsage`` is an average over about one second, so short
spikes are smoothed; utilisation is the share of the last sample period (1/6 s to 1 s) in
which a kernel ran, not how busy the SMs were; the energy counter advances in steps of
tens of milliseconds, so windows much shorter than that are not resolved.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol


class TelemetryUnavailable(Exception):
    """NVML cannot be used here (module missing, no driver, init failed); the message says why."""


class FieldUnsupported(Exception):
    """One reading is not supported by this device or driver."""


class NvmlSource(Protocol):
    """What the sampler reads. ``h`` is the handle returned by :meth:`handle`."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str | None: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def name(self, h: Any) -> str: ...
    def uuid(self, h: Any) -> str | None: ...
    def pci_bus_id(self, h: Any) -> str | None: ...
    def sm_clock_mhz(self, h: Any) -> int: ...
    def mem_clock_mhz(self, h: Any) -> int: ...
    def power_mw(self, h: Any) -> int: ...
    def energy_mj(self, h: Any) -> int: ...
    def temperature_c(self, h: Any) -> int: ...
    def utilization(self, h: Any) -> tuple[int, int]: ...       # (gpu %, memory %)
    def clock_event_mask(self, h: Any) -> int: ...


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class PynvmlSource:
    """:class:`NvmlSource` over ``pynvml`` (``nvidia-ml-py``)."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise TelemetryUnavailable("nvidia-ml-py is not installed (pip install 'tracestory[telemetry]')") from None
        self._nv = pynvml

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._nv.NVMLError as e:
            raise FieldUnsupported(str(e)) from None

    def init(self) -> None:
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as e:  # LibraryNotFound, DriverNotLoaded, NoPermission, ...
            raise TelemetryUnavailable(f"nvmlInit failed ({e})") from None

    def shutdown(self) -> None:
        with contextlib.suppress(self._nv.NVMLError):   # a half-initialised library: nothing to undo
            self._nv.nvmlShutdown()

    def driver_version(self) -> str | None:
        try:
            return _text(self._nv.nvmlSystemGetDriverVersion())
        except self._nv.NVMLError:
            return None

    def device_count(self) -> int:
        try:
            return int(self._nv.nvmlDeviceGetCount())
        except self._nv.NVMLError as e:
            raise TelemetryUnavailable(f"nvmlDeviceGetCount failed ({e})") from None

    def handle(self, index: int) -> Any:
        try:
            return self._nv.nvmlDeviceGetHandleByIndex(index)
        except self._nv.NVMLError as e:
            raise TelemetryUnavailable(f"GPU {index}: no NVML handle ({e})") from None

    def name(self, h: Any) -> str:
        return _text(self._call(self._nv.nvmlDeviceGetName, h))

    def uuid(self, h: Any) -> str | None:
        try:
            return _text(self._nv.nvmlDeviceGetUUID(h))
        except self._nv.NVMLError:
            return None

    def pci_bus_id(self, h: Any) -> str | None:
        try:
            return _text(self._nv.nvmlDeviceGetPciInfo(h).busId)
        except self._nv.NVMLError:
            return None

    def sm_clock_mhz(self, h: Any) -> int:
        return int(self._call(self._nv.nvmlDeviceGetClockInfo, h, self._nv.NVML_CLOCK_SM))

    def mem_clock_mhz(self, h: Any) -> int:
        return int(self._call(self._nv.nvmlDeviceGetClockInfo, h, self._nv.NVML_CLOCK_MEM))

    def power_mw(self, h: Any) -> int:
        return int(self._call(self._nv.nvmlDeviceGetPowerUsage, h))

    def energy_mj(self, h: Any) -> int:
        return int(self._call(self._nv.nvmlDeviceGetTotalEnergyConsumption, h))

    def temperature_c(self, h: Any) -> int:
        return int(self._call(self._nv.nvmlDeviceGetTemperature, h, self._nv.NVML_TEMPERATURE_GPU))

    def utilization(self, h: Any) -> tuple[int, int]:
        u = self._call(self._nv.nvmlDeviceGetUtilizationRates, h)
        return int(u.gpu), int(u.memory)

    def clock_event_mask(self, h: Any) -> int:
        fn = (getattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or self._nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        return int(self._call(fn, h))
