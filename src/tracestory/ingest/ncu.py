"""Nsight Compute results -> :class:`KernelMetrics`, one frozen record per profiled kernel.

Three inputs carry the same numbers (``load_ncu`` sniffs which one it is given):

* ``.ncu-rep`` / ``.ncu-rep.gz`` read through the ``ncu-report`` package (:mod:`.ncu_rep`);
* ``ncu --csv --page raw``: one row per kernel, one column per metric, a units row (:mod:`.ncu_csv`);
* ``ncu --csv --page details``: one row per (kernel, section, display label) (:mod:`.ncu_csv`).

Each reader hands back plain ``{metric name: (value, unit)}`` dicts; this module normalizes units
to base units (seconds, bytes, hertz; ``%`` stays a percentage) and maps raw names to stable
fields through ordered candidate lists (:data:`FIELDS`, documented in ``docs/NCU.md``): metric names
differ between GPUs and ncu versions (on H200 the DRAM throughput is
``gpu__dram_throughput.*``, not ``dram__throughput.*``). The details page is keyed
``"<Section Name>/<Metric Name>"``. A metric the input lacks leaves its field ``None``, never 0.
Metrics that no field consumed stay in ``raw`` under their raw names (base units).

Derived fields
--------------
* warp stalls: ``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`` (cycles a
  warp spent stalled on <reason> per issued instruction); ``warp_stall_pct`` is each reason's
  share of the sum over all reasons except ``selected`` (the issuing cycle is not a stall).
  Without those ratios the PC-sampling counts ``smsp__pcsamp_warps_issue_stalled_<reason>`` are
  used the same way. The details page has neither: ``None``.
* FLOPs (ncu's own roofline arithmetic): SASS counters give per-elapsed-cycle sums, so
  ``count = X.sum.per_cycle_elapsed * smsp__cycles_elapsed.avg``; fp32 = fadd + fmul + 2 ffma,
  fp64 = dadd + dmul + 2 dfma, fp16 = 2 (hadd + hmul) + 4 hfma (ncu counts packed half2
  instructions, as its ``derived__*_x2/_x4`` metrics do). Tensor-core FLOPs are the
  ``sm__ops_path_tensor_src_<dtype>*.sum`` counters (already FLOPs: 2 per multiply-add; checked
  on the H200 GEMM fixture, 2 M N K exactly). Integer tensor ops are not FLOPs and stay in ``raw``.
* ``occupancy_limiters``: the limit(s) with the fewest blocks per SM among registers, shared
  memory, warps, blocks (SM) and barriers.

Damaged inputs
--------------
Each reader checks what it read against what the format itself says (see :mod:`.ncu_csv` and
:mod:`.ncu_rep`): a file that holds no usable kernel is refused in one line
(:class:`TraceFormatError`); kernels that cannot be trusted (a last row cut short, a kernel
with fewer metric rows than the others, an action without name or metrics) are dropped and
the drop is stated in ``KernelMetrics.warnings``, short strings with counts. A kernel that ncu
profiled but measured nothing for (collection failed or was filtered out: only its name and launch
shape are there) is kept, with ``has_metrics`` False; ``KernelMetrics.without_metrics`` lists them
and a warning says which kernels the results speak for, so a report does not take the kernels
with metrics (an RNG init, say) for the workload. Any exception the
CSV module, gzip or the ``ncu-report`` binding raises on bad bytes becomes one
:class:`TraceFormatError` naming the file.

Limits: locale-swapped numbers ("1.234,5") are not recognized; several ranges (NVTX, graph
workloads) are flattened in order. A raw-page CSV cut exactly at the end of a row, or a digit
changed inside a metric value, reads as a valid file: the format has no count or checksum to
compare with.
"""

from __future__ import annotations

import csv
import math
import os
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from dataclasses import fields as dc_fields
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError, TracestoryError
from .files import refuse_special, state
from .ncu_rep import read_rep
from .ncu_csv import read_csv

# ------------------------------------------------------------------------------- units
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9,
           "T": 1e12, "P": 1e15}
