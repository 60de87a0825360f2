"""GPU telemetry over the traced window: clocks, power, energy, throttle reasons, joules per token.

Model
-----
* **Time base.** Samples carry Unix epoch ns (``t_unix_ns``). A Kineto trace's events are at
  ``baseTimeNanoseconds + ts`` on the same clock, so the traced window is
  ``[base + first kernel start, base + last kernel end]`` (the union over the traces). A trace
  without that base (nsys, an old Kineto) cannot be placed: the window is then the whole
  telemetry, and :attr:`TelemetryResult.window_source` says so.
* **Sample and hold.** Sample ``k``'s readings hold over ``[t_k, t_{k+1})``. A sample belongs to
  the window when that interval overlaps it (so a window shorter than one period still has the
  sample that covered it); a reason's (or a low clock's) time in the window is the overlap of
  the intervals where it held.
* **Energy in the window** is ``E(w1) - E(w0)`` with ``E`` the total-energy counter linearly
  interpolated between samples; without the counter, ``E`` is the trapezoid integral of power.
  The window is first clipped to the telemetry's span. NVML's power is a ~1 s average on
  recent GPUs, so the integral smooths short bursts; the counter does not.
* **Clock drop** (finding ``gpu_clock_drop``, :mod:`.findings.telemetry`): busy time (NVML
  utilisation >= 1%, no ``gpu_idle`` reason) with the SM clock below ``CLOCK_DROP_FRACTION``
  (90%) of the highest SM clock of the whole telemetry, or a power/thermal slowdown reason.
* **Joules per token** (serving, with the scheduler event log of the same run; the log's
  ``t0_unix_ns`` places its iterations on the telemetry's clock): each iteration's energy is
  ``E(end) - E(start)`` summed over the GPUs that were busy (median utilisation > 0 during the
  iterations; all GPUs when none was). Decode-only iterations give
  ``decode J/token = their energy / their decode tokens``. Iterations with prefill give
  ``prefill J/token = (their energy - their decode tokens x decode J/token) / their prefill
  tokens`` (when there are no decode-only iterations, only iterations without decode tokens
  give a prefill figure). Energy between iterations (idle, HTTP, scheduling outside the
  iteration) is attributed to no token; ``all_in_j_per_token`` is the energy from the first
  iteration's start to the last one's end over every token, idle included. Iterations outside
  the telemetry's span are left out and counted. Energy is interpolated within sample periods
  (50 ms at 20 Hz), far longer than an iteration, so per-iteration energy is an average-power
  share, good over many iterations, not for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ingest.telemetry import TelemetryLog
from ..telemetry import REASON_BITS, SLOWDOWN_REASONS, decode_reasons, describe
from ..trace import Trace
from .findings.base import Finding
from .findings.telemetry import rule_clock_drop

CLOCK_DROP_FRACTION = 0.90
BUSY_UTIL_PCT = 1.0
_IDLE_BIT = 0x1


@dataclass(frozen=True)
class Stat3:
    min: float | None
    median: float | None
    max: float | None


@dataclass(frozen=True)
class ReasonTime:
    name: str
    description: str
    slowdown: bool                  # a power/thermal reason (not idle, not a setting)
    duration_ns: int                # time in the window the reason held
    samples: int                    # window samples with the reason set


@dataclass(frozen=True)
class GpuWindow:
    index: int
    name: str | None
    samples: int                    # samples in the window (sample and hold)
    sm_mhz: Stat3
    mem_mhz: Stat3
    power_w: Stat3
    temp_c: Stat3
    util_gpu_median: float | None
    energy_j: float | None
    energy_method: str | None       # "energy counter" | "integrated power"
    run_max_sm_mhz: float | None    # highest SM clock over the whole telemetry
    busy_sm_min_mhz: float | None   # lowest SM clock in the window while busy
    low_clock_busy_ns: int          # busy time with the SM clock below the drop threshold
    reasons: tuple[ReasonTime, ...]

    @property
    def busy_sm_min_fraction(self) -> float | None:
        """Lowest busy SM clock over the run's highest."""
        if self.busy_sm_min_mhz is None or not self.run_max_sm_mhz:
            return None
        return self.busy_sm_min_mhz / self.run_max_sm_mhz


@dataclass(frozen=True)
class TokenEnergy:
    decode_j_per_token: float | None
    prefill_j_per_token: float | None
    all_in_j_per_token: float | None
    decode_tokens: int              # in decode-only iterations
    prefill_tokens: int             # in iterations with prefill
    decode_only_iterations: int
    prefill_iterations: int
    outside_iterations: int         # iterations outside the telemetry span, left out
    gpus: tuple[int, ...]
    energy_method: str


