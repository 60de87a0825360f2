"""Read a GPU telemetry file (``telemetry.jsonl``, written by :mod:`tracestory.telemetry`).

Format (docs/FORMATS.md, docs/TELEMETRY.md): a ``header`` line (schema
``tracestory.telemetry/1``, devices, rate, the ``(t0_unix_ns, t0_mono_ns)`` pair), one ``sample``
line per sample (``t_unix_ns``, ``t_mono_ns``, ``gpus``: one object per GPU), an ``end`` line
when the sampler stopped cleanly.

Validation: a first line that is not a telemetry header raises
:class:`~tracestory.errors.TraceFormatError` (the file is not telemetry at all). Damage inside
is kept out and stated in :attr:`TelemetryLog.warnings`, never dropped silently: lines that are
not JSON objects (a last line cut short by a killed run, most often), samples without
timestamps or with a GPU list that does not match the header, samples going back in time, a
missing ``end`` line (the sampler did not stop cleanly: the run was killed or is still running),
and what the sampler itself found wrong (the ``end`` record's ``incomplete``: "telemetry
incomplete: <reason>"). An energy counter that goes back (a driver reload or GPU reset; files of
samplers before the counter was continued across resets) is continued here the same way
(:mod:`tracestory.telemetry.sampler`: the reading before the drop is added to every later
one), and stated, so an energy is never negative.
Readings are kept as float arrays ``[GPUs, samples]`` with NaN where a reading is missing;
``reasons_mask`` as int64 with -1 where missing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TraceFormatError
from ..telemetry import FILE_NAME, SCHEMA
from ..units import plural
from .files import check_size, first_line, refuse_special, sniff_head, state

READINGS = ("sm_mhz", "mem_mhz", "power_w", "energy_mj", "temp_c", "util_gpu", "util_mem")


@dataclass(frozen=True, eq=False)
class TelemetryLog:
    path: str
    rate_hz: float | None
    t0_unix_ns: int | None
    t0_mono_ns: int | None
    devices: tuple[dict, ...]               # header devices: index, name, uuid, pci_bus_id, unsupported
    label: str | None
    t_unix_ns: np.ndarray                   # [S] int64
    t_mono_ns: np.ndarray                   # [S] int64
    readings: dict[str, np.ndarray]         # name -> [G, S] float64 (NaN: missing)
    reasons_mask: np.ndarray                # [G, S] int64 (-1: missing)
    ended: bool                             # the sampler wrote its end line
    warnings: tuple[str, ...] = ()
    end: dict = field(default_factory=dict)

    @property
    def n_samples(self) -> int:
        return int(self.t_unix_ns.size)

    @property
    def n_gpus(self) -> int:
        return len(self.devices)

    def __repr__(self) -> str:
        return (f"TelemetryLog({Path(self.path).name!r}, gpus={self.n_gpus}, samples={self.n_samples}, "
                f"warnings={len(self.warnings)})")


def is_telemetry_file(path: str | Path) -> bool:
    """Sniff rule: the first line is a JSON object with ``"type": "header"`` and this schema."""
    first = first_line(sniff_head(path))
    if first is None or not first.startswith(b"{") or b'"header"' not in first:
        return False   # cheap refusal: other formats are never parsed here
    try:
        obj = json.loads(first)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("type") == "header" and obj.get("schema") == SCHEMA


def _int(v: Any) -> int | None:
    """An integer reading or time, or None: not a number, not finite, or outside int64 (2^70 ns is
    no time a clock gives; the sample is then ignored and said)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        return None
    i = int(v)
    return i if -(1 << 63) <= i < (1 << 63) else None


def _continue_counter(e: np.ndarray) -> int:
    """Continue a counter across drops in place (finite readings only); the number of drops."""
    idx = np.flatnonzero(np.isfinite(e))
    if idx.size < 2:
        return 0
    v = e[idx]
    drop = np.flatnonzero(np.diff(v) < 0)
    if drop.size == 0:
        return 0
    offset = np.zeros(v.size)
    for d in drop:                      # a few resets at most: one cumulative step each
        offset[d + 1:] += v[d]
    e[idx] = v + offset
    return int(drop.size)


