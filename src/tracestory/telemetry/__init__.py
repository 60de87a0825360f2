"""GPU telemetry: clocks, power, energy, temperature, utilisation and clock event ("throttle")
reasons sampled from NVML while a workload runs, written as ``telemetry.jsonl``.

Pieces: :mod:`.nvml` (the one adapter over ``nvidia-ml-py``; optional extra ``telemetry``),
:mod:`.fake` (a fake NVML for tests and the overhead benchmark), :mod:`.reasons` (the clock
event bitmask decoded into names), :mod:`.sampler` (the thread and the file).

:func:`maybe_sampler` is what commands call: a context manager yielding a running
:class:`Sampler`, or ``None`` when telemetry is off, for one of three reasons:

* asked off: ``enabled=False`` (``--skip-power-monitor``; Nsight Compute captures) or the
  environment variable ``TRACESTORY_SKIP_POWER_MONITOR`` set to a true value (a capture sets it
  for its children, since the capture process samples itself) -- silently, as asked;
* NVML unusable (module missing, no driver, ``nvmlInit`` failed, no GPU, any error while the
  sampler starts): one line on stderr, ``GPU telemetry off: <why>``, never a failure.

Once running, telemetry cannot fail the run it watches: a failing reading, a bad value or a
sampling thread that stops are kept in :attr:`Sampler.incomplete` (and the file's ``end``
record), :meth:`Sampler.stop` never raises, and a command records
:attr:`Sampler.incomplete_reason` ("telemetry incomplete: <reason>") where it records the
telemetry: the capture manifest's ``telemetry.incomplete``, ``load``'s result and summary
(``telemetry_incomplete``); ``bench`` and ``serve`` leave it in the file's ``end`` record, which
the report states.

While a sampler runs it is :func:`active` (``bench.timer.measure`` reads the energy counter
through it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ..errors import UsageError
from .nvml import NvmlSource, PynvmlSource, TelemetryUnavailable
from .reasons import REASON_BITS, SLOWDOWN_REASONS, decode_reasons, describe
from .sampler import DEFAULT_HZ, FILE_NAME, SCHEMA, Sampler, check_rate

__all__ = ["DEFAULT_HZ", "FILE_NAME", "PATH_ENV", "REASON_BITS", "SCHEMA", "SKIP_ENV", "SLOWDOWN_REASONS",
           "Sampler", "TelemetryUnavailable", "active", "check_rate", "decode_reasons", "describe",
           "maybe_sampler", "skipped_by_env"]

SKIP_ENV = "TRACESTORY_SKIP_POWER_MONITOR"
PATH_ENV = "TRACESTORY_TELEMETRY"          # where `tracestory serve` writes its telemetry
_TRUE = {"1", "true", "yes", "on"}
_active: list[Sampler] = []


def skipped_by_env(env=None) -> bool:
    """True when ``TRACESTORY_SKIP_POWER_MONITOR`` asks telemetry off."""
    env = os.environ if env is None else env
    return str(env.get(SKIP_ENV, "")).strip().lower() in _TRUE


def active() -> Sampler | None:
    """The innermost running sampler of this process, or None."""
    return _active[-1] if _active else None


def beside(path: str | Path) -> Path:
    """``telemetry.jsonl`` in the folder of ``path`` (a result file, an event log)."""
    return Path(path).parent / FILE_NAME


@contextmanager
def maybe_sampler(path: str | Path | None, *, enabled: bool = True, rate_hz: float = DEFAULT_HZ,
                  source: NvmlSource | None = None, label: str | None = None,
                  stream: TextIO | None = None, why: list[str] | None = None) -> Iterator[Sampler | None]:
    """Run a :class:`Sampler` writing ``path`` (None: no file) for the ``with`` block; yield it,
    or None when telemetry is off (see the module docstring; the reason is appended to ``why``
    when given). A ``path`` that cannot be written raises :class:`~tracestory.errors.UsageError`."""
    check_rate(rate_hz)
    off = "asked off" if not enabled else f"{SKIP_ENV} is set" if skipped_by_env() else None
    if off:
        if why is not None:
            why.append(off)
        yield None
        return
    try:
        sampler = Sampler(source if source is not None else PynvmlSource(), path, rate_hz=rate_hz, label=label)
        sampler.start()
    except UsageError:      # the file cannot be written: the user's to fix
        raise
    except TelemetryUnavailable as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001  a broken NVML turns telemetry off, never fails the command
        reason = f"NVML failed while starting ({type(e).__name__}: {e})"
    else:
        reason = None
    if reason is not None:
        print(f"GPU telemetry off: {reason}", file=stream if stream is not None else sys.stderr, flush=True)
        if why is not None:
            why.append(reason)
        yield None
        return
    _active.append(sampler)
    try:
        yield sampler
    finally:
        _active.remove(sampler)
        try:
            sampler.stop()
        except Exception as e:  # noqa: BLE001  stop() keeps its own errors; this is the last guard
            sampler.note("stop", f"stopping failed ({type(e).__name__}: {e})")