@dataclass(frozen=True)
class TelemetryResult:
    path: str
    rate_hz: float | None
    n_samples: int
    span_unix_ns: tuple[int, int] | None
    span_ns: int | None                     # last sample - first sample
    window_unix_ns: tuple[int, int] | None
    window_ns: int | None
    window_source: str
    overlaps: bool                  # the telemetry covers some of the window
    gpus: tuple[GpuWindow, ...]
    tokens: TokenEnergy | None
    findings: tuple[Finding, ...]
    warnings: tuple[str, ...]
    clock_drop_fraction: float              # the finding's threshold (of the run's highest SM clock)
    log: TelemetryLog = field(repr=False, compare=False)


# ---------------------------------------------------------------------------- window
def trace_window_unix(traces: Sequence[Trace]) -> tuple[int, int] | None:
    """``[first kernel start, last kernel end]`` of the traces in Unix epoch ns, or None when a
    trace has kernels but no ``baseTimeNanoseconds`` (or no trace has kernels)."""
    lo, hi = None, None
    for t in traces:
        k = t.kernels
        if len(k) == 0:
            continue
        base = (t.meta.extra or {}).get("baseTimeNanoseconds")
        if not isinstance(base, (int, float)) or isinstance(base, bool):
            return None
        s = int(base) + int(np.min(k["start_ns"]))
        e = int(base) + int(np.max(k["end_ns"]))
        lo, hi = (s, e) if lo is None else (min(lo, s), max(hi, e))
    return None if lo is None else (lo, hi)


def _hold_overlap(t: np.ndarray, w0: int, w1: int) -> np.ndarray:
    """ns of ``[w0, w1]`` covered by each sample's hold interval ``[t_k, t_{k+1})``."""
    nxt = np.append(t[1:], t[-1])
    return np.clip(np.minimum(nxt, w1) - np.maximum(t, w0), 0, None)


def _in_window(t: np.ndarray, w0: int, w1: int) -> np.ndarray:
    """Samples whose hold interval overlaps the window, or that lie in it."""
    return (_hold_overlap(t, w0, w1) > 0) | ((t >= w0) & (t <= w1))


def _stat(v: np.ndarray) -> Stat3:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return Stat3(None, None, None)
    return Stat3(float(v.min()), float(np.median(v)), float(v.max()))


def energy_curve(t: np.ndarray, counter_mj: np.ndarray, power_w: np.ndarray):
    """``(times, joules, method)``: the cumulative energy curve of one GPU (counter in J, or
    the trapezoid integral of power), or None when neither is there."""
    ok = np.isfinite(counter_mj)
    if ok.sum() >= 2:
        return t[ok], (counter_mj[ok] - counter_mj[ok][0]) / 1000.0, "energy counter"
    ok = np.isfinite(power_w)
    if ok.sum() >= 2:
        tt, pp = t[ok], power_w[ok]
        steps = (pp[1:] + pp[:-1]) / 2 * (np.diff(tt) / 1e9)
        return tt, np.concatenate([[0.0], np.cumsum(steps)]), "integrated power"
    return None


def _energy_between(curve, a: int, b: int) -> float | None:
    t, e, _ = curve
    a, b = max(a, int(t[0])), min(b, int(t[-1]))
    if b <= a:
        return 0.0 if b == a else None
    return float(np.interp(b, t, e) - np.interp(a, t, e))


def _gpu_window(log: TelemetryLog, g: int, w0: int, w1: int) -> GpuWindow:
    t = log.t_unix_ns
    r = {k: v[g] for k, v in log.readings.items()}
    mask = log.reasons_mask[g]
    sel = _in_window(t, w0, w1)
    hold = _hold_overlap(t, w0, w1)
    run_max = _stat(r["sm_mhz"]).max
    busy = (np.nan_to_num(r["util_gpu"], nan=0.0) >= BUSY_UTIL_PCT) & ~((mask >= 0) & (mask & _IDLE_BIT > 0))
    busy_sel = sel & busy & np.isfinite(r["sm_mhz"])
    low = busy & np.isfinite(r["sm_mhz"]) & (r["sm_mhz"] < CLOCK_DROP_FRACTION * run_max) if run_max else \
        np.zeros_like(busy)
    reasons = []
    bits = int(np.bitwise_or.reduce(np.where(sel & (mask >= 0), mask, 0))) if t.size else 0
    for name in decode_reasons(bits):
        bit = REASON_BITS.get(name) or int(name.removeprefix("unknown_"), 16)
        on = (mask >= 0) & (mask & bit > 0)
        reasons.append(ReasonTime(name, describe(name), name in SLOWDOWN_REASONS, int(hold[on].sum()),
                                  int((on & sel).sum())))
    curve = energy_curve(t, r["energy_mj"], r["power_w"])
    energy = _energy_between(curve, w0, w1) if curve is not None else None
    dev = log.devices[g] if g < len(log.devices) else {}
    return GpuWindow(
        index=int(dev.get("index", g)), name=dev.get("name"), samples=int(sel.sum()),
        sm_mhz=_stat(r["sm_mhz"][sel]), mem_mhz=_stat(r["mem_mhz"][sel]), power_w=_stat(r["power_w"][sel]),
        temp_c=_stat(r["temp_c"][sel]), util_gpu_median=_stat(r["util_gpu"][sel]).median,
        energy_j=energy, energy_method=curve[2] if curve is not None else None, run_max_sm_mhz=run_max,
        busy_sm_min_mhz=float(r["sm_mhz"][busy_sel].min()) if busy_sel.any() else None,
        low_clock_busy_ns=int(hold[low].sum()), reasons=tuple(reasons))