def read_telemetry(path: str | Path) -> TelemetryLog:
    """Parse one telemetry file (see the module docstring)."""
    path = Path(path)
    check_size(path, refuse_special(path))
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise TraceFormatError(path, f"a GPU telemetry file ({FILE_NAME})", f"unreadable ({e.strerror or e})") from None
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("type") != "header" or header.get("schema") != SCHEMA:
        found = (f"schema {header.get('schema')!r}" if isinstance(header, dict) else
                 "an empty file" if not lines else f"a first line starting {lines[0][:40]!r}")
        raise TraceFormatError(path, f"a GPU telemetry file whose first line is a {SCHEMA!r} header", found)
    devices = tuple(d for d in header.get("devices") or () if isinstance(d, dict))
    n_gpus = len(devices)
    bad_json: list[int] = []
    bad_sample: list[int] = []
    back_in_time = 0
    t_unix: list[int] = []
    t_mono: list[int] = []
    cols: dict[str, list[list[float]]] = {k: [[] for _ in range(n_gpus)] for k in READINGS}
    masks: list[list[int]] = [[] for _ in range(n_gpus)]
    end: dict = {}
    for no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            bad_json.append(no)
            continue
        kind = obj.get("type")
        if kind == "end":
            end = obj
            continue
        if kind != "sample":
            continue                                 # unknown line types: ignored (forward compatible)
        tu, tm, gpus = _int(obj.get("t_unix_ns")), _int(obj.get("t_mono_ns")), obj.get("gpus")
        if tu is None or not isinstance(gpus, list) or len(gpus) != n_gpus or not all(isinstance(g, dict) for g in gpus):
            bad_sample.append(no)
            continue
        if t_unix and tu <= t_unix[-1]:        # the sampler's clock moves on between two samples
            back_in_time += 1
            continue
        t_unix.append(tu)
        t_mono.append(tm if tm is not None else -1)
        for gi, g in enumerate(gpus):
            for k in READINGS:
                v = g.get(k)
                cols[k][gi].append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan)
            m = _int(g.get("reasons_mask"))
            masks[gi].append(m if m is not None else -1)
    warnings: list[str] = []
    if bad_json:
        last = bad_json[-1] == len(lines)
        warnings.append(f"{path.name}: {plural(len(bad_json), 'line')} not JSON objects ignored (first: line {bad_json[0]})"
                        + ("; the last line is cut short: the run was probably killed while writing" if last else ""))
    if bad_sample:
        warnings.append(f"{path.name}: {plural(len(bad_sample), 'sample')} without t_unix_ns or with a GPU list not matching "
                        f"the header's {plural(n_gpus, 'device')} ignored (first: line {bad_sample[0]})")
    if back_in_time:
        warnings.append(f"{path.name}: {plural(back_in_time, 'sample')} not later than the sample before ignored")
    if not end:
        warnings.append(f"{path.name}: no end line: the sampler did not stop cleanly (run killed or still "
                        "running); the samples written before are used")
    if not t_unix:
        warnings.append(f"{path.name}: no usable sample")
    incomplete = [str(x) for x in end.get("incomplete") or () if x] if isinstance(end.get("incomplete"), list) else []
    if incomplete:
        warnings.append(f"{path.name}: telemetry incomplete: {'; '.join(incomplete)}")
    n = len(t_unix)
    readings = {k: np.array(v, dtype=np.float64).reshape(n_gpus, n) for k, v in cols.items()}
    for gi in range(n_gpus):
        drops = _continue_counter(readings["energy_mj"][gi])
        if drops:
            warnings.append(f"{path.name}: GPU {gi}: the energy counter went back {plural(drops, 'time')} (a driver reload "
                            "or GPU reset): its segments are summed; the energy between the last reading before "
                            "each reset and the reset is not counted")
    state(path, [w.removeprefix(f"{path.name}: ") for w in warnings])   # on the terminal too
    return TelemetryLog(
        path=str(path), rate_hz=header.get("rate_hz") if isinstance(header.get("rate_hz"), (int, float)) else None,
        t0_unix_ns=_int(header.get("t0_unix_ns")), t0_mono_ns=_int(header.get("t0_mono_ns")), devices=devices,
        label=header.get("label") if isinstance(header.get("label"), str) else None,
        t_unix_ns=np.array(t_unix, dtype=np.int64), t_mono_ns=np.array(t_mono, dtype=np.int64),
        readings=readings, reasons_mask=np.array(masks, dtype=np.int64).reshape(n_gpus, n),
        ended=bool(end), warnings=tuple(warnings), end=end)
