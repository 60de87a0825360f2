"""Device memory over time, from the trace's ``memory`` table.

Sources
-------
* Kineto ``[memory]`` instant events (torch.profiler ``profile_memory=True``): every caching-
  allocator allocation or free, with the totals AFTER it: ``Total Allocated`` (bytes in live
  tensors) and ``Total Reserved`` (bytes the allocator holds from cudaMalloc). ``Device Type``
  1 is a GPU; CPU samples (host tensors) have ``device == -1``.
* Nsight Systems ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``--cuda-memory-usage=true``): every
  cudaMalloc / cudaFree; the reader turns them into a running sum per (process, device), stored
  as ``allocated_bytes``. There is no reserved figure (``None``). For a PyTorch process the
  cudaMalloc level IS the caching allocator's reserved memory, and the sum starts at 0 at the
  start of the capture (memory allocated before it is not seen).

Model
-----
Each device's memory is a step function: the value of a sample holds until the next sample of
that device. Per device (GPU samples only, ``device >= 0``):

* peak allocated (and reserved): the largest sample, with its timestamp (the first one when the
  peak is reached several times);
* fragmentation: ``reserved / allocated`` at the allocated peak, its time-weighted mean over the
  samples' span (weights: time until the next sample; samples with nothing allocated are left
  out), and the largest ``reserved - allocated`` (bytes held by the allocator but in no tensor:
  cached free blocks and fragments) with its timestamp;
* allocation and free counts: samples with a positive / negative delta;
* what ran at the peak (:class:`PeakContext`): the innermost CPU op and CPU range open at that
  instant (same process as the sample when known), the phase, the kernel running on that GPU
  then (or, when the GPU was idle, the next one to start).

A 2021-format Kineto trace has no totals: allocated is rebuilt as the running sum of the
deltas from 0 at the start of the capture (``allocated_from_deltas``).

Limits: samples are allocator events, not a periodic measurement; memory outside the caching
allocator (cuBLAS workspaces, NCCL buffers, the CUDA context) is not in the Kineto figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np

from ..trace import CPU_SIDE, Trace

BINS = 100


class PeakContext(msgspec.Struct, frozen=True):
    """What was running when a device's allocated memory peaked. Unknown fields are ``None``."""

    ts_ns: int
    cpu_op: str | None            # innermost CPU op (trace.ops) open at ts
    cpu_op_start_ns: int | None
    cpu_op_dur_ns: int | None
    cpu_range: str | None         # innermost CPU range (record_function / NVTX) open at ts
    phase: str | None             # phase of analysis.phases containing ts
    kernel_active: str | None     # kernel running on the device at ts
    kernel_next: str | None       # first kernel starting on the device after ts, when idle
    kernel_next_start_ns: int | None


class MemoryBin(msgspec.Struct, frozen=True):
    """One column of a binned series: the largest values inside ``[start_ns, end_ns)``
    (the value carried in from the previous sample counts)."""

    start_ns: int
    end_ns: int
    max_allocated_bytes: int
    max_reserved_bytes: int | None


@dataclass(frozen=True)
class DeviceMemory:
    device: int
    sample_count: int
    alloc_count: int
    free_count: int
    start_ns: int                         # first sample
    end_ns: int                           # last sample
    first_allocated_bytes: int
    last_allocated_bytes: int
    peak_allocated_bytes: int
    peak_allocated_ts_ns: int
    peak_reserved_bytes: int | None
    peak_reserved_ts_ns: int | None
    reserved_at_peak_bytes: int | None    # reserved when allocated peaked
    fragmentation_at_peak: float | None   # reserved / allocated at the allocated peak
    fragmentation_mean: float | None      # time-weighted mean of reserved / allocated
    max_unused_reserved_bytes: int | None  # largest reserved - allocated
    max_unused_reserved_ts_ns: int | None
    total_memory_bytes: int | None        # device capacity, when the trace says it
    peak_allocated_share: float | None    # peak allocated / capacity
    allocated_from_deltas: bool
    at_peak: PeakContext
    bins: tuple[MemoryBin, ...]           # the series on BINS equal time bins
    ts_ns: np.ndarray = field(compare=False, repr=False)
    allocated_bytes: np.ndarray = field(compare=False, repr=False)
    reserved_bytes: np.ndarray | None = field(compare=False, repr=False)


