"""Programmatic dependent launch (PDL) for the Triton kernels of a decode step.

Model: a batch-1 decode step is a chain of about 420 short kernels (per layer: norm, QKV GEMM,
RoPE, attention, quantiser, Wo, norm, gate/up, SwiGLU, Wd), each 2-40 us, and the device time
of the step exceeds the sum of its kernels by about 0.9 us per kernel boundary (H100: 4.39 ms
against 4.01 ms of kernels, docs/BENCHMARKS.md). Between two dependent kernels of a stream the GPU
drains the first, then launches the second. On Hopper a kernel launched with the PDL attribute
may be scheduled while its predecessor still runs; it then waits (``griddepcontrol.wait``: until
the predecessor has finished and its writes are visible) before it reads or writes anything.
Here every PDL kernel waits first (:func:`tracestory.models.quant_triton._pdl_enter`), then lets
its own successor be scheduled (``griddepcontrol.launch_dependents``), so at most one kernel
waits ahead of the running one and no kernel touches memory before its predecessor is done:
the results are those of plain launches, bit for bit (tests/gpu). What is saved is the launch
latency at each boundary between two PDL kernels.

Kernels launched without the attribute (cuBLAS's, FlexAttention's, NCCL's) keep the ordinary
stream order before and after a PDL kernel. Stream capture records the programmatic edges, so
the CUDA graphs of the server keep them.

:func:`enabled` decides per launch: a CUDA device of compute capability 9.0 or later, a Triton
with ``gdc_wait`` and the ``launch_pdl`` launch option, and ``TRACESTORY_PDL`` not off
(:mod:`.switches`). Measured (H100, ``benchmarks/gpu/pdl_ab.py``, the decode steps of models with
and without it alternated): 1.8-2.0% less device time per step at batch 1 and 4, 0.9% at 16.
Prefetching the head of each weight row into L2 before the wait (``prefetch.global.L2``) was
measured too: no gain at 2 KiB a row, 3-4% slower at 8 KiB; not kept.

Limits: one stream (the dependency is stream order); the Triton kernels of this package only.
"""

from __future__ import annotations

from .switches import env_on

ENV = "TRACESTORY_PDL"
_CAPABLE: dict[int, bool] = {}        # device index -> the GPU and Triton can launch with PDL


def _capable(device_index: int) -> bool:
    if device_index not in _CAPABLE:
        import torch
        import triton.language as tl

        ok = torch.cuda.get_device_capability(device_index)[0] >= 9 and hasattr(tl.extra.cuda, "gdc_wait")
        if ok:
            try:
                from triton.backends.nvidia.compiler import CUDAOptions
            except ImportError:
                ok = False
            else:
                ok = "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
        _CAPABLE[device_index] = ok
    return _CAPABLE[device_index]


def enabled(device) -> bool:
    """Whether kernels launched on ``device`` (a torch device) use PDL (module docstring)."""
    if getattr(device, "type", "cpu") != "cuda" or not env_on(ENV):
        return False
    index = device.index
    if index is None:
        import torch

        index = torch.cuda.current_device()
    return _capable(index)


def launch_options(use: bool) -> dict:
    """The Triton launch keywords for a kernel launched with PDL (``use``) or without (none, so a
    Triton without the option is never handed it)."""
    return {"launch_pdl": True} if use else {}


def kernel_options(device) -> dict:
    """The keywords every PDL-aware kernel of this package is launched with on ``device``: its
    ``USE_PDL`` constexpr (:func:`.quant_triton._pdl_enter`) and, when on, the launch option."""
    use = enabled(device)
    return {"USE_PDL": use, **launch_options(use)}
