"""Kernel families, implementations, vendors and precisions, read from a kernel's name.

One table (:data:`tracestory.analysis.kernel_rules.RULES`) for the report's family table, its
JSON (``kernel_families``), ``tracestory compare`` and the categories: the first rule whose
pattern is found in the name says which library or code generator the kernel comes from
(family), who ships it (vendor) and which implementation it is. A rule about what a kernel
does rather than who wrote it (norms, softmax, elementwise, ...) leaves family and vendor to
the first library namespace found in the name (``NAMESPACES``: ``vllm::``, ``at::``, ...);
ATen's family then also says what the kernel does (``ATen elementwise``, ``ATen reduction``,
``ATen other``), which ``compare`` uses to name small unfused ops. No rule and no namespace:
``other``. Inductor's kernels are split by what they are (``triton_tem_`` matmul or
attention templates, ``triton_poi_`` pointwise, ``triton_red_``/``triton_per_``
reductions), so a compiled run shows which kind of generated code took the time.

Precision is an attribute, not a category: the narrowest type the name states
(``PRECISION_TOKENS``: ``MxE2m1`` is mxfp4, ``E4m3`` fp8, ``c10::BFloat16`` bf16, cuBLAS's
``nvjet_tst`` bf16 and ``nvjet_qq*`` fp8, Tensile's ``Cijk_..._BBS`` bf16, ...), ``""`` when
it states none. A mixed-precision GEMM (MXFP8 activations x MXFP4 weights) reads as its
narrowest operand (mxfp4).

A collective's byte type is not a precision: ``int8_t`` in a communication kernel's name
(NCCL/RCCL move tensors of any type as bytes) states nothing.

Limits: a name-only reading; a custom kernel named like a library's is counted as that
library; a name that says ``float`` only for a scale or a statistics argument reads fp32.
"""

from __future__ import annotations

import re
from functools import lru_cache

import msgspec
import numpy as np

from ..trace import factorize
from .categories import NameMatcher
from .kernel_rules import ATEN_FAMILY_BY_CATEGORY, NAMESPACES, PRECISION_ORDER, PRECISION_TOKENS, RULES, KernelRule

_COMPILED = tuple((NameMatcher(r.pattern), r) for r in RULES)
_NAMESPACES = tuple((f, v, re.compile(p)) for f, v, p in NAMESPACES)
_PRECISIONS = tuple((p, re.compile(rx)) for p, rx in PRECISION_TOKENS)

# (family, pattern) pairs in table order; first match wins (kept for callers that list them).
FAMILIES: tuple[tuple[str, str], ...] = tuple((r.family or "(by namespace)", r.pattern) for r in RULES)
SMALL_OP_FAMILIES = ("ATen elementwise", "ATen reduction", "ATen other")


class KernelInfo(msgspec.Struct, frozen=True):
    """What the knowledge base says about one kernel or memop name."""

    family: str
    vendor: str
    implementation: str
    precision: str  # "" when the name states none
    llm_category: str
    moe_category: str


@lru_cache(maxsize=65536)
def matching_rule(name: str) -> KernelRule | None:
    """The first rule of the knowledge base whose pattern is found in ``name`` (None: no rule)."""
    lowered = name.lower()
    return next((r for rx, r in _COMPILED if rx.search(name, lowered)), None)


def _namespace(name: str) -> tuple[str, str] | None:
    return next(((f, v) for f, v, rx in _NAMESPACES if rx.search(name)), None)


@lru_cache(maxsize=65536)
def kernel_info(name: str) -> KernelInfo:
    rule = matching_rule(name)
    if rule is None:
        ns = _namespace(name)
        family = ("ATen other" if ns[0] == "ATen" else ns[0]) if ns else "other"
        return KernelInfo(family, ns[1] if ns else "", "other", kernel_precision(name), "other", "other")
    family, vendor = rule.family, rule.vendor
    if not family:
        ns = _namespace(name)
        if ns is None:
            family = "other"
        elif ns[0] == "ATen":
            family, vendor = ATEN_FAMILY_BY_CATEGORY.get(rule.llm, "ATen other"), vendor or ns[1]
        else:
            family, vendor = ns[0], vendor or ns[1]
    return KernelInfo(family, vendor, rule.implementation, kernel_precision(name), rule.llm, rule.moe)


def kernel_family(name: str) -> str:
    return kernel_info(name).family


def kernel_implementation(name: str) -> str:
    """The implementation the knowledge base names (``cuBLAS (nvjet)``, ``FlashAttention 2/3``, ...)."""
    return kernel_info(name).implementation


def kernel_vendor(name: str) -> str:
    return kernel_info(name).vendor


@lru_cache(maxsize=65536)
def kernel_precision(name: str) -> str:
    """The narrowest numeric type the name states (``mxfp4`` ... ``fp64``), ``""`` when none.

    A collective's ``int8_t``/``uint8_t`` (NCCL's ``ncclDevKernel_*_int8_t``, ``..._u8``) is the byte
    type the collective moves (an all-gather of any tensor viewed as bytes), not an int8 model: a
    communication kernel never states int8.
    """
    found = named_precisions([name])
    if "int8" in found:
        rule = matching_rule(name)
        if rule is not None and rule.llm == "communication":
            found = tuple(p for p in found if p != "int8")
    return found[0] if found else ""


def named_precisions(texts) -> tuple[str, ...]:
    """Every precision that some text of ``texts`` names (dtype names such as ``c10::BFloat16``,
    ``float``, ``c10::Float8_e4m3fn``, or kernel names), narrowest first."""
    texts = list(texts)
    found = {p for p, rx in _PRECISIONS if any(rx.search(t) for t in texts)}
    return tuple(p for p in PRECISION_ORDER if p in found)


def is_generated(family: str) -> bool:
    """Families of Triton/Inductor-generated kernels (a compiled run)."""
    return family.startswith("Triton")


def family_table(trace) -> list[tuple[str, int, int, str]]:
    """(family, ops, time_ns, top kernel) over the trace's kernels and memory ops, by time desc."""
    names = np.concatenate([trace.kernels["name"], trace.memops["name"]])
    dur = np.concatenate([trace.kernels.dur_ns, trace.memops.dur_ns])
    codes, inv = factorize(names)
    fam_of_code = np.array([kernel_family(trace.name(int(c))) for c in codes], dtype=object)
    per_name = np.bincount(inv, weights=dur, minlength=codes.size)
    fam = fam_of_code[inv]
    out = []
    for f in sorted(set(fam_of_code)):
        m, cm = fam == f, fam_of_code == f
        top = int(codes[cm][np.argmax(per_name[cm])])
        out.append((f, int(m.sum()), int(dur[m].sum()), trace.name(top)))
    return sorted(out, key=lambda x: (-x[2], x[0]))
