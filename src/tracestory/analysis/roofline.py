"""Roofline placement of kernels, from Nsight Compute counters or estimated from a Kineto trace.

Model
-----
For a kernel doing ``F`` FLOPs and moving ``B`` DRAM bytes (read + written) in ``t`` seconds:
arithmetic intensity ``AI = F / B`` (FLOP/byte), achieved ``F / t`` FLOP/s and ``B / t`` bytes/s.
The roof for the kernel's dominant precision ``p`` (most FLOPs) is
``min(peak_flops[p], AI * peak_bw)``; the ridge point is ``peak_flops[p] / peak_bw``. A kernel
left of the ridge is memory-bound and its "% of roof" is achieved bytes/s over peak bytes/s; right
of it, compute-bound, achieved FLOP/s over peak FLOP/s (equal to FLOP/s over the roof at its AI).
A kernel with FLOPs but no DRAM traffic has an infinite AI and counts as compute-bound.

Assumptions and limits: one roof per kernel even when it mixes precisions (a flash-attention
kernel's softmax FP32 FLOPs are added to its tensor FLOPs); DRAM is the only memory level;
duration is ncu's ``gpu__time_duration`` (kernel replay, clocks as captured).

:func:`estimate_roofline` has no counters: FLOPs come from the op's ``flops`` field (Kineto
``with_flops``) or from input shapes, bytes from shapes (each input read once, the output written
once), for GEMM/linear, SDPA/attention, norms, reductions and elementwise ops. Each op's numbers
are split over the kernels it launched (same External id) in proportion to their durations, and
kernels are grouped by name. Every point is flagged ``estimate=True``. A fused MoE op
(``vllm::moe_forward``, ``fused_moe``, ``fused_experts``) is not estimated, and the note says so:
its inputs hold the tokens and router logits but not the expert weights, so the expert GEMMs'
FLOPs are unknown, and its routing/top-k/permute kernels do no GEMM work (one op cost shared by
duration would give them all one arithmetic intensity). An estimate above its
roof (over 100%) is physically impossible, so it is an estimate error (a shape read wrongly, an op
whose kernels do less work than its shapes say): it is dropped from the points, counted in
``dropped`` and named in the note, and no finding is built on it.

Attention FLOPs are ``4 * B * H * S_q * S_k * D`` (QK^T and PV) times the share of the score
matrix its mask keeps (:func:`kept_score_fraction`): the causal flag is read from the op's
"Concrete Inputs" (``ops["causal"]``, Kineto with ``record_shapes=True``); a causal square mask
keeps ``S (S + 1) / 2`` of ``S^2`` entries, about half. When the flag was not recorded (older
torch, other sources) the full matrix is counted, so a causal prefill is then placed at up to
2x its true FLOP/s. Bytes (Q, K, V read, O written) do not depend on the mask.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import msgspec
import numpy as np

from ..specs import Peaks
from .derived import op_shapes_recorded
from .families import kernel_info
from ..ingest.kineto import parse_json_field
from ..ingest.kineto_attention import CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT

# Kernels whose time is not bound by the GPU's compute/DRAM roofs (their op's shapes say nothing of them).
NOT_ON_THE_ROOFLINE = ("communication", "memcpy", "memset")

# An estimated point above this share of its roof is an estimate error and is dropped.
ROOF_TOLERANCE_PCT = 100.0

# precision of a FLOP counter -> peaks key, with fallbacks
_ROOF_KEY = {
    "fp32": ("fp32",), "fp64": ("fp64",), "fp16": ("fp16_simt",),
    "tensor_bf16": ("bf16",), "tensor_fp16": ("fp16", "bf16"), "tensor_tf32": ("tf32",),
    "tensor_fp8": ("fp8",), "tensor_fp4": ("fp4",), "tensor_fp64": ("fp64_tensor", "fp64"),
    "bf16": ("bf16",), "fp8": ("fp8",), "tf32": ("tf32",),
}


class RooflinePoint(msgspec.Struct, frozen=True):
    label: str                      # kernel name
    kernel_id: int | None           # ncu ID; None for estimates (grouped by name)
    precision: str | None           # dominant FLOP precision, e.g. "tensor_bf16", "fp32"
    roof_dtype: str | None          # peaks key used for the compute roof
    flops: float | None
    dram_bytes: float | None
    duration_ns: int | None
    arithmetic_intensity: float | None    # FLOP/byte; inf when bytes == 0 < flops
    achieved_flops_per_s: float | None
    achieved_bytes_per_s: float | None
    peak_flops_per_s: float | None
    ridge_flop_per_byte: float | None
    bound: str | None               # "memory" | "compute" | None
    pct_of_roof: float | None
    estimate: bool = False
    count: int = 1                  # kernels aggregated into this point


@dataclass(frozen=True)
class Roofline:
    points: tuple[RooflinePoint, ...]
    peaks: Peaks | None
    estimate: bool
    note: str = ""
    # Shape-based estimates that came out above a roof: estimate errors (a mis-read shape, an op
    # whose kernels do less than its shapes say), dropped from ``points``: (label, % of roof).
    dropped: tuple[tuple[str, float], ...] = ()
    # Ops whose kernels get no estimated point, with their kernel count and why: (op, kernels, reason).
    not_estimated: tuple[tuple[str, int, str], ...] = ()

    def ridge(self, dtype: str) -> float | None:
        return None if self.peaks is None else self.peaks.ridge_flop_per_byte(dtype)


def _roof_dtype(precision: str | None, peaks: Peaks | None) -> str | None:
    if precision is None or peaks is None:
        return None
    for key in _ROOF_KEY.get(precision, (precision,)):
        if peaks.flops(key) is not None:
            return key
    return None


def place(label, kernel_id, precision, flops, dram_bytes, duration_ns, peaks, *, estimate=False, count=1):
    """One :class:`RooflinePoint` from raw numbers (any of them may be ``None``)."""
    secs = duration_ns * 1e-9 if duration_ns else None
    ai = None
    if flops is not None and dram_bytes is not None:
        ai = flops / dram_bytes if dram_bytes > 0 else (math.inf if flops > 0 else None)
    fps = flops / secs if flops is not None and secs else None
    bps = dram_bytes / secs if dram_bytes is not None and secs else None
    key = _roof_dtype(precision, peaks)
    peak = peaks.flops(key) if key else None
    ridge = peaks.ridge_flop_per_byte(key) if key else None
    bound = pct = None
    if peaks is not None and ai is not None:
        if ridge is not None:
            bound = "memory" if ai < ridge else "compute"
        elif flops == 0:
            bound = "memory"
        if bound == "memory" and bps is not None:
            pct = 100.0 * bps / peaks.dram_bytes_per_s
        elif bound == "compute" and fps is not None and peak:
            pct = 100.0 * fps / peak
    return RooflinePoint(label=label, kernel_id=kernel_id, precision=precision, roof_dtype=key, flops=flops,
                         dram_bytes=dram_bytes, duration_ns=duration_ns, arithmetic_intensity=ai,
                         achieved_flops_per_s=fps, achieved_bytes_per_s=bps, peak_flops_per_s=peak,
                         ridge_flop_per_byte=ridge, bound=bound, pct_of_roof=pct, estimate=estimate, count=count)


def roofline(km, peaks: Peaks | None) -> Roofline:
    """Each ncu kernel on the roofline of ``peaks`` (``None`` peaks: AI and rates only)."""
    points = tuple(
        place(k.name, k.id, k.dominant_precision, k.flops, k.dram_bytes, k.duration_ns, peaks)
        for k in km.kernels
    )
    note = "" if peaks is not None else "no peaks for this GPU: bound and % of roof are n/a"
    return Roofline(points=points, peaks=peaks, estimate=False, note=note)


def estimate_roofline(trace, peaks: Peaks | None) -> Roofline:
    """Kineto-only roofline: FLOPs/bytes from ops' ``flops`` or shapes, attributed to kernels by
    External id, one point per kernel name. Labelled as an estimate."""
    k = trace.kernels
    if len(k) == 0 or len(trace.ops) == 0:
        return Roofline(points=(), peaks=peaks, estimate=True,
                        note="the trace holds no CPU ops to estimate from" if len(k) else "no kernels to estimate")
    ops = trace.ops
    # innermost op per external id: the one starting last among ops sharing the id
    ext = ops["external_id"]
    order = np.lexsort((ops["start_ns"], ext))
    ext_sorted = ext[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ext_sorted[1:] != ext_sorted[:-1]
    keys, rows = ext_sorted[last], order[last]
    kext = k["external_id"]
    pos = np.searchsorted(keys, kext)
    pos_c = np.minimum(pos, len(keys) - 1)
    hit = (kext >= 0) & (keys[pos_c] == kext) if len(keys) else np.zeros(len(kext), bool)
    op_row = np.where(hit, rows[pos_c], -1)
    dur = k.dur_ns.astype(np.float64)
    launched = np.unique(op_row[op_row >= 0])
    flops_op, bytes_op, prec_op = _op_costs(trace, launched)
    moe_codes, not_estimated = _fused_moe_ops(trace, op_row)
    moe_rows = launched[np.isin(ops["name"][launched], moe_codes)]
    flops_op[moe_rows] = bytes_op[moe_rows] = np.nan  # their kernels get no point
    # share of each op's cost by kernel duration
    ok = op_row >= 0
    tot = np.zeros(len(ops))
    np.add.at(tot, op_row[ok], dur[ok])
    share = np.zeros(len(k))
    share[ok] = np.divide(dur[ok], tot[op_row[ok]], out=np.zeros(ok.sum()), where=tot[op_row[ok]] > 0)
    kf = np.full(len(k), np.nan)
    kb = np.full(len(k), np.nan)
    kf[ok] = flops_op[op_row[ok]] * share[ok]
    kb[ok] = bytes_op[op_row[ok]] * share[ok]
    names = k["name"]
    points = []
    # One group per kernel name (ascending code), rows ascending within it.
    valid = np.flatnonzero(np.isfinite(kf) & np.isfinite(kb))
    by_name = valid[np.argsort(names[valid], kind="stable")]
    cut = np.flatnonzero(np.diff(names[by_name])) + 1
    for rows_m in np.split(by_name, cut) if len(by_name) else ():
        label = trace.name(int(names[rows_m[0]]))
        if kernel_info(label).llm_category in NOT_ON_THE_ROOFLINE:
            continue  # collectives and copies move data over links, not through a compute roof
        points.append(place(label, None, prec_op[op_row[rows_m[0]]],
                            float(kf[rows_m].sum()), float(kb[rows_m].sum()), int(dur[rows_m].sum()), peaks,
                            estimate=True, count=len(rows_m)))
    points.sort(key=lambda p: -(p.duration_ns or 0))
    # Physics: no kernel runs above its roof. An estimate that does is wrong, not fast.
    dropped = tuple((p.label, p.pct_of_roof) for p in points if p.pct_of_roof is not None and p.pct_of_roof > ROOF_TOLERANCE_PCT)
    kept = tuple(p for p in points if p.pct_of_roof is None or p.pct_of_roof <= ROOF_TOLERANCE_PCT)
    note = "estimate: FLOPs and bytes from op shapes (Kineto), not hardware counters"
    if not points and not dropped:
        note = ("op shapes were recorded, but no kernel could be tied (by its External id) to an op whose shapes "
                "give its FLOPs and bytes" if op_shapes_recorded(trace)
                else "no recorded op shapes (capture with record_shapes=True)")
    if dropped:
        note += (f"; {len(dropped)} kernel{'s' if len(dropped) != 1 else ''} whose estimate came out above "
                 "the roof dropped as estimate errors")
    for op_name, n_kernels, reason in not_estimated:
        note += f"; {op_name} ({n_kernels} kernel{'s' if n_kernels != 1 else ''}) not estimated: {reason}"
    return Roofline(points=kept, peaks=peaks, estimate=True, note=note, dropped=dropped, not_estimated=not_estimated)


# A fused MoE op (vLLM's moe_forward, SGLang/vLLM fused_moe / fused_experts): one CPU op launches the
# routing, permutation, quantization, expert GEMM and finalize kernels.
_FUSED_MOE_OP = re.compile(r"moe|fused_experts", re.IGNORECASE)
FUSED_MOE_REASON = ("a fused MoE op's inputs are the tokens and router logits, not the expert weights, so its "
                    "expert GEMMs' FLOPs are unknown from shapes, and one cost spread over its routing, "
                    "permutation and GEMM kernels alike would give them all one arithmetic intensity")


def _fused_moe_ops(trace, op_row: np.ndarray) -> tuple[np.ndarray, tuple[tuple[str, int, str], ...]]:
    """Name codes of the fused MoE ops that launched kernels, and (name, kernel count, reason) for each."""
    codes, counts = np.unique(trace.ops["name"][op_row[op_row >= 0]], return_counts=True)
    moe = [(int(c), int(n)) for c, n in zip(codes, counts) if _FUSED_MOE_OP.search(trace.name(int(c)))]
    return (np.array([c for c, _ in moe], dtype=codes.dtype),
            tuple((trace.name(c), n, FUSED_MOE_REASON) for c, n in moe))


# --------------------------------------------------------------------------- op costs
_ELT = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "c10::Float8_e4m3fn": 1,
        "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "long int": 8,
        "int": 4, "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1}
_PREC = {"c10::BFloat16": "bf16", "c10::Half": "tensor_fp16", "float": "fp32", "double": "fp64",
         "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}
_GEMM = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addmv", "mv"}
_NORM = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm", "native_group_norm",
         "batch_norm", "native_batch_norm", "_batch_norm_impl_index", "cudnn_batch_norm"}
_REDUCE = {"mean", "sum", "amax", "amin", "max", "min", "norm", "var", "std", "var_mean", "prod", "argmax"}
_SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
_MOVE = {"copy_", "clone", "_to_copy", "to", "contiguous", "cat", "stack", "index_select", "gather",
         "fill_", "zero_", "zeros", "ones", "empty", "index", "index_put_", "scatter_", "_unsafe_view"}
_BSHD = ("_flash_attention_forward", "_efficient_attention_forward")


def kept_score_fraction(sq: int, sk: int, causal: int) -> float:
    """Share of the ``sq x sk`` attention score matrix that a mask keeps (1.0 unless causal).

    Top-left aligned (torch SDPA's ``is_causal``): query ``i`` sees keys ``j <= i``, so row ``i``
    keeps ``min(i + 1, sk)`` entries. Bottom-right aligned (FlashAttention 2, ``causal_lower_right``):
    row ``i`` keeps ``clamp(i + 1 + sk - sq, 0, sk)``. For ``sq == sk`` both keep ``sq (sq + 1) / 2``
    entries: half the matrix plus its diagonal."""
    if causal not in (CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT) or sq <= 0 or sk <= 0:
        return 1.0
    if causal == CAUSAL_TOP_LEFT:
        n = min(sq, sk)  # rows 0..n-1 keep i + 1 entries, later rows keep all sk
        kept = n * (n + 1) // 2 + (sq - n) * sk
    else:
        offset = sk - sq  # row i keeps i + 1 + offset entries (never more than sk, as i < sq)
        first = max(0, -offset)  # rows before it keep none (a query with no key to see)
        kept = (sq - first) * ((first + 1 + offset) + (sq + offset)) // 2  # arithmetic series
    return kept / (sq * sk)


def _cost(name: str, dims_raw, types_raw, flops_field: float, causal: int = -1) -> tuple[float, float, str | None]:
    """(FLOPs, bytes, precision) of one op from its shapes; NaN when not estimable. ``causal`` is
    the op's ``ops["causal"]`` code (attention ops only)."""

    dims = parse_json_field(dims_raw) or []
    types = parse_json_field(types_raw) or []
    op = name.split("::")[-1]
    tensors = [(list(d), t) for d, t in zip(dims, types) if t in _ELT and isinstance(d, list)
               and all(isinstance(x, int) for x in d)]
    if not tensors:
        return math.nan, math.nan, None
    numel = [math.prod(d) for d, _ in tensors]
    elt = [_ELT[t] for _, t in tensors]
    nbytes = [n * e for n, e in zip(numel, elt)]
    t0 = tensors[0][1]
    if op in _GEMM:
        if op == "linear" and len(tensors) >= 2:
            x, w = tensors[0][0], tensors[1][0]
            batch, m, kk, n = 1, math.prod(x[:-1]), x[-1], w[0]
        else:
            mats = [d for d, _ in tensors if len(d) >= 2]
            if op in ("addmm", "baddbmm") and len(mats) >= 3:
                mats = mats[1:]
            if len(mats) < 2:
                return math.nan, math.nan, None
            a, b = mats[0], mats[1]
            batch, m, kk, n = math.prod(a[:-2]) if len(a) > 2 else 1, a[-2], a[-1], b[-1]
        flops = 2.0 * batch * m * n * kk
        out_elt = 2 if op == "_scaled_mm" else elt[0]
        byts = float(sum(nbytes[:2]) + batch * m * n * out_elt)
        if math.isfinite(flops_field) and flops_field > 0:
            flops = flops_field
        return flops, byts, _PREC.get(t0, "fp32")
    if "attention" in op or "scaled_dot_product" in op:
        if len(tensors) < 3:
            return math.nan, math.nan, None
        q, k = tensors[0][0], tensors[1][0]
        sq, sk = (q[1], k[1]) if op in _BSHD else (q[-2], k[-2])
        # QK^T and PV, 2 FLOPs per multiply-add, over the score entries the mask keeps
        flops = 4.0 * numel[0] * sk * kept_score_fraction(sq, sk, causal)
        return flops, float(sum(nbytes[:3]) + nbytes[0]), _PREC.get(t0, "fp32")
    if "conv" in op and "convert" not in op:
        # Convolutions: the FLOPs need stride, padding and dilation, which the shapes do not carry. Only
        # the profiler's own count (with_flops=True) places them; never the elementwise fallback below.
        if math.isfinite(flops_field) and flops_field > 0:
            return flops_field, float(sum(nbytes) + nbytes[0]), _PREC.get(t0, "fp32")
        return math.nan, math.nan, None
    if op in _NORM:
        return 5.0 * numel[0], float(2 * nbytes[0] + sum(nbytes[1:])), "fp32"
    if op in _SOFTMAX:
        return 5.0 * numel[0], float(2 * nbytes[0]), "fp32"
    if op in _REDUCE:
        return float(numel[0]), float(nbytes[0]), "fp32"
    out = max(numel)
    if op in ("embedding", "index_select") and len(tensors) >= 2:
        w_row = math.prod(tensors[0][0][1:])  # only the selected rows are read
        return 0.0, float(2 * numel[1] * w_row * elt[0] + nbytes[1]), "fp32"
    if op == "copy_":
        # copy_(dst, src): dst written, src read, each in its own dtype (fp32 -> bf16: 4 + 2 bytes)
        return 0.0, float(nbytes[0] + nbytes[1] if len(nbytes) > 1 else 2 * nbytes[0]), "fp32"
    flops = 0.0 if op in _MOVE else float(out)
    return flops, float(sum(nbytes) + out * elt[0]), "fp32"


def _op_costs(trace, rows: np.ndarray):
    """Per-op (FLOPs, bytes, precision) for the op rows in ``rows``; NaN elsewhere. Ops with the
    same name, shapes, types and flops field are costed once: the rows are grouped by that key
    at C speed (tuples hashed by a dict), and only one row per distinct key runs Python code."""
    ops = trace.ops
    n = len(ops)
    flops, byts, prec = np.full(n, np.nan), np.full(n, np.nan), np.full(n, None, dtype=object)
    if len(rows) == 0:
        return flops, byts, prec
    names, dims, types, ff, causal = (ops[c] for c in ("name", "input_dims", "input_types", "flops", "causal"))
    # The flops field by its bits: NaN (no flops field) never equals itself, its bits do.
    keys = list(zip(names[rows].tolist(), dims[rows].tolist(), types[rows].tolist(),
                    np.ascontiguousarray(ff[rows], dtype=np.float64).view(np.int64).tolist(),
                    causal[rows].tolist()))
    first = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))  # key -> its first position
    costs = [_cost(trace.name(key[0]), key[1], key[2], float(ff[rows[i]]), key[4]) for key, i in first.items()]
    group = dict(zip(first, range(len(first))))
    g = np.fromiter(map(group.__getitem__, keys), dtype=np.int64, count=len(keys))
    flops[rows] = np.array([c[0] for c in costs], dtype=np.float64)[g]
    byts[rows] = np.array([c[1] for c in costs], dtype=np.float64)[g]
    p_group = np.empty(len(costs), dtype=object)
    p_group[:] = [c[2] for c in costs]
    prec[rows] = p_group[g]
    return flops, byts, prec