_UNIT_PART = re.compile(r"^([numKkMGTP]?)(byte|second|hz|Hz|cycle|inst|sector|warp|thread|block|request)s?$")
_SHORT_TIME = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "msecond": 1e-3}


def _unit_part(part: str) -> tuple[float, str]:
    if part in _SHORT_TIME:
        return _SHORT_TIME[part], "second"
    m = _UNIT_PART.match(part)
    if not m:
        return 1.0, part
    base = m.group(2).lower() if m.group(2) in ("Hz", "hz") else m.group(2)
    return _PREFIX[m.group(1)], base


def to_base(value: float, unit: str) -> tuple[float, str]:
    """``(value, unit)`` in base units: ``2.37 us`` -> ``(2.37e-6, "second")``, ``9.7 Gbyte/s`` ->
    ``(9.7e9, "byte/second")``; units without a scale prefix come back unchanged."""
    if not unit:
        return value, unit
    parts = unit.split("/")
    factor, names = 1.0, []
    for i, part in enumerate(parts):
        f, base = _unit_part(part.strip())
        factor = factor * f if i == 0 else factor / f
        names.append(base)
    return value * factor, "/".join(names)


_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d*)?")


def parse_value(text) -> float | str | None:
    """A CSV cell as a number (thousands separators dropped), a string, or ``None`` when empty."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return None if isinstance(text, float) and math.isnan(text) else float(text)
    s = text.strip()
    if not s or s.lower() in ("n/a", "nan", "-"):
        return None
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    try:
        return float(s)
    except ValueError:
        return s


# ------------------------------------------------------------------------------ fields
_SOL = "GPU Speed Of Light Throughput/"
# (field, conversion, candidate raw names in order). conversion: ns | int | float | str
FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("duration_ns", "ns", ("gpu__time_duration.sum", "gpu__time_duration.avg", _SOL + "Duration")),
    ("device_name", "str", ("device__attribute_display_name",)),
    ("grid_size", "int", ("launch__grid_size", "Launch Statistics/Grid Size")),
    ("block_size", "int", ("launch__block_size", "Launch Statistics/Block Size")),
    ("registers_per_thread", "int", ("launch__registers_per_thread", "Launch Statistics/Registers Per Thread")),
    ("static_shared_mem_bytes", "int", ("launch__shared_mem_per_block_static",
                                        "Launch Statistics/Static Shared Memory Per Block")),
    ("dynamic_shared_mem_bytes", "int", ("launch__shared_mem_per_block_dynamic",
                                         "Launch Statistics/Dynamic Shared Memory Per Block")),
    ("waves_per_sm", "float", ("launch__waves_per_multiprocessor", "Launch Statistics/Waves Per SM")),
    ("sm_count", "int", ("launch__sm_count", "device__attribute_multiprocessor_count", "Launch Statistics/# SMs")),
    ("sm_frequency_hz", "float", ("smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second",
                                  _SOL + "SM Frequency")),
    ("sm_throughput_pct", "float", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
                                    _SOL + "Compute (SM) Throughput")),
    ("memory_throughput_pct", "float", ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                                        _SOL + "Memory Throughput")),
    ("dram_throughput_pct", "float", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                      "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                                      "dramc__throughput.avg.pct_of_peak_sustained_elapsed",
                                      _SOL + "DRAM Throughput")),
    ("dram_bytes_read", "float", ("dram__bytes_read.sum", "dramc__bytes_read.sum")),
    ("dram_bytes_written", "float", ("dram__bytes_write.sum", "dramc__bytes_write.sum")),
    ("dram_bytes_total", "float", ("dram__bytes.sum", "dramc__bytes.sum")),
    ("dram_bytes_per_s", "float", ("dram__bytes.sum.per_second", "dramc__bytes.sum.per_second",
                                   "Memory Workload Analysis/Memory Throughput")),
    ("achieved_occupancy_pct", "float", ("sm__warps_active.avg.pct_of_peak_sustained_active",
                                         "Occupancy/Achieved Occupancy")),
    ("theoretical_occupancy_pct", "float", ("sm__maximum_warps_per_active_cycle_pct",
                                            "Occupancy/Theoretical Occupancy")),
    ("occupancy_limit_registers", "float", ("launch__occupancy_limit_registers", "Occupancy/Block Limit Registers")),
    ("occupancy_limit_shared_mem", "float", ("launch__occupancy_limit_shared_mem", "Occupancy/Block Limit Shared Mem")),
    ("occupancy_limit_warps", "float", ("launch__occupancy_limit_warps", "Occupancy/Block Limit Warps")),
    ("occupancy_limit_blocks", "float", ("launch__occupancy_limit_blocks", "Occupancy/Block Limit SM")),
    ("occupancy_limit_barriers", "float", ("launch__occupancy_limit_barriers", "Occupancy/Block Limit Barriers")),
    ("tensor_pipe_pct", "float", ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                                  "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                                  "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active")),
    ("fp32_pipe_pct", "float", ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
                                "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active")),
    ("fp64_pipe_pct", "float", ("sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active",
                                "sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active")),
    ("l1_hit_rate_pct", "float", ("l1tex__t_sector_hit_rate.pct", "Memory Workload Analysis/L1/TEX Hit Rate")),
    ("l2_hit_rate_pct", "float", ("lts__t_sector_hit_rate.pct", "Memory Workload Analysis/L2 Hit Rate")),
    ("shared_bank_conflicts", "float", ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",)),
    ("shared_wavefronts", "float", ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",)),
    ("warp_cycles_per_issue", "float", ("smsp__average_warp_latency_per_inst_issued.ratio",
                                        "Warp State Statistics/Warp Cycles Per Issued Instruction")),
)
_LIMITS = (("registers", "occupancy_limit_registers"), ("shared memory", "occupancy_limit_shared_mem"),
           ("warps", "occupancy_limit_warps"), ("blocks", "occupancy_limit_blocks"),
           ("barriers", "occupancy_limit_barriers"))
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_STALL_PC = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+)$")
_SASS = "smsp__sass_thread_inst_executed_op_{}_pred_on"
# precision -> ((instruction, FLOPs per instruction), ...)
SASS_FLOPS = {
    "fp32": (("fadd", 1), ("fmul", 1), ("ffma", 2)),
    "fp64": (("dadd", 1), ("dmul", 1), ("dfma", 2)),
    "fp16": (("hadd", 2), ("hmul", 2), ("hfma", 4)),
}
_TENSOR_SRC = re.compile(r"^sm__ops_path_tensor_src_([a-z0-9]+?)(?:_dst_[a-z0-9]+)?(?:_sparsity_(?:on|off))?\.sum$")
_TENSOR_OP = re.compile(r"^sm__ops_path_tensor_op_[a-z]+_src_([a-z0-9]+?)(?:_dst_[a-z0-9]+)?(?:_sparsity_(?:on|off))?\.sum$")
_INT_TENSOR = ("int1", "int4", "int8")


# Fields that ncu measures (not the launch shape it records): a kernel with none of them has no metrics.
MEASURED_FIELDS = ("duration_ns", "sm_throughput_pct", "memory_throughput_pct", "dram_throughput_pct",
                   "dram_bytes_read", "dram_bytes_written", "dram_bytes_total", "dram_bytes_per_s", "achieved_occupancy_pct",
                   "tensor_pipe_pct", "fp32_pipe_pct", "fp64_pipe_pct", "l1_hit_rate_pct", "l2_hit_rate_pct",
                   "warp_cycles_per_issue", "warp_stall_pct", "flops")


@dataclass(frozen=True)
class KernelRecord:
    """One profiled kernel. Base units; ``None`` where the input lacks the metric."""

    id: int
    name: str
    process_id: int | None = None
    device: int | None = None
    cc: str | None = None
    context: int | None = None
    stream: int | None = None
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    duration_ns: int | None = None
    # True: no gpu__time_duration in the input; duration_ns is the SM's elapsed cycles over its
    # clock rate (sm__cycles_elapsed.avg / sm__cycles_elapsed.avg.per_second, the same quantity)
    duration_derived: bool = False
    device_name: str | None = None
    grid_size: int | None = None
    block_size: int | None = None
    registers_per_thread: int | None = None
    static_shared_mem_bytes: int | None = None
    dynamic_shared_mem_bytes: int | None = None
    waves_per_sm: float | None = None
    sm_count: int | None = None
    sm_frequency_hz: float | None = None
    sm_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    dram_bytes_read: float | None = None
    dram_bytes_written: float | None = None
    dram_bytes_total: float | None = None  # read + written as one counter (dram__bytes.sum)
    dram_bytes_per_s: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    occupancy_limit_registers: float | None = None
    occupancy_limit_shared_mem: float | None = None
    occupancy_limit_warps: float | None = None
    occupancy_limit_blocks: float | None = None
    occupancy_limit_barriers: float | None = None
    occupancy_limiters: tuple[str, ...] | None = None
    tensor_pipe_pct: float | None = None
    fp32_pipe_pct: float | None = None
    fp64_pipe_pct: float | None = None
    l1_hit_rate_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    shared_bank_conflicts: float | None = None
    shared_wavefronts: float | None = None
    warp_cycles_per_issue: float | None = None
    warp_stall_pct: Mapping[str, float] | None = None
    warp_stall_per_issue: Mapping[str, float] | None = None
    flops_by_precision: Mapping[str, float] | None = None
    flops: float | None = None
    dominant_precision: str | None = None
    raw: Mapping[str, float | str] = field(default_factory=dict)
    rules: tuple[tuple[str, str, str, float | None], ...] = ()

    @property
    def has_metrics(self) -> bool:
        """Whether ncu measured anything for this kernel (a time, a throughput, an occupancy, a
        pipe or cache rate, FLOPs): a kernel whose collection failed or was skipped keeps only its
        name and launch shape."""
        return any(getattr(self, f) is not None for f in MEASURED_FIELDS)

    @property
    def dram_bytes(self) -> float | None:
        if self.dram_bytes_read is None or self.dram_bytes_written is None:
            return self.dram_bytes_total
        return self.dram_bytes_read + self.dram_bytes_written

    @property
    def achieved_flops_per_s(self) -> float | None:
        if self.flops is None or not self.duration_ns:
            return None
        return self.flops / (self.duration_ns * 1e-9)

    @property
    def arithmetic_intensity(self) -> float | None:
        """FLOPs per DRAM byte (read + written)."""
        b = self.dram_bytes
        if self.flops is None or not b:
            return None
        return self.flops / b


@dataclass(frozen=True)
class KernelMetrics:
    """The kernels of one ncu result, in ncu's ID (profiling) order."""

    source_path: str
    source_format: str  # "ncu-rep", "ncu-csv-raw", "ncu-csv-details"
    kernels: tuple[KernelRecord, ...]
    units: Mapping[str, str] = field(default_factory=dict)  # raw metric name -> base unit
    # the damage the reader loaded around: what was dropped and why, with counts
    warnings: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.kernels)

    def json_rows(self) -> list[dict]:
        """The ``kernels[]`` rows of the JSON document (:func:`kernel_metrics_to_json`)."""
        return kernel_metrics_to_json(self)

    @property
    def without_metrics(self) -> tuple[KernelRecord, ...]:
        """Kernels ncu profiled but measured nothing for (see :attr:`KernelRecord.has_metrics`):
        what these results say is about the others only."""
        return tuple(k for k in self.kernels if not k.has_metrics)

    @property
    def with_metrics(self) -> tuple[KernelRecord, ...]:
        return tuple(k for k in self.kernels if k.has_metrics)

    def __iter__(self) -> Iterator[KernelRecord]:
        return iter(self.kernels)

    def __getitem__(self, i: int) -> KernelRecord:
        return self.kernels[i]

    def column(self, name: str) -> np.ndarray:
        """A numeric field (or property) over kernels as float64, NaN where ``None``."""
        vals = [getattr(k, name) for k in self.kernels]
        return np.array([np.nan if v is None else float(v) for v in vals], dtype=np.float64)

    @property
    def device_name(self) -> str | None:
        return next((k.device_name for k in self.kernels if k.device_name), None)


