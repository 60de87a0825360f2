"""Which precision a GPU can run: a support table per precision, as a gate with a clear message.

Model
-----
A GPU is identified by its SM version ``major * 10 + minor`` (compute capability 9.0 -> 90).
Each precision has one constraint on it:

==============  ===================  ==========================================
precision       constraint           why
==============  ===================  ==========================================
``bf16``        SM >= 80             bf16 tensor cores arrive with Ampere
``fp8``         SM >= 89             e4m3/e5m2 tensor cores: Ada (89), Hopper (90)
``mxfp8``       SM >= 100            block-scaled (E8M0, 1x32) MMA is Blackwell's
``nvfp4``       SM in {100, 103}     the data-center Blackwell parts (B200, B300)
==============  ===================  ==========================================

``mxfp8`` is the MXFP8 *matmul*: the MXFP8 quantizer is plain arithmetic and runs anywhere.
``nvfp4`` is an ``in`` constraint rather than ``min`` because the consumer Blackwell parts
(SM 120) lack the data-center FP4 MMA path that nvFP4 GEMM kernels use.

Limits: this is what the hardware generation offers, not what a given torch build exposes;
a bench still checks that the torch call exists (``torch._scaled_mm``, the ``float8_e8m0fnu``
dtype) before using it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedGPU, UsageError


@dataclass(frozen=True)
class Constraint:
    """One row of the table: ``kind`` is ``"min"`` (SM >= values[0]) or ``"in"`` (SM in values)."""

    precision: str
    kind: str
    values: tuple[int, ...]
    what: str          # the thing that needs the hardware, for the message
    needs: str         # the hardware, in words

    def allows(self, sm: int) -> bool:
        if self.kind == "min":
            return sm >= self.values[0]
        return sm in self.values


SUPPORT_TABLE: dict[str, Constraint] = {
    "bf16": Constraint("bf16", "min", (80,), "BF16", "Ampere (SM80+)"),
    "fp8": Constraint("fp8", "min", (89,), "FP8 matmul", "Ada or Hopper (SM89+)"),
    "mxfp8": Constraint("mxfp8", "min", (100,), "MXFP8 matmul", "Blackwell (SM100+)"),
    "nvfp4": Constraint("nvfp4", "in", (100, 103), "nvFP4", "data-center Blackwell (SM100 or SM103)"),
}


def sm_version(capability: tuple[int, int]) -> int:
    """``(major, minor)`` as returned by ``torch.cuda.get_device_capability`` -> ``major*10+minor``."""
    major, minor = capability
    return int(major) * 10 + int(minor)


def _constraint(precision: str) -> Constraint:
    try:
        return SUPPORT_TABLE[precision.lower()]
    except KeyError:
        raise UsageError(f"unknown precision {precision!r}: expected one of "
                         f"{', '.join(SUPPORT_TABLE)}") from None


def supported(precision: str, sm: int) -> bool:
    """Whether the table allows ``precision`` on SM version ``sm``."""
    return _constraint(precision).allows(int(sm))


def unsupported_message(precision: str, sm: int) -> str | None:
    """The gate's message (``"MXFP8 matmul needs Blackwell (SM100+); this GPU is SM90"``), or
    ``None`` when the precision is supported."""
    c = _constraint(precision)
    if c.allows(int(sm)):
        return None
    return f"{c.what} needs {c.needs}; this GPU is SM{int(sm)}"


def require(precision: str, sm: int) -> None:
    """Raise :class:`~tracestory.errors.UnsupportedGPU` when ``precision`` cannot run on ``sm``."""
    msg = unsupported_message(precision, sm)
    if msg is not None:
        raise UnsupportedGPU(msg)