@dataclass(frozen=True)
class MemoryTimeline:
    source: str                     # "kineto [memory] samples", "nsys CUDA memory usage events", ...
    has_reserved: bool
    devices: tuple[DeviceMemory, ...]
    host_sample_count: int          # CPU-side samples (not analysed)


def _innermost(starts: np.ndarray, ends: np.ndarray, ts: int, mask: np.ndarray | None = None) -> int:
    """Row of the interval open at ``ts`` that started last (ties: the shortest), or -1."""
    on = (starts <= ts) & (ends > ts)
    if mask is not None:
        on &= mask
    rows = np.flatnonzero(on)
    if rows.size == 0:
        return -1
    key = np.lexsort((ends[rows] - starts[rows], -starts[rows]))
    return int(rows[key[0]])


def peak_context(trace: Trace, ts: int, device: int, pid: int = -1, phases=None) -> PeakContext:
    """What the host and the GPU were doing at ``ts`` (see :class:`PeakContext`)."""
    o = trace.ops
    same = (o["pid"] == pid) if pid >= 0 and len(o) and (o["pid"] == pid).any() else None
    i = _innermost(o["start_ns"], o["end_ns"], ts, same)
    r = trace.ranges
    cpu = r["side"] == CPU_SIDE
    if pid >= 0 and (r["pid"][cpu] == pid).any():
        cpu &= r["pid"] == pid
    j = _innermost(r["start_ns"], r["end_ns"], ts, cpu)
    k = trace.kernels
    on_dev = (k["device"] == device) | (k["device"] < 0)
    active = _innermost(k["start_ns"], k["end_ns"], ts, on_dev)
    nxt, nxt_start = None, None
    if active < 0:
        later = np.flatnonzero(on_dev & (k["start_ns"] > ts))
        if later.size:
            n = int(later[np.argmin(k["start_ns"][later])])
            nxt, nxt_start = trace.name(int(k["name"][n])), int(k["start_ns"][n])
    phase = None
    if phases is not None and phases.source != "none":
        phase = next((p.name for p in phases.phases if p.start_ns <= ts < p.end_ns), None)
    return PeakContext(
        ts_ns=int(ts),
        cpu_op=trace.name(int(o["name"][i])) if i >= 0 else None,
        cpu_op_start_ns=int(o["start_ns"][i]) if i >= 0 else None,
        cpu_op_dur_ns=int(o["end_ns"][i] - o["start_ns"][i]) if i >= 0 else None,
        cpu_range=trace.name(int(r["name"][j])) if j >= 0 else None,
        phase=phase,
        kernel_active=trace.name(int(k["name"][active])) if active >= 0 else None,
        kernel_next=nxt, kernel_next_start_ns=nxt_start)


def binned(ts: np.ndarray, values: np.ndarray, t0: int, t1: int, n: int = BINS) -> np.ndarray:
    """Largest value of the step function ``values`` (held from each ``ts`` to the next) in each
    of ``n`` equal bins of ``[t0, t1]``; -1 before the first sample."""
    edges = t0 + (t1 - t0) * np.arange(n + 1, dtype=np.float64) / n
    # value carried into each bin: the last sample at or before the bin start
    carry_i = np.searchsorted(ts, edges[:-1], side="right") - 1
    out = np.where(carry_i >= 0, values[np.maximum(carry_i, 0)], -1).astype(np.int64)
    # samples inside each bin; the last sample (t == t1) goes to the last bin
    b = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, n - 1)
    np.maximum.at(out, b, values.astype(np.int64))
    return out