# ------------------------------------------------------------------------------ build
def _int_or_none(v) -> int | None:
    return None if v is None else int(v)


def _dims(text) -> tuple[int, int, int] | None:
    if not isinstance(text, str):
        return None
    nums = re.findall(r"\d+", text.replace(",", " "))
    return (int(nums[0]), int(nums[1]), int(nums[2])) if len(nums) == 3 else None


def _convert(value, unit: str, kind: str):
    if kind == "str":
        return value if isinstance(value, str) else None
    if not isinstance(value, float):
        return None
    if kind == "ns":
        return round(value * 1e9) if unit == "second" else round(value)
    if kind == "int":
        return round(value)
    return value


def _stalls(metrics: dict, used: set) -> tuple[dict | None, dict | None]:
    per_issue = {}
    for name, (v, _) in metrics.items():
        m = _STALL.match(name)
        if m and isinstance(v, float):
            per_issue[m.group(1)] = v
            used.add(name)
    source = per_issue
    if not per_issue:
        source = {}
        for name, (v, _) in metrics.items():
            m = _STALL_PC.match(name)
            if m and not name.endswith("_not_issued") and isinstance(v, float):
                source[m.group(1)] = v
                used.add(name)
        if not source:
            return None, None
    total = sum(v for r, v in source.items() if r != "selected")
    pct = {r: 100.0 * v / total for r, v in source.items() if r != "selected"} if total > 0 else None
    return pct, (per_issue or None)


