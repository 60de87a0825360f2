"""Tensor layout conversions: time the GPU spends transposing activations between NCHW and NHWC.

Model: cuDNN's (and TensorRT's) tensor-core convolutions work in NHWC; handed NCHW tensors, they
run a conversion kernel before the convolution and another after it (``nchwToNhwcKernel``,
``nhwcToNchwKernel``). Those kernels do no model work: they exist because the tensors reach the
library in the other layout. A PyTorch program avoids them with the channels_last memory format
(a channels_last ResNet trace runs none). The rule reads kernel names only: the share is exact,
the cause (the layout of the tensors handed to the library) is the documented one; a program
that must keep NCHW for other reasons pays them by design.
"""

from __future__ import annotations

import re

import numpy as np

from ...trace import factorize
from ...units import fmt_ns, fmt_pct, plural
from ..facts import RunFacts
from .base import Evidence, Finding

LAYOUT_KERNEL = re.compile(r"nchwToNhwc|nhwcToNchw|NchwToNhwc|NhwcToNchw", re.IGNORECASE)
LAYOUT_SHARE = 0.05  # of GPU op time, below which the conversions are not worth a finding


def rule_layout_conversion(f: RunFacts) -> list[Finding]:
    tr = f.trace
    k = tr.kernels
    total = f.analysis.breakdown.total_time_ns
    if not len(k) or total <= 0:
        return []
    codes, inv = factorize(k["name"])
    is_layout = np.array([c >= 0 and bool(LAYOUT_KERNEL.search(tr.name(int(c)))) for c in codes])
    if not is_layout.any():
        return []
    rows = is_layout[inv]
    dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    t = int(dur[rows].sum())
    share = t / total
    if share < LAYOUT_SHARE:
        return []
    per = np.where(is_layout, np.bincount(inv, weights=dur, minlength=codes.size), -1)
    top = int(codes[int(np.argmax(per))])
    ev = (
        Evidence("layout conversion share of GPU op time", share, "fraction"),
        Evidence("layout conversion time", t, "ns"),
        Evidence("layout conversion kernels", int(rows.sum()), "count"),
        Evidence("kernel with the most such time", tr.name(top), "text"),
    )
    if f.producer.is_pytorch:
        fix = (
            "Convert the model and its inputs to channels_last (`model.to(memory_format=torch.channels_last)` and "
            "`x.to(memory_format=torch.channels_last)`), so the convolutions get NHWC tensors and run no conversions"
        )
    else:
        fix = "Keep activations in NHWC between the convolutions, the layout the tensor-core convolutions use"
    return [
        Finding(
            "layout_conversion",
            "medium" if share >= 0.1 else "low",
            f"NCHW/NHWC layout conversions take {fmt_pct(share)} of GPU op time "
            f"({plural(int(rows.sum()), 'kernel')}, {fmt_ns(t)})",
            ev,
            "The convolution library transposes the activations to NHWC before each tensor-core convolution and "
            "back after it: this is copying, not model work, and it exists because the tensors arrive in NCHW.",
            fix + " (then check that the conversion kernels are gone from a new trace).",
        )
    ]
