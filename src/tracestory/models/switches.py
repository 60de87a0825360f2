"""Engine paths that can be switched off from the environment, for A/B measurements.

Each switch is on unless its variable is ``0``, ``false``, ``no`` or ``off`` (any case):
``TRACESTORY_FRESH_ATTN`` (:mod:`tracestory.serve.fresh_attention`), ``TRACESTORY_SMALL_M`` (the
small-M FP8 GEMM, :mod:`.fp8_small_m`), ``TRACESTORY_PDL`` (programmatic dependent launch,
:mod:`.pdl`), ``TRACESTORY_DECODE_ATTN`` (the paged split-KV decode kernels of the decode graphs,
:mod:`.decode_attn`; its opt-in variants ``TRACESTORY_DECODE_ATTN_FUSED`` and
``TRACESTORY_DECODE_ATTN_QUANT`` are off unless set). Multi-valued settings
(``TRACESTORY_GLUE``, ``TRACESTORY_ALLREDUCE``) are read where they are used.
"""

from __future__ import annotations

import os

OFF = ("0", "false", "no", "off")


def env_on(name: str) -> bool:
    """Whether the switch ``name`` is on (unset: on)."""
    return os.environ.get(name, "1").strip().lower() not in OFF


def opted_in(name: str) -> bool:
    """Whether the opt-in switch ``name`` is on: set to anything but ``0``, ``false``, ``no``,
    ``off`` or nothing (unset: off, unlike :func:`env_on`)."""
    value = os.environ.get(name, "").strip().lower()
    return bool(value) and value not in OFF