def _flops(metrics: dict, used: set) -> dict | None:
    out: dict[str, float] = {}
    cycles = metrics.get("smsp__cycles_elapsed.avg", (None, ""))[0]
    for prec, parts in SASS_FLOPS.items():
        total, seen = 0.0, False
        for op, mult in parts:
            base = _SASS.format(op)
            if base + ".sum" not in metrics and "sm" + base[4:] + ".sum" in metrics:
                base = "sm" + base[4:]  # the per-SM counter of the same instructions: the same .sum
            direct = metrics.get(base + ".sum", (None, ""))[0]
            rate = metrics.get(base + ".sum.per_cycle_elapsed", (None, ""))[0]
            if isinstance(direct, float):
                total += mult * direct
                seen = True
                used.add(base + ".sum")
            elif isinstance(rate, float) and isinstance(cycles, float):
                total += mult * rate * cycles
                seen = True
                used.add(base + ".sum.per_cycle_elapsed")
        if seen:
            out[prec] = total
    tensor: dict[str, float] = {}
    for pattern in (_TENSOR_SRC, _TENSOR_OP):
        for name, (v, _) in metrics.items():
            m = pattern.match(name)
            if m and isinstance(v, float) and m.group(1) not in _INT_TENSOR:
                tensor["tensor_" + m.group(1)] = tensor.get("tensor_" + m.group(1), 0.0) + v
                used.add(name)
        if tensor:  # the per-op counters split what the per-source ones already sum
            break
    out.update(tensor)
    return out or None