# ---------------------------------------------------------------------------- tokens
def token_energy(log: TelemetryLog, sched) -> TokenEnergy | None:
    """Joules per decode and prefill token of a serving run (see the module docstring);
    None without ``t0_unix_ns`` in the log, without iterations, or without an energy curve."""
    t0 = getattr(sched.meta, "t0_unix_ns", None)
    if t0 is None or not sched.iterations or log.n_samples < 2:
        return None
    t = log.t_unix_ns
    its = [(t0 + it.t_start_ns, t0 + it.t_end_ns, it) for it in sched.iterations]
    inside = [x for x in its if x[0] >= t[0] and x[1] <= t[-1]]
    if not inside:
        return None
    a, b = inside[0][0], max(x[1] for x in inside)
    sel = (t >= a) & (t <= b)
    util = log.readings["util_gpu"]
    busy = tuple(g for g in range(log.n_gpus)
                 if sel.any() and np.isfinite(util[g][sel]).any() and np.nanmedian(util[g][sel]) > 0)
    gpus = busy or tuple(range(log.n_gpus))
    curves = [energy_curve(t, log.readings["energy_mj"][g], log.readings["power_w"][g]) for g in gpus]
    if any(c is None for c in curves):
        return None

    def energy(s: int, e: int) -> float:
        return sum(_energy_between(c, s, e) or 0.0 for c in curves)

    dec_e = dec_tok = pre_e = pre_dec_tok = pre_tok = 0.0
    n_dec = n_pre = 0
    for s, e, it in inside:
        d = sum(m.tokens for m in it.members if m.phase == "decode")
        p = it.prefill_tokens
        if p == 0 and d > 0:
            dec_e, dec_tok, n_dec = dec_e + energy(s, e), dec_tok + d, n_dec + 1
        elif p > 0:
            pre_e, pre_dec_tok, pre_tok, n_pre = pre_e + energy(s, e), pre_dec_tok + d, pre_tok + p, n_pre + 1
    decode = dec_e / dec_tok if dec_tok else None
    prefill = None
    if pre_tok and (decode is not None or pre_dec_tok == 0):
        prefill = (pre_e - pre_dec_tok * (decode or 0.0)) / pre_tok
    tokens = dec_tok + pre_dec_tok + pre_tok
    return TokenEnergy(decode, prefill, energy(a, b) / tokens if tokens else None, int(dec_tok), int(pre_tok),
                       n_dec, n_pre, len(its) - len(inside), tuple(int(log.devices[g].get("index", g)) if g < len(log.devices)
                                                                   else g for g in gpus), curves[0][2])


# ---------------------------------------------------------------------------- entry
def analyze_telemetry(log: TelemetryLog, traces: Sequence[Trace] = (), sched=None) -> TelemetryResult:
    """Everything the report says about the telemetry (see the module docstring)."""
    t = log.t_unix_ns
    span = (int(t[0]), int(t[-1])) if t.size else None
    window = trace_window_unix(traces)
    if window is not None:
        source = "the traced window (first kernel start to last kernel end, Kineto baseTimeNanoseconds)"
    elif traces and any(len(tr.kernels) for tr in traces):
        source = ("the whole telemetry: the trace has no Unix time base (no Kineto baseTimeNanoseconds), "
                  "so its window cannot be placed on the telemetry's clock")
    else:
        source = "the whole telemetry (no trace with kernels)"
    w = window or span
    overlaps = bool(span and w and w[0] <= span[1] and w[1] >= span[0])
    gpus = tuple(_gpu_window(log, g, *w) for g in range(log.n_gpus)) if overlaps else ()
    findings = tuple(rule_clock_drop(gpus, (w[1] - w[0]) if w else None, CLOCK_DROP_FRACTION))
    tokens = token_energy(log, sched) if sched is not None else None
    return TelemetryResult(path=log.path, rate_hz=log.rate_hz, n_samples=log.n_samples, span_unix_ns=span,
                           span_ns=span[1] - span[0] if span else None, window_unix_ns=w,
                           window_ns=w[1] - w[0] if w else None, window_source=source, overlaps=overlaps, gpus=gpus, tokens=tokens,
                           findings=findings, warnings=log.warnings, clock_drop_fraction=CLOCK_DROP_FRACTION,
                           log=log)
