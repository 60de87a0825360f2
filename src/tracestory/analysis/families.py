"""Kernel families: the library or code generator a kernel comes from, read from its name.

One table for the report's family table, its JSON (``kernel_families``) and ``tracestory
compare``. Patterns are regular expressions searched in the kernel name as the library emits
it; the first match wins, no match is ``other``. Inductor's kernels are split by what they
are (``triton_tem_``/``*_mm`` matmul templates, ``triton_poi_`` pointwise, ``triton_red_``/
``triton_per_`` reductions), so a compiled run shows which kind of generated code took the time.
Limits: a name-only rule; a custom kernel named like a library's is counted as that library.
"""

from __future__ import annotations

import re

import numpy as np

FAMILIES: tuple[tuple[str, str], ...] = (
    ("NCCL", r"nccl"),
    ("Triton template (matmul)", r"^triton_tem_|^triton_.*_mm(_|$)"),
    ("Triton fused pointwise", r"^triton_poi_"),
    ("Triton fused reduction", r"^triton_(red|per)_"),
    ("Triton other", r"^triton_"),
    ("FlashAttention", r"flash_fwd|flash_bwd|flash::|pytorch_flash|fmha|flashinfer"),
    ("cuDNN", r"cudnn|^sm\d+_xmma_(fprop|dgrad|wgrad)"),
    ("cuBLAS/nvjet", r"^nvjet|cublas|^sm\d+_xmma_gemm|^ampere_.*gemm|^volta_.*gemm|gemv"),
    ("CUTLASS", r"cutlass"),
    ("ATen elementwise", r"elementwise_kernel|CatArrayBatchedCopy"),
    ("ATen reduction", r"reduce_kernel|at::native::.*reduce"),
    ("ATen other", r"at::native|at::cuda"),
    ("memcpy", r"^Memcpy"),
    ("memset", r"^Memset"),
)
SMALL_OP_FAMILIES = ("ATen elementwise", "ATen reduction", "ATen other")


def kernel_family(name: str) -> str:
    return next((f for f, p in FAMILIES if re.search(p, name)), "other")


def is_generated(family: str) -> bool:
    """Families of Triton/Inductor-generated kernels (a compiled run)."""
    return family.startswith("Triton")


def family_table(trace) -> list[tuple[str, int, int, str]]:
    """(family, ops, time_ns, top kernel) over the trace's kernels and memory ops, by time desc."""
    names = np.concatenate([trace.kernels["name"], trace.memops["name"]])
    dur = np.concatenate([trace.kernels.dur_ns, trace.memops.dur_ns])
    codes, inv = np.unique(names, return_inverse=True)
    fam_of_code = np.array([kernel_family(trace.name(int(c))) for c in codes], dtype=object)
    per_name = np.bincount(inv, weights=dur, minlength=codes.size)
    fam = fam_of_code[inv]
    out = []
    for f in sorted(set(fam_of_code)):
        m, cm = fam == f, fam_of_code == f
        top = int(codes[cm][np.argmax(per_name[cm])])
        out.append((f, int(m.sum()), int(dur[m].sum()), trace.name(top)))
    return sorted(out, key=lambda x: (-x[2], x[0]))
