"""Names of the host API calls that launch GPU work: CUDA runtime and driver, HIP, graphs.

Model
-----
A *kernel launch* submits one kernel (``cudaLaunchKernel``, ``cuLaunchKernelEx``,
``hipLaunchKernel``, ``hipExtModuleLaunchKernel``, ...); a *graph launch* submits a whole
captured graph, whose kernels then run without a launch call of their own
(``cudaGraphLaunch``, ``cuGraphLaunch``, ``hipGraphLaunch``). A *copy call* submits one
memcpy or memset (``cudaMemcpyAsync``, ``cuMemsetD32Async``, ``hipMemcpyWithStream``: any name
that starts with the runtime's or driver's ``Memcpy``/``Memset``); it is not a launch, but the
copy it submits is placed on the GPU one by one, as a directly launched kernel is.

Names are compared after removing the suffixes profilers add: nsys's API version
(``cudaLaunchKernel_v7000``) and the per-thread default-stream variants (``_ptsz``,
``_ptds``, ``_spt``). Kineto prints HIP calls under the ``cuda_runtime`` category with their
HIP names, so the same sets serve both vendors.

Limits: a launch API not listed here (a future ``cudaLaunchKernelEx`` variant under a new
name) is not counted; :func:`is_launch_name` says which names are.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace import factorize

KERNEL_LAUNCH_APIS: frozenset[str] = frozenset({
    # CUDA runtime
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice", "cudaLaunch",
    # CUDA driver
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice",
    "cuLaunchGrid", "cuLaunchGridAsync",
    # HIP
    "hipLaunchKernel", "hipLaunchKernelExC", "hipExtLaunchKernel", "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel", "hipLaunchCooperativeKernel",
    "hipLaunchCooperativeKernelMultiDevice", "hipModuleLaunchCooperativeKernel",
    "hipModuleLaunchCooperativeKernelMultiDevice", "hipExtLaunchMultiKernelMultiDevice", "hipLaunchByPtr",
})
GRAPH_LAUNCH_APIS: frozenset[str] = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})

_COPY_CALL = re.compile(r"^(cuda|cu|hip)(Memcpy|Memset)")

_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds|_spt)?(_v\d+)?$")


def base_name(name: str) -> str:
    """``name`` without nsys's version suffix and the per-thread-stream suffixes."""
    return _SUFFIX.sub("", name) if name else name


def is_kernel_launch(name: str) -> bool:
    """A call that launches one kernel (not a graph)."""
    return base_name(name) in KERNEL_LAUNCH_APIS


def is_graph_launch(name: str) -> bool:
    """A call that launches a captured CUDA or HIP graph."""
    return base_name(name) in GRAPH_LAUNCH_APIS


def is_launch_name(name: str) -> bool:
    """A kernel or graph launch."""
    b = base_name(name)
    return b in KERNEL_LAUNCH_APIS or b in GRAPH_LAUNCH_APIS


def is_copy_call(name: str) -> bool:
    """A call that submits one memcpy or memset (CUDA runtime or driver, HIP)."""
    return bool(_COPY_CALL.match(base_name(name) or ""))


def copy_mask(trace) -> np.ndarray:
    """Per row of ``trace.api``: is a copy call (:func:`is_copy_call`), names read once per code."""
    api = trace.api
    if len(api) == 0:
        return np.zeros(0, dtype=bool)
    codes, inv = factorize(api["name"])  # O(n): name codes span a small range
    names = [trace.name(int(c)) if int(c) >= 0 else "" for c in codes.tolist()]
    return np.fromiter((is_copy_call(n) for n in names), dtype=bool, count=len(names))[inv]


def launch_masks(trace) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``trace.api``: (is a kernel launch, is a graph launch), names read once per code."""
    api = trace.api
    if len(api) == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    codes, inv = factorize(api["name"])  # O(n): name codes span a small range
    names = [trace.name(int(c)) if int(c) >= 0 else "" for c in codes.tolist()]
    kernel = np.fromiter((is_kernel_launch(n) for n in names), dtype=bool, count=len(names))
    graph = np.fromiter((is_graph_launch(n) for n in names), dtype=bool, count=len(names))
    return kernel[inv], graph[inv]
