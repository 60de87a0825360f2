"""The causal-mask flag of attention ops, read from Kineto's "Concrete Inputs" arg.

With ``record_shapes=True`` torch.profiler writes, beside "Input Dims" and "Input type", a
"Concrete Inputs" list: one string per argument of the op, the value for scalars (``"True"``,
``"0."``, ``"559"``) and ``""`` for tensors. Only one scalar of it is kept: whether an attention
op masked its score matrix causally, as a small integer per op row (``ops["causal"]``):

====  ======================================================================
 -1   unknown: not an attention op listed here, or the arg was not recorded
  0   not causal (the full ``S_q x S_k`` score matrix)
  1   causal, top-left aligned: query ``i`` sees keys ``j <= i``
  2   causal, bottom-right aligned: query ``i`` sees keys ``j <= i + S_k - S_q``
====  ======================================================================

The argument's position comes from each op's schema (torch's ``native_functions.yaml``, the
same in torch 2.1 to 2.13): ``is_causal`` of ``scaled_dot_product_attention`` and the
``_scaled_dot_product_*`` ops is top-left aligned (torch documents the SDPA mask as
``tril(ones(L, S))``, the upper-left ``CausalBias``); ``_flash_attention_forward`` runs
FlashAttention 2, whose causal mask is bottom-right aligned (torch calls it causally on
non-square inputs only for ``causal_lower_right``); ``_efficient_attention_forward`` carries
``custom_mask_type`` (0 none, 1 top-left, 2 bottom-right). For a square mask the two alignments
are the same.

Cost: the arg is decoded lazily as a raw JSON slice for every op, and parsed only for rows whose
name is one of the ops below (a handful per layer), so the reader's time and memory do not change
measurably.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np

UNKNOWN, FULL, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = -1, 0, 1, 2

# op name -> (index of the flag in its argument list, how to read it)
_IS_CAUSAL_SDPA = "is_causal (top-left)"
_IS_CAUSAL_FLASH = "is_causal (bottom-right)"
_MASK_TYPE = "custom_mask_type"
_FLAG_AT: dict[str, tuple[int, str]] = {
    "aten::scaled_dot_product_attention": (5, _IS_CAUSAL_SDPA),
    "aten::_scaled_dot_product_flash_attention": (4, _IS_CAUSAL_SDPA),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (4, _IS_CAUSAL_SDPA),
    "aten::_scaled_dot_product_efficient_attention": (6, _IS_CAUSAL_SDPA),
    "aten::_scaled_dot_product_cudnn_attention": (6, _IS_CAUSAL_SDPA),
    "aten::_scaled_dot_product_fused_attention_overrideable": (5, _IS_CAUSAL_SDPA),
    "aten::_scaled_dot_product_attention_math": (5, _IS_CAUSAL_SDPA),
    "aten::_cudnn_attention_forward": (10, _IS_CAUSAL_SDPA),
    "aten::_flash_attention_forward": (8, _IS_CAUSAL_FLASH),
    "aten::_efficient_attention_forward": (9, _MASK_TYPE),
}
OPS_WITH_MASK_FLAG = frozenset(_FLAG_AT)


def _flag(name: str, raw: bytes) -> int:
    """The mask code of one op from its raw "Concrete Inputs" JSON (``b""`` when absent)."""
    if not raw:
        return UNKNOWN
    try:
        values = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return UNKNOWN
    index, how = _FLAG_AT[name]
    if not isinstance(values, list) or index >= len(values):
        return UNKNOWN
    v = values[index]
    if how == _MASK_TYPE:
        return {"0": FULL, "1": CAUSAL_TOP_LEFT, "2": CAUSAL_BOTTOM_RIGHT}.get(str(v).strip(), UNKNOWN)
    text = str(v).strip().lower()
    if text in ("true", "1"):
        return CAUSAL_BOTTOM_RIGHT if how == _IS_CAUSAL_FLASH else CAUSAL_TOP_LEFT
    if text in ("false", "0"):
        return FULL
    return UNKNOWN


def causal_column(name_codes: np.ndarray, pool, concrete_inputs: Callable[[int], bytes]) -> np.ndarray:
    """``ops["causal"]`` for one chunk of ops: ``name_codes`` are the rows' codes in ``pool``
    (a :class:`~tracestory.trace.StringPool`), ``concrete_inputs(row)`` the raw "Concrete Inputs"
    JSON of a row (``b""`` when absent)."""
    out = np.full(len(name_codes), UNKNOWN, dtype=np.int8)
    codes = {c: n for n, c in pool.known(OPS_WITH_MASK_FLAG).items()}
    if not codes:
        return out
    for row in np.flatnonzero(np.isin(name_codes, np.fromiter(codes, dtype=np.int64, count=len(codes)))):
        out[row] = _flag(codes[int(name_codes[row])], concrete_inputs(int(row)))
    return out
