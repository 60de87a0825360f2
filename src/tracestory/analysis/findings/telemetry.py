"""Rule on GPU telemetry: the SM clock dropped, or a power/thermal clock event reason fired,
during the traced window (:mod:`tracestory.analysis.telemetry` computes the numbers).

Fires per GPU when, inside the window, (a) the GPU was busy (NVML utilisation >= 1%, no
``gpu_idle`` reason) while its SM clock was below ``CLOCK_DROP_FRACTION`` of the highest SM clock
of the whole telemetry, or (b) a slowdown reason (software power cap, hardware slowdown,
software/hardware thermal slowdown, hardware power brake) was set. Severity ``medium`` when
the low-clock or slowdown time is at least 10% of the window, ``low`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...telemetry import describe
from ...units import fmt_ns
from .base import Evidence, Finding

MEDIUM_SHARE = 0.10


def rule_clock_drop(gpus: Sequence, window_ns: int | None, threshold: float) -> list[Finding]:
    """One finding per GPU whose clocks dropped or that throttled in the window (``gpus``:
    :class:`~tracestory.analysis.telemetry.GpuWindow`)."""
    out = []
    for g in gpus:
        slow = [r for r in g.reasons if r.slowdown and r.duration_ns > 0]
        if g.low_clock_busy_ns <= 0 and not slow:
            continue
        worst = max([g.low_clock_busy_ns] + [r.duration_ns for r in slow])
        share = worst / window_ns if window_ns else None
        severity = "medium" if share is None or share >= MEDIUM_SHARE else "low"
        parts = []
        if g.low_clock_busy_ns > 0 and g.busy_sm_min_fraction is not None:
            parts.append(f"SM clock down to {g.busy_sm_min_mhz:.0f} MHz ({g.busy_sm_min_fraction:.0%} "
                         f"of the run's {g.run_max_sm_mhz:.0f} MHz) for {fmt_ns(g.low_clock_busy_ns)} while busy")
        if slow:
            parts.append("throttle reasons " + ", ".join(f"{describe(r.name)} ({fmt_ns(r.duration_ns)})" for r in slow))
        out.append(Finding(
            rule="gpu_clock_drop", severity=severity,
            title=f"GPU {g.index} throttled in the traced window: " + "; ".join(parts),
            evidence=(Evidence("lowest SM clock while busy (MHz)", g.busy_sm_min_mhz, "count"),
                      Evidence("highest SM clock of the run (MHz)", g.run_max_sm_mhz, "count"),
                      Evidence("lowest busy SM clock over the highest", g.busy_sm_min_fraction, "fraction"),
                      Evidence(f"busy time below {threshold:.0%} of it", g.low_clock_busy_ns, "ns"),
                      Evidence("slowdown reasons", ", ".join(r.name for r in slow) or None, "text"),
                      Evidence("share of the window", share, "fraction")),
            implication="Kernels in this window ran at lower clocks than the GPU can reach: their times "
                        "understate the hardware and differ from a run at full clocks.",
            recommendation="Compare runs only at the same clocks (lock them with `nvidia-smi -lgc` for "
                           "benchmarks), and check power and cooling limits (`nvidia-smi -q -d "
                           "PERFORMANCE,POWER,TEMPERATURE`) when a thermal or power reason fired."))
    return out
