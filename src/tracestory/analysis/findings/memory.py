"""Memory rule: peak device memory, fragmentation (reserved >> allocated), what ran at the peak.

Reads :func:`.memory.memory_timeline` (the device with the largest allocated peak). Severity:

* ``high``: the allocated peak is >= 90% of the device's memory (an OOM risk on a longer
  context or a larger batch);
* ``medium``: the caching allocator holds >= 1.5x the allocated peak and >= 1 GiB more than it
  (fragmentation or cached blocks of earlier, larger tensors) while the reserved peak is >= 50%
  of the device: memory others cannot use, close to where it matters;
* ``low``: the same fragmentation condition on a device with room to spare;
* ``info``: otherwise.

For Nsight Systems input there is no reserved figure: the finding is about the cudaMalloc
level (for a PyTorch process, the allocator's reserved memory).
"""

from __future__ import annotations

from .base import Evidence, Finding
from ...units import fmt_bytes, fmt_pct
from ..facts import RunFacts

FULL_SHARE = 0.9
FRAG_RATIO = 1.5
FRAG_BYTES = 1 << 30


def _where(p) -> str | None:
    bits = []
    if p.phase:
        bits.append(f"phase {p.phase}")
    if p.cpu_op:
        bits.append(f"CPU op {p.cpu_op}")
    elif p.cpu_range and p.cpu_range != p.phase:
        bits.append(f"CPU range {p.cpu_range}")
    if p.kernel_active:
        bits.append("a kernel running on the GPU")
    return ", ".join(bits) or None


def _free_memory_advice(f: RunFacts) -> str:
    w = f.workload
    parts = []
    if w.is_llm:
        parts.append("a smaller batch or chunked prefill" if not w.kind == "llm_training" else "a smaller micro-batch")
    else:
        parts.append("a smaller batch")
    if f.producer.mode == "training":
        parts.append("activation checkpointing")
    if w.decodes:
        parts.append("a quantized KV cache or weights")
    alloc = ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" if f.platform != "ROCm"
             else "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True")
    return "Free memory before the peak: " + ", ".join(parts) + f", and {alloc} against fragmentation."


def rule_memory(f: RunFacts) -> list[Finding]:
    memory = f.memory
    if memory is None or not memory.devices:
        return []
    d = max(memory.devices, key=lambda x: (x.peak_allocated_bytes, -x.device))
    pa, pr = d.peak_allocated_bytes, d.peak_reserved_bytes
    p = d.at_peak
    ev = [Evidence("device", d.device, "count"),
          Evidence("peak allocated", pa, "bytes")]
    if pr is not None:
        ev += [Evidence("peak reserved", pr, "bytes"),
               Evidence("reserved when allocated peaked", d.reserved_at_peak_bytes, "bytes"),
               Evidence("reserved / allocated at the peak", d.fragmentation_at_peak, "x"),
               Evidence("reserved / allocated, time-weighted mean", d.fragmentation_mean, "x"),
               Evidence("largest reserved minus allocated", d.max_unused_reserved_bytes, "bytes")]
    if d.peak_allocated_share is not None:
        ev.append(Evidence("peak allocated share of device memory", d.peak_allocated_share, "fraction"))
    ev += [Evidence("allocations", d.alloc_count, "count"),
           Evidence("frees", d.free_count, "count"),
           Evidence("peak at, from the first sample", d.peak_allocated_ts_ns - d.start_ns, "ns")]
    if p.phase:
        ev.append(Evidence("phase at the peak", p.phase, "text"))
    if p.cpu_op:
        ev.append(Evidence("CPU op at the peak", p.cpu_op, "text"))
    if p.cpu_range:
        ev.append(Evidence("CPU range at the peak", p.cpu_range, "text"))
    if p.kernel_active:
        ev.append(Evidence("kernel running at the peak", p.kernel_active, "text"))
    elif p.kernel_next:
        ev.append(Evidence("next kernel after the peak (GPU idle then)", p.kernel_next, "text"))
    where = _where(p)
    level = "allocated" if memory.has_reserved else "cudaMalloc'd"
    head = f"Peak {level} GPU memory {fmt_bytes(pa)}" + (f" in {p.phase or p.cpu_op}" if (p.phase or p.cpu_op) else "")
    frag = pr is not None and pr >= FRAG_RATIO * max(pa, 1) and pr - pa >= FRAG_BYTES
    cap_share = pr / d.total_memory_bytes if pr is not None and d.total_memory_bytes else None
    if d.peak_allocated_share is not None and d.peak_allocated_share >= FULL_SHARE:
        return [Finding("memory", "high", f"{head}: {fmt_pct(d.peak_allocated_share)} of the device",
                        tuple(ev),
                        "The run is at the edge of device memory: a longer context, a larger batch or "
                        "fragmentation turns this into an out-of-memory error."
                        + (f" The peak happens at {where}." if where else ""),
                        _free_memory_advice(f))]
    if frag:
        sev = "medium" if cap_share is not None and cap_share >= 0.5 else "low"
        return [Finding("memory", sev,
                        f"Caching allocator holds {pr / max(pa, 1):.1f}x the peak allocated memory",
                        tuple(ev),
                        "Reserved memory far above allocated is fragmentation or cached blocks from "
                        "earlier, larger tensors: it is unavailable to other processes and to "
                        "allocations of a different size." + (f" The allocated peak is at {where}." if where else ""),
                        "Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or "
                        "torch.cuda.empty_cache() between phases if another process needs it.")]
    return [Finding("memory", "info", head, tuple(ev),
                    "Memory is not what limits this run"
                    + (f"; the peak is at {where}." if where else "."),
                    "No action needed on memory.")]