def _device(trace: Trace, device: int, rows: np.ndarray, phases) -> DeviceMemory:
    m = trace.memory
    ts = m["ts_ns"][rows]
    alloc = m["allocated_bytes"][rows].astype(np.int64)
    delta = m["delta_bytes"][rows].astype(np.int64)
    from_deltas = bool((alloc < 0).all())
    if from_deltas:
        alloc = np.cumsum(np.where(delta == -1, 0, delta))
    res = m["reserved_bytes"][rows].astype(np.int64)
    has_res = bool((res >= 0).any())
    res = np.where(res >= 0, res, 0) if has_res else None
    ip = int(np.argmax(alloc))
    pa, pts = int(alloc[ip]), int(ts[ip])
    pr = prts = rap = frag = mean = unused = unused_ts = None
    if res is not None:
        ir = int(np.argmax(res))
        pr, prts, rap = int(res[ir]), int(ts[ir]), int(res[ip])
        frag = rap / pa if pa > 0 else None
        w = np.diff(ts, append=ts[-1]).astype(np.float64)
        ok = alloc > 0
        if ok.any() and w[ok].sum() > 0:
            mean = float((res[ok] / alloc[ok] * w[ok]).sum() / w[ok].sum())
        gap = res - alloc
        iu = int(np.argmax(gap))
        unused, unused_ts = int(gap[iu]), int(ts[iu])
    cap = next((d.total_memory_bytes for d in trace.meta.devices if d.id == device and d.total_memory_bytes),
               None)
    pid = int(m["pid"][rows][ip])
    t0, t1 = int(ts[0]), int(ts[-1])
    n = BINS if t1 > t0 else 1
    ba = binned(ts, alloc, t0, max(t1, t0 + 1), n)
    br = binned(ts, res, t0, max(t1, t0 + 1), n) if res is not None else None
    edges = t0 + (max(t1, t0 + 1) - t0) * np.arange(n + 1, dtype=np.float64) / n
    bins = tuple(MemoryBin(int(edges[i]), int(edges[i + 1]), int(ba[i]),
                           None if br is None else int(br[i])) for i in range(n))
    return DeviceMemory(
        device=device, sample_count=int(rows.size),
        alloc_count=int((delta > 0).sum()), free_count=int(((delta < 0) & (delta != -1)).sum()),
        start_ns=t0, end_ns=t1, first_allocated_bytes=int(alloc[0]), last_allocated_bytes=int(alloc[-1]),
        peak_allocated_bytes=pa, peak_allocated_ts_ns=pts, peak_reserved_bytes=pr, peak_reserved_ts_ns=prts,
        reserved_at_peak_bytes=rap, fragmentation_at_peak=frag, fragmentation_mean=mean,
        max_unused_reserved_bytes=unused, max_unused_reserved_ts_ns=unused_ts,
        total_memory_bytes=int(cap) if cap else None, peak_allocated_share=pa / cap if cap else None,
        allocated_from_deltas=from_deltas,
        at_peak=peak_context(trace, pts, device, pid, phases), bins=bins,
        ts_ns=ts, allocated_bytes=alloc, reserved_bytes=res)


def memory_timeline(trace: Trace, phases=None) -> MemoryTimeline | None:
    """Per-GPU memory series and peaks; ``None`` when the trace has no GPU memory samples.
    ``phases`` (``analysis.phases``) names the phase at each peak."""
    m = trace.memory
    if len(m) == 0:
        return None
    dev = m["device"]
    gpu = dev >= 0
    usable = gpu & ((m["allocated_bytes"] >= 0) | (m["delta_bytes"] != -1))
    if not usable.any():
        return None
    order = np.argsort(m["ts_ns"], kind="stable")
    devices = []
    for d in np.unique(dev[usable]):
        rows = order[(dev[order] == d) & usable[order]]
        devices.append(_device(trace, int(d), rows, phases))
    fmt = trace.meta.source_format
    source = {"kineto": "kineto [memory] samples",
              "nsys-sqlite": "nsys CUDA memory usage events"}.get(fmt, f"{fmt} memory samples")
    return MemoryTimeline(source=source, has_reserved=any(d.reserved_bytes is not None for d in devices),
                          devices=tuple(devices), host_sample_count=int((~gpu).sum()))