_TENSOR_PIPE = ("sm__inst_executed_pipe_tensor.sum", "smsp__inst_executed_pipe_tensor.sum",
                "sm__pipe_tensor_cycles_active.sum", "sm__inst_executed_pipe_tensor_op_hmma.sum")


def _tensor_pipe_used(metrics: dict, values: dict) -> bool:
    """Whether the input shows tensor-core work (instructions, active cycles or a pipe share)."""
    if (values.get("tensor_pipe_pct") or 0) > 0:
        return True
    return any(isinstance(v, float) and v > 0 for v in (metrics.get(n, (None,))[0] for n in _TENSOR_PIPE))


def _derived_duration(metrics: dict) -> dict:
    """A kernel's duration from an export without ``gpu__time_duration``: ncu defines
    ``X.per_second`` as X over the kernel's duration, so the SM's elapsed cycles over their rate
    are that duration. Empty when either is missing."""
    for name in ("sm__cycles_elapsed.avg", "smsp__cycles_elapsed.avg"):
        cycles = metrics.get(name, (None, ""))[0]
        rate = metrics.get(name + ".per_second", (None, ""))[0]
        if isinstance(cycles, float) and isinstance(rate, float) and rate > 0:
            return {"duration_ns": int(round(cycles / rate * 1e9)), "duration_derived": True}
    return {}


