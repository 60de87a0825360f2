"""Will the model fit? ``tracestory serve`` refuses a model larger than the memory at hand
before it allocates a byte of it (``serve --layers 1000000`` used to grow until the machine ran
out).

Model: the bytes a rank allocates when it builds are the full weights at the serving dtype
(:func:`~.model.weight_bytes`: every layer's projections and norms, embedding, LM head; a
tensor-parallel rank builds the full weights before it keeps its slice, and FP8 weights are
quantised from them afterwards) plus the KV cache (:func:`~.model.kv_bytes_per_block` times the
blocks, plus the one scratch block the model keeps). The memory at hand:

* CUDA: the device's free bytes (``torch.cuda.mem_get_info``);
* CPU: ``MemAvailable`` of ``/proc/meminfo`` (else free physical pages from ``os.sysconf``),
  lowered to the room left under the cgroup's ``memory.max`` when one is set; the ranks of a
  tensor-parallel server on the CPU share it, so their estimates add up (N x the estimate).

The check is an estimate with no headroom: activations, CUDA graphs, compiled kernels and the
interpreter are not counted, so a model that passes may still not fit; one that fails would
not. When the memory at hand cannot be read, nothing is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..units import fmt_bytes
from .model import kv_bytes_per_block, weight_bytes


@dataclass(frozen=True)
class Footprint:
    """The bytes one build allocates (see the module docstring)."""

    weights: int
    kv: int
    processes: int = 1          # ranks sharing this memory (CPU tensor parallelism)

    @property
    def total(self) -> int:
        return (self.weights + self.kv) * self.processes


def estimate(cfg, layers: int, vocab: int, dtype_bytes: int, num_blocks: int, block_size: int,
             processes: int = 1) -> Footprint:
    """The bytes of weights and KV cache of one build (``num_blocks`` plus the scratch block)."""
    return Footprint(weight_bytes(cfg, layers, vocab, dtype_bytes),
                     (num_blocks + 1) * kv_bytes_per_block(cfg, layers, block_size, dtype_bytes), processes)


def _meminfo_available(path: str = "/proc/meminfo") -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    return int(parts[1]) * 1024 if parts[-1] == "kB" else int(parts[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room(root: str = "/sys/fs/cgroup") -> int | None:
    """``memory.max - memory.current`` of this process's cgroup (v2), or None without a limit."""
    try:
        limit = Path(root, "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int(Path(root, "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def host_available() -> tuple[int | None, str]:
    """``(bytes, where it was read)`` of the memory at hand on the host."""
    got, where = _meminfo_available(), "MemAvailable"
    if got is None:
        try:
            got, where = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages"
        except (ValueError, OSError, AttributeError):
            return None, "unknown"
    room = _cgroup_room()
    if room is not None and room < got:
        got, where = room, "room under the cgroup's memory.max"
    return got, where


def device_available(device: str) -> tuple[int | None, str]:
    """``(bytes, where)`` for ``device``: the free memory of a CUDA device, else the host's."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free), f"free on {device}"
    return host_available()


def check_fits(asked: str, fp: Footprint, available: int | None, where: str) -> None:
    """One :class:`UsageError` line (what was asked, the estimate, the memory at hand) when the
    estimate is larger than ``available``; nothing when ``available`` is None."""
    if available is None or fp.total <= available:
        return
    ranks = f" x {fp.processes} ranks on this host" if fp.processes > 1 else ""
    raise UsageError(f"{asked}: expected weights + KV cache to fit in the memory at hand, found "
                     f"{fmt_bytes(fp.weights)} weights + {fmt_bytes(fp.kv)} KV cache{ranks} = "
                     f"{fmt_bytes(fp.total)} ({fp.total} bytes) estimated, {fmt_bytes(available)} available "
                     f"({where}); use fewer --layers or --num-blocks, or a smaller --preset/--vocab")
