"""Clock event ("throttle") reasons: NVML's bitmask decoded into names.

``nvmlDeviceGetCurrentClocksEventReasons`` (older name: ``...ClocksThrottleReasons``) returns a
bitmask; each set bit is one reason why the clocks are below their maximum. The bit values are
NVML's (``nvml.h``, ``nvmlClocksEventReason*``); a bit this table does not know is kept as
``unknown_0x<hex>`` so nothing is dropped silently.

Which reasons mean "slowed down by power or heat": :data:`SLOWDOWN_REASONS` (software power cap,
hardware slowdown, software and hardware thermal slowdown, hardware power brake). ``gpu_idle``,
``applications_clocks``, ``sync_boost`` and ``display_clocks`` are settings or idleness, not a
sign of a hot or power-starved GPU.
"""

from __future__ import annotations

# name -> NVML bit (nvmlClocksEventReason*), in bit order
REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,                 # nvmlClocksEventReasonGpuIdle
    "applications_clocks": 0x2,      # ...ApplicationsClocksSetting
    "sw_power_cap": 0x4,             # ...SwPowerCap
    "hw_slowdown": 0x8,              # ...HwSlowdown (thermal or power brake, from the hardware)
    "sync_boost": 0x10,              # ...SyncBoost
    "sw_thermal": 0x20,              # ...SwThermalSlowdown
    "hw_thermal": 0x40,              # ...HwThermalSlowdown
    "hw_power_brake": 0x80,          # ...HwPowerBrakeSlowdown
    "display_clocks": 0x100,         # ...DisplayClockSetting
}

DESCRIPTIONS: dict[str, str] = {
    "gpu_idle": "GPU idle",
    "applications_clocks": "applications clocks setting",
    "sw_power_cap": "software power cap",
    "hw_slowdown": "hardware slowdown",
    "sync_boost": "sync boost",
    "sw_thermal": "software thermal slowdown",
    "hw_thermal": "hardware thermal slowdown",
    "hw_power_brake": "hardware power brake",
    "display_clocks": "display clock setting",
}

SLOWDOWN_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


def decode_reasons(mask: int) -> tuple[str, ...]:
    """The names of the bits set in ``mask``, in bit order; unknown bits as ``unknown_0x..``."""
    mask = int(mask)
    names = [name for name, bit in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS.values())
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def describe(name: str) -> str:
    """A reason's words for a report (``sw_power_cap`` -> "software power cap")."""
    return DESCRIPTIONS.get(name, name.replace("_", " "))