def build_record(ident: dict, metrics: dict, rules=(), units: dict | None = None) -> KernelRecord:
    """One record from a reader's identity columns and ``{name: (value, unit)}`` metrics."""
    norm: dict[str, tuple] = {}
    for name, (v, unit) in metrics.items():
        v = parse_value(v)
        if v is None:
            continue
        if isinstance(v, float):
            v, unit = to_base(v, unit)
        norm[name] = (v, unit)
        if units is not None and unit:
            units.setdefault(name, unit)
    used: set[str] = set()
    values: dict[str, object] = {}
    for fname, kind, candidates in FIELDS:
        for c in candidates:
            if c in norm:
                got = _convert(norm[c][0], norm[c][1], kind)
                if got is not None:
                    values[fname] = got
                    used.add(c)
                    break
    grid = _dims(ident.get("grid"))
    block = _dims(ident.get("block"))
    g = [norm.get(f"launch__grid_dim_{a}", (None,))[0] for a in "xyz"]
    if all(isinstance(x, float) for x in g):
        grid = tuple(int(x) for x in g)
        used.update(f"launch__grid_dim_{a}" for a in "xyz")
    b = [norm.get(f"launch__block_dim_{a}", (None,))[0] for a in "xyz"]
    if all(isinstance(x, float) for x in b):
        block = tuple(int(x) for x in b)
        used.update(f"launch__block_dim_{a}" for a in "xyz")
    if "duration_ns" not in values:
        values.update(_derived_duration(norm))
    limits = {label: values[f] for label, f in _LIMITS if f in values}
    limiters = None
    if limits:
        low = min(limits.values())
        limiters = tuple(label for label, v in limits.items() if v == low)
    pct, per_issue = _stalls(norm, used)
    flops_by = _flops(norm, used)
    if flops_by and not any(p.startswith("tensor_") for p in flops_by) and _tensor_pipe_used(norm, values):
        flops_by = None  # the tensor cores ran but their FLOPs were not collected: a SASS-only count undercounts
    flops = sum(flops_by.values()) if flops_by else None
    dominant = max(flops_by, key=flops_by.get) if flops_by and flops and flops > 0 else None
    raw = {k: v for k, (v, _) in norm.items() if k not in used}
    return KernelRecord(
        id=int(ident["id"]), name=str(ident["name"]),
        process_id=_int_or_none(parse_value(ident.get("process_id"))),
        device=_int_or_none(parse_value(ident.get("device"))),
        cc=None if ident.get("cc") in (None, "") else str(ident.get("cc")),
        context=_int_or_none(parse_value(ident.get("context"))),
        stream=_int_or_none(parse_value(ident.get("stream"))),
        grid=grid, block=block, occupancy_limiters=limiters,
        warp_stall_pct=pct, warp_stall_per_issue=per_issue,
        flops_by_precision=flops_by, flops=flops, dominant_precision=dominant,
        raw=raw, rules=tuple(rules), **values,
    )


# ------------------------------------------------------------------------------ entry
def _is_rep(path: Path) -> bool:
    name = path.name.lower()
    if name.endswith((".ncu-rep", ".ncu-rep.gz")):
        return True
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"\x1f\x8b":
        with open(path, "rb") as f:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(f.read(1 << 16), 4)
    return head == b"NVR\x00"


# What bad bytes can raise inside a reader (the binding raises plain Exception subclasses).
_BAD_BYTES = (csv.Error, ValueError, TypeError, KeyError, IndexError, OverflowError, UnicodeError,
              EOFError, zlib.error, OSError, MemoryError, RuntimeError, AttributeError)


