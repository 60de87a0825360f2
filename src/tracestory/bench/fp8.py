"""``tracestory bench fp8``: FP8 / MXFP8 quantization kernels and matmuls, against bf16 cuBLAS.

Interface: :func:`select_cases` (named sets ``small|medium|large|all`` plus custom ``M,N,K``
cases), :func:`prepare_fp8` (the device and its gates), :func:`run_fp8` (``cases``, ``dtype`` of
activations/weights/outputs, ``iterations`` timed repetitions) returning one frozen
:class:`CaseResult` per case. The command line is ``tracestory bench fp8`` (``cli/bench.py``).

Per case ``C[M, N] = A[M, K] @ W[N, K]^T``:

* **quantization** (Triton, :mod:`tracestory.models.quant_triton`) of ``A``: per-tensor,
  per-row and MXFP8 (1x32 blocks, E8M0 scales). Effective bandwidth = minimal bytes
  ``M*K*in_bytes`` (read once) + ``M*K`` (fp8 written) + scale bytes, over the median time,
  compared with a device-to-device copy of ``A`` timed the same way (``2 * M*K*in_bytes`` bytes).
  The per-tensor kernel pair reads ``A`` twice (amax, then quantize), so it moves
  ``2*M*K*in_bytes + M*K`` bytes and cannot pass ~60% of copy bandwidth on this metric.
* **matmuls**: ``torch.matmul`` in ``--dtype`` (cuBLAS baseline); FP8 e4m3 per-tensor and
  row-wise ``torch._scaled_mm`` (``W`` stored ``[N, K]`` row-major, passed as the column-major
  ``[K, N]`` operand cuBLASLt wants); MXFP8 block-scaled ``_scaled_mm`` where the GPU has it
  (SM100+, gated by :mod:`tracestory.bench.support`). FLOPs = ``2*M*N*K``.
* **end to end**: quantize ``A`` (Triton) + the FP8 matmul; the weight is quantized once, ahead
  of time, as in inference.

Checks before any timing: each Triton quantizer against the pure-torch reference below (same
formulas, see quant_triton's docstring; fp8 bytes must match except for a 1e-4 fraction and
scales to 1e-6); each matmul against an fp32 matmul of the same (dequantized) operands on the
first 256 rows (relative Frobenius error < 1e-2); the FP8 result against the unquantized fp32
product (< 0.25, a sanity bound: e4m3 keeps 3 mantissa bits, so ~5% is
typical on Gaussian data; a wrong scale or layout gives ~100%). A failed check marks the method as failed, is
not timed, and makes the command exit 1.

Timing: :func:`tracestory.bench.timer.measure` with ``--iterations`` repetitions and an L2
flush between repetitions. Limits: needs CUDA (Triton, ``_scaled_mm``); on a CPU the command
stops with a message; the reference quantizers run anywhere and are what CPU tests use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import UnsupportedGPU, UsageError
from . import common
from .support import require, sm_version, unsupported_message
from .timer import measure

NAME = "fp8"
HELP = "FP8/MXFP8 Triton quantization kernels and _scaled_mm matmuls vs bf16 cuBLAS"

FP8_MAX = 448.0
CHECK_ROWS = 256

CASES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "small": ((128, 1024, 1024), (512, 1024, 2048)),
    "medium": ((1024, 4096, 4096), (2048, 4096, 4096)),
    "large": ((4096, 8192, 8192), (8192, 8192, 8192)),
}


@dataclass(frozen=True)
class QuantResult:
    method: str                      # "per-tensor" | "per-row" | "mxfp8"
    M: int
    K: int
    median_ns: float | None
    bytes_min: int                   # read A once + write fp8 + scales
    achieved_gbps: float | None      # bytes_min / median
    copy_fraction: float | None      # achieved / copy bandwidth of the same tensor
    mismatch_fraction: float | None  # fp8 bytes differing from the reference
    error: str | None = None


@dataclass(frozen=True)
class MatmulResult:
    method: str                      # the dtype baseline ("bf16", "fp16", "fp32") | "fp8-tensor" | "fp8-row" | "mxfp8"
    M: int
    N: int
    K: int
    matmul_ns: float | None
    e2e_ns: float | None             # activation quantization + matmul (None for the baseline)
    quant_ns: float | None
    flops: int
    matmul_tflops: float | None
    e2e_tflops: float | None
    speedup_vs_baseline: float | None
    rel_err_vs_ref: float | None     # against fp32 on the same (dequantized) operands
    rel_err_vs_fp32: float | None    # against the unquantized fp32 product
    error: str | None = None


@dataclass(frozen=True)
class CaseResult:
    M: int
    N: int
    K: int
    copy_ns: float | None
    copy_gbps: float | None
    quant: tuple[QuantResult, ...] = field(default_factory=tuple)
    matmul: tuple[MatmulResult, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> bool:
        """A quantizer or matmul failed its check (or raised)."""
        return any(r.error for r in (*self.quant, *self.matmul))


@dataclass(frozen=True)
class Fp8Setup:
    """The CUDA device a run uses, its SM version, and why MXFP8 matmuls are skipped (None: they run)."""

    dev: common.BenchDevice
    sm: int
    mxfp8_gate: str | None


# --------------------------------------------------------------------------- references (pure torch)
def ref_quantize_per_tensor(x):
    """``x`` -> ``(q e4m3fn, scale fp32 [1])`` with ``x ~= q * scale``
    (:func:`tracestory.models.fp8.quantize_reference`, the model's own CPU path)."""
    from ..models.fp8 import quantize_reference   # torch at its top

    q, scale = quantize_reference(x, per_row=False)
    return q, scale.reshape(1)


def ref_quantize_per_row(x):
    """``x [M, K]`` -> ``(q e4m3fn [M, K], scale fp32 [M, 1])``
    (:func:`tracestory.models.fp8.quantize_reference`)."""
    from ..models.fp8 import quantize_reference

    return quantize_reference(x, per_row=True)


def ref_quantize_mxfp8(x):
    """``x [M, K]``, ``K % 32 == 0`` -> ``(q e4m3fn [M, K], E8M0 bytes uint8 [M, K//32])``.

    ``e`` = smallest integer with ``amax <= 448 * 2**e`` over each 1x32 block, from the fp32
    bits of amax (exponent E, mantissa m): ``E - 8`` if ``m <= 1.75`` else ``E - 7``."""
    import torch

    M, K = x.shape
    if K % 32:
        raise UsageError(f"MXFP8 needs K to be a multiple of 32, got K={K}")
    xb = x.float().reshape(M, K // 32, 32)
    bits = xb.abs().amax(dim=-1).contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    e = e.clamp(-127, 127)
    inv = ((127 - e) << 23).view(torch.float32)                  # exactly 2**-e
    q = (xb * inv[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(M, K), (e + 127).to(torch.uint8)


def fp8_code_diff(q, ref) -> tuple[float, int]:
    """``(fraction of e4m3 values that differ, largest distance in fp8 steps)``. e4m3 codes of
    one sign are ordered by magnitude, so the step distance is the difference of the low 7
    bits (a sign flip counts as the sum of both magnitudes' codes)."""
    import torch

    a, b = q.view(torch.uint8).to(torch.int32), ref.view(torch.uint8).to(torch.int32)
    diff = a != b
    if not bool(diff.any()):
        return 0.0, 0
    ma, mb = a & 0x7F, b & 0x7F
    same_sign = (a & 0x80) == (b & 0x80)
    steps = torch.where(same_sign, (ma - mb).abs(), ma + mb)
    return float(diff.float().mean()), int(steps.max())


def dequantize(q, scale):
    """fp8 ``q`` times a broadcastable fp32 ``scale`` (per-tensor ``[1]`` or per-row ``[M, 1]``)."""
    return q.float() * scale


def dequantize_mxfp8(q, scales_e8m0):
    """``q [M, K]`` times ``2**(byte - 127)`` of its 1x32 block."""
    import torch

    M, K = q.shape
    s = torch.pow(2.0, scales_e8m0.to(torch.float64) - 127).to(torch.float32)
    return (q.float().reshape(M, K // 32, 32) * s[..., None]).reshape(M, K)


# --------------------------------------------------------------------------- cases
def select_cases(test_cases: str | None, custom: list[tuple[int, int, int]] | None) -> list[tuple[int, int, int]]:
    """The cases to run: named sets (comma list, ``all``) then ``--custom`` ones, no duplicates.
    ``--custom`` alone runs only the custom cases; nothing at all runs every named set."""
    names: list[str] = []
    if test_cases is None:
        names = [] if custom else ["all"]
    else:
        names = [t.strip() for t in test_cases.split(",") if t.strip()]
    out: list[tuple[int, int, int]] = []
    for name in names:
        if name == "all":
            sets = list(CASES)
        elif name in CASES:
            sets = [name]
        else:
            raise UsageError(f"--test-cases: unknown set {name!r}; expected small, medium, large or all")
        for s in sets:
            out.extend(CASES[s])
    out.extend(custom or ())
    seen, uniq = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


# --------------------------------------------------------------------------- GPU run
def _rel_err(got, ref) -> float:
    d = (got.double() - ref.double()).norm()
    r = ref.double().norm()
    return float(d / r) if float(r) > 0 else float(d)


def _time_ns(fn, iterations: int) -> float:
    # Fixed repetition count (--iterations); L2 flushed before each, like do_bench.
    return measure(fn, warmup_ms=25.0, rep_ms=1.0, flush_l2=True, min_reps=iterations,
                   max_reps=iterations).median_ns


def _to_blocked(s):
    """E8M0 scales ``[R, C]`` (uint8) -> cuBLAS's block-scaling layout: R padded to 128 and C to
    4, cut into 128x4 tiles, each tile stored as 32 rows of (4 row-groups x 4 columns)."""
    import torch

    R, C = s.shape
    nr, nc = -(-R // 128), -(-C // 4)
    p = torch.zeros((nr * 128, nc * 4), dtype=torch.uint8, device=s.device)
    p[:R, :C] = s
    tiles = p.view(nr, 128, nc, 4).permute(0, 2, 1, 3)
    out = tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16)
    return out.flatten().view(torch.float8_e8m0fnu)


def _mx_gate(sm: int) -> str | None:
    import torch

    msg = unsupported_message("mxfp8", sm)
    if msg is None and not hasattr(torch, "float8_e8m0fnu"):
        msg = f"MXFP8 matmul needs torch.float8_e8m0fnu; torch {torch.__version__} lacks it"
    return msg


def _quant_case(qt, a, copy_gbps, iters):
    methods = [("per-tensor", qt.quantize_per_tensor, ref_quantize_per_tensor, 4),
               ("per-row", qt.quantize_per_row, ref_quantize_per_row, 4 * a.shape[0])]
    if a.shape[1] % 32 == 0:
        methods.append(("mxfp8", qt.quantize_mxfp8, ref_quantize_mxfp8, a.numel() // 32))
    out = []
    M, K = a.shape
    for name, fn, ref, scale_bytes in methods:
        bytes_min = a.numel() * a.element_size() + a.numel() + scale_bytes
        try:
            q, s = fn(a)
            rq, rs = ref(a)
            mism, ulps = fp8_code_diff(q, rq)
            s_ok = bool((s.float() - rs.float()).abs().le(1e-6 * rs.float().abs()).all())
            if mism > 1e-2 or ulps > 1 or not s_ok:
                raise ArithmeticError(f"{name} quantizer disagrees with the torch reference: "
                                      f"{mism:.2e} of fp8 values differ (at most {ulps} fp8 steps), "
                                      f"scales equal: {s_ok}")
            ns = _time_ns(lambda: fn(a), iters)
            gbps = bytes_min / ns
            out.append(QuantResult(name, M, K, ns, bytes_min, gbps,
                                   gbps / copy_gbps if copy_gbps else None, mism))
        except Exception as e:  # one method failing must not stop the others
            out.append(QuantResult(name, M, K, None, bytes_min, None, None, None, f"{type(e).__name__}: {e}"))
    return out


def _matmul_case(torch, qt, a, w, dtype, iters, fa, mx_msg):
    M, K = a.shape
    N = w.shape[0]
    R = min(M, CHECK_ROWS)
    flops = 2 * M * N * K
    exact = a[:R].float() @ w.float().t()
    out = []

    def tf(ns):
        return flops / ns / 1e3 if ns else None

    base_ns = None
    try:
        c = a @ w.t()
        err = _rel_err(c[:R], exact)
        if not err < 1e-2:
            raise ArithmeticError(f"{dtype} matmul off the fp32 reference by {err:.2e}")
        base_ns = _time_ns(lambda: a @ w.t(), iters)
        out.append(MatmulResult(dtype, M, N, K, base_ns, None, None, flops, tf(base_ns), None,
                                1.0, err, err))
    except Exception as e:
        out.append(MatmulResult(dtype, M, N, K, None, None, None, flops, None, None, None, None,
                                None, f"{type(e).__name__}: {e}"))

    rowwise_out = torch.bfloat16  # cuBLASLt/CUTLASS row-wise FP8 writes bf16
    variants = [
        ("fp8-tensor", qt.quantize_per_tensor, dequantize,
         lambda qw, sw: (qw.t(), sw), common.torch_dtype(dtype)),
        ("fp8-row", qt.quantize_per_row, dequantize,
         lambda qw, sw: (qw.t(), sw.reshape(1, -1).contiguous()), rowwise_out),
    ]
    if mx_msg is None and K % 32 == 0:
        variants.append(("mxfp8", qt.quantize_mxfp8, dequantize_mxfp8,
                         lambda qw, sw: (qw.t(), sw), torch.bfloat16))
    for name, quant, deq, prep_w, out_dtype in variants:
        try:
            qw, sw = quant(w)             # weights: quantized once, ahead of time
            qa, sa = quant(a)
            bw, sb = prep_w(qw, sw)
            if name == "mxfp8":
                def mm(qa, sa, bw=bw, sb=_to_blocked(sb), out_dtype=out_dtype):  # noqa: B008
                    return torch._scaled_mm(qa, bw, _to_blocked(sa), sb, out_dtype=out_dtype)
                deq_ref = deq(qa[:R], sa[:R]) @ deq(qw, sw).t()
            else:
                def mm(qa, sa, bw=bw, sb=sb, out_dtype=out_dtype):
                    return torch._scaled_mm(qa, bw, scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                                            use_fast_accum=fa)
                deq_ref = deq(qa[:R], sa if sa.numel() == 1 else sa[:R]) @ deq(qw, sw).t()
            c = mm(qa, sa)
            e_ref, e_exact = _rel_err(c[:R], deq_ref), _rel_err(c[:R], exact)
            if not (e_ref < 1e-2 and e_exact < 0.25):
                raise ArithmeticError(f"{name} matmul: relative error {e_ref:.2e} against fp32 on the "
                                      f"same fp8 operands, {e_exact:.2e} against the unquantized product")
            mm_ns = _time_ns(lambda: mm(qa, sa), iters)
            q_ns = _time_ns(lambda: quant(a), iters)
            e2e_ns = _time_ns(lambda: mm(*quant(a)), iters)
            out.append(MatmulResult(name, M, N, K, mm_ns, e2e_ns, q_ns, flops, tf(mm_ns), tf(e2e_ns),
                                    base_ns / mm_ns if base_ns else None, e_ref, e_exact))
        except Exception as e:
            out.append(MatmulResult(name, M, N, K, None, None, None, flops, None, None, None, None,
                                    None, f"{type(e).__name__}: {e}"))
    return out


def prepare_fp8(device: str | None = "auto") -> Fp8Setup:
    """Resolve the device; stop with :class:`UnsupportedGPU` when it is not a CUDA GPU with FP8."""
    import torch

    requested = common.resolve_device(device)
    if not requested.startswith("cuda"):
        raise UnsupportedGPU("bench fp8 needs a CUDA GPU (Triton kernels, torch._scaled_mm); "
                             f"this torch ({torch.__version__}) sees none")
    if torch.device(requested).index is not None:
        torch.cuda.set_device(torch.device(requested))
    dev = common.open_device(requested)
    sm = sm_version(dev.info.capability)
    require("fp8", sm)
    return Fp8Setup(dev, sm, _mx_gate(sm))


def run_fp8(cases: Sequence[tuple[int, int, int]], dtype: str = "bf16", iterations: int = 100, *,
            setup: Fp8Setup | None = None, fast_accum: bool = True,
            on_case: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Check, then time, the quantizers and matmuls of every ``(M, N, K)`` case (module docstring).

    The timed work of each case runs inside a ``BENCHMARK`` region (``--profile torch`` records
    the first one)."""
    import torch

    from ..models import quant_triton as qt

    if iterations < 1:
        raise UsageError(f"--iterations must be >= 1, got {iterations}")
    dtype = common.dtype_name(dtype)
    setup = setup or prepare_fp8("auto")
    device, tdtype = setup.dev.device, common.torch_dtype(dtype)
    results = []
    for M, N, K in cases:
        g = torch.Generator(device=device).manual_seed(1234)
        a = torch.randn((M, K), generator=g, device=device, dtype=torch.float32).to(tdtype)
        w = torch.randn((N, K), generator=g, device=device, dtype=torch.float32).to(tdtype)
        dst = torch.empty_like(a)
        copy_ns = _time_ns(lambda dst=dst, a=a: dst.copy_(a), iterations)
        copy_gbps = 2 * a.numel() * a.element_size() / copy_ns
        with common.region("BENCHMARK"):
            quant = _quant_case(qt, a, copy_gbps, iterations)
            mms = _matmul_case(torch, qt, a, w, dtype, iterations, fast_accum, setup.mxfp8_gate)
        case = CaseResult(M, N, K, copy_ns, copy_gbps, tuple(quant), tuple(mms))
        results.append(case)
        if on_case is not None:
            on_case(case)
        del a, w, dst
        torch.cuda.empty_cache()
    return results