def load_ncu(path: str | os.PathLike) -> KernelMetrics:
    """Read an ``.ncu-rep`` (optionally gzip'ed), a raw-page CSV or a details-page CSV."""
    path = Path(path)
    refuse_special(path)
    try:
        km = _load(path)
    except TracestoryError:
        raise
    except _BAD_BYTES as e:
        raise TraceFormatError(path, "a readable Nsight Compute report or CSV",
                               f"damaged content ({type(e).__name__}: {str(e)[:160]})") from None
    zero = sum(1 for k in km.kernels if k.duration_ns == 0)
    if zero:   # ncu measures every kernel it profiles for some time: 0 ns is a damaged or rewritten row
        km = replace(km, warnings=(*km.warnings, f"{zero} of {len(km.kernels)} kernels with a duration of 0 ns "
                                                 "(gpu__time_duration: damaged or rewritten rows)"))
    state(path, km.warnings)
    return km


def _load(path: Path) -> KernelMetrics:
    warnings: list[str] = []
    if _is_rep(path):
        fmt, kernels = "ncu-rep", read_rep(path, warnings)
    else:
        fmt, kernels = read_csv(path, warnings)
    if not kernels:
        raise TraceFormatError(path, "at least one profiled kernel", "a result with zero kernels")
    units: dict[str, str] = {}
    records = []
    for ident, metrics, rules in kernels:
        if parse_value(ident.get("id")) is None or isinstance(parse_value(ident.get("id")), str):
            raise TraceFormatError(path, "an integer kernel ID", f"{str(ident.get('id'))[:40]!r}")
        records.append(build_record(ident, metrics, rules, units))
    empty = [r for r in records if not r.has_metrics]
    if empty:
        names = sorted({_short(r.name) for r in empty})
        measured = sorted({_short(r.name) for r in records if r.has_metrics})
        warnings.append(
            f"{len(empty)} of {len(records)} profiled kernels have no metrics ({', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}): ncu measured nothing for them, so these results speak only "
            f"for the other {len(records) - len(empty)}"
            + (f" ({', '.join(measured[:3])}{', ...' if len(measured) > 3 else ''})" if measured else ""))
    return KernelMetrics(source_path=str(path), source_format=fmt, kernels=tuple(records), units=units,
                         warnings=tuple(warnings))


def _short(name: str) -> str:
    """A kernel's name without return type, namespaces, template and argument lists, at most 60
    characters (for warnings): ``void at::native::reduce_kernel<512, 1, ...>(...)`` -> ``reduce_kernel``."""
    base = name.removeprefix("void ").split("<")[0].split("(")[0]
    return (base.rsplit("::", 1)[-1] or name)[:60]


_JSON_SKIP = ("raw", "rules")


def kernel_metrics_to_json(km: KernelMetrics) -> list[dict]:
    """``kernels[]`` rows: the stable fields (``None`` -> null), derived roofline inputs, and
    ``raw`` with every unmapped metric under its raw name (base units, see ``units``)."""
    out = []
    for k in km.kernels:
        row = {f.name: getattr(k, f.name) for f in dc_fields(k) if f.name not in _JSON_SKIP}
        for key in ("grid", "block", "occupancy_limiters"):
            if row[key] is not None:
                row[key] = list(row[key])
        for key in ("warp_stall_pct", "warp_stall_per_issue", "flops_by_precision"):
            if row[key] is not None:
                row[key] = dict(row[key])
        row["dram_bytes"] = k.dram_bytes
        row["achieved_flops_per_s"] = k.achieved_flops_per_s
        row["arithmetic_intensity"] = k.arithmetic_intensity
        row["has_metrics"] = k.has_metrics
        row["rules"] = [{"rule": r[0], "type": r[1], "description": r[2], "estimated_speedup_pct": r[3]}
                        for r in k.rules]
        row["raw"] = dict(k.raw)
        row["raw_units"] = {name: km.units[name] for name in k.raw if name in km.units}
        out.append(row)
    return out
