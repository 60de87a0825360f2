"""``tracestory bench attention-decode``: decode attention (one query token) over a KV length
sweep, with a linear latency model and achieved bandwidth.

Model: for one query token per sequence, SDPA reads K and V once, so its time should grow
linearly with the KV length::

    ITL(kv_len) = a + b · kv_len          (a: fixed cost, launch + tail; b: ns per KV position)

fitted by ordinary least squares over the sweep, with R² = 1 - SS_res / SS_tot (1.0 for an exact
line; ``None`` when every time is equal). ``1/b`` times the bytes per KV position
(``2·B·Hkv·d·dtype_bytes``) is the marginal bandwidth, the one the asymptote reaches.

Bytes counted per call: ``2·B·Hkv·L·d·b`` (K and V) ``+ 2·B·H·d·b`` (q read, output written).
GQA: the H query heads are folded onto their Hkv kv heads as H/Hkv query rows
(``[B, Hkv, H/Hkv, d]``), exact for one query token, so no K/V copy per query head is made.
The L2 cache is flushed between repetitions by default (a real decode step reads K/V after
other layers have evicted them); ``--no-flush`` measures warm-cache times.

Limits: one kernel choice (whatever SDPA picks); all sequences of a batch share kv_len.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from . import common, timer
from .timer import TimingStats

NAME = "attention-decode"
HELP = "decode attention: KV-length sweep, ITL = a + b*kv_len fit, bandwidth vs peak"


@dataclass(frozen=True)
class LineFit:
    intercept: float      # a (same unit as y)
    slope: float          # b (y unit per x unit)
    r2: float | None


def fit_line(x: Sequence[float], y: Sequence[float]) -> LineFit:
    """Least-squares ``y = a + b·x``; needs at least two distinct x."""
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xa.size < 2 or np.ptp(xa) == 0:
        raise ValueError("a line fit needs at least two distinct x values")
    A = np.stack([np.ones_like(xa), xa], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, ya, rcond=None)
    ss_tot = float(((ya - ya.mean()) ** 2).sum())
    ss_res = float(((ya - (a + b * xa)) ** 2).sum())
    r2 = None if ss_tot == 0 else 1.0 - ss_res / ss_tot
    return LineFit(float(a), float(b), r2)


def decode_attention_bytes(batch: int, heads: int, kv_heads: int, head_dim: int, kv_len: int,
                           dtype_bytes: int = 2) -> int:
    return 2 * batch * kv_heads * kv_len * head_dim * dtype_bytes + 2 * batch * heads * head_dim * dtype_bytes


def default_kv_lens(lo: int = 256, hi: int = 32768) -> list[int]:
    out, k = [], lo
    while k <= hi:
        out.append(k)
        k *= 2
    return out


IMPLS = ("sdpa", "sdpa-flash", "matmul")


@dataclass(frozen=True)
class AttentionPoint:
    """One implementation at one KV length."""

    impl: str
    kv_len: int
    timing: TimingStats
    bytes: int
    copy_peak_fraction: float | None

    @property
    def median_ns(self) -> float:
        return self.timing.median_ns

    @property
    def achieved_gbps(self) -> float:
        return self.bytes / self.median_ns

    def to_dict(self) -> dict:
        return {"impl": self.impl, "kv_len": self.kv_len, "median_ns": self.median_ns, "bytes": self.bytes,
                "achieved_gbps": self.achieved_gbps, "copy_peak_fraction": self.copy_peak_fraction,
                "timing": self.timing.to_dict()}


@dataclass(frozen=True)
class AttentionSweep:
    """One implementation over the KV-length sweep, with its line fit (None below two lengths)
    and the marginal bandwidth ``bytes per KV position / slope`` (None unless the slope is > 0)."""

    impl: str
    points: tuple[AttentionPoint, ...]
    fit: LineFit | None
    marginal_gbps: float | None


def _attention_fn(impl: str):
    """q: [B, Hkv, G, d] (the G query heads of each KV head); k, v: [B, Hkv, L, d]."""
    import torch
    import torch.nn.functional as F

    if impl == "matmul":
        def fn(q, k, v):
            s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            return torch.matmul(torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), -1).to(q.dtype), v)
        return fn
    if impl == "sdpa-flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def fn(q, k, v):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v)
        return fn
    return F.scaled_dot_product_attention


def run_attention_decode(dev: common.BenchDevice, *, kv_lens: Sequence[int] | None = None, batch: int = 1,
                         heads: int = 32, gqa: int = 4, head_dim: int = 128, dtype: str = "bf16",
                         impls: Sequence[str] = ("sdpa", "matmul"), flush_l2: bool = True, warmup_ms: float = 25.0,
                         rep_ms: float = 100.0,
                         on_sweep: Callable[[AttentionSweep], None] | None = None) -> list[AttentionSweep]:
    """Time each implementation over the sweep (default :func:`default_kv_lens`), each checked
    against a float64 reference first; one :class:`AttentionSweep` per implementation."""
    import torch

    if heads % gqa:
        raise UsageError(f"--heads {heads} is not a multiple of --gqa {gqa}")
    tdtype = common.torch_dtype(dtype)
    b = common.DTYPE_BYTES[common.dtype_name(dtype)]
    device, pk = dev.device, dev.peaks
    B, H, G, d = batch, heads, gqa, head_dim
    K = H // G
    kv_lens = list(kv_lens or default_kv_lens())
    sweeps = []
    for impl in dict.fromkeys(impls):
        fn = _attention_fn(impl)
        gen = torch.Generator(device=device).manual_seed(0)
        points = []
        for L in kv_lens:
            q = torch.randn(B, K, G, d, device=device, dtype=tdtype, generator=gen)     # H query heads as [Hkv, G]
            k = torch.randn(B, K, L, d, device=device, dtype=tdtype, generator=gen)     # [B, Hkv, L, d]
            v = torch.randn(B, K, L, d, device=device, dtype=tdtype, generator=gen)
            with torch.inference_mode():
                _check(torch, fn(q, k, v), q, k, v, impl)

                def call(q=q, k=k, v=v):
                    with common.region("decode"):
                        fn(q, k, v)

                res = timer.measure(call, warmup_ms=warmup_ms, rep_ms=rep_ms, flush_l2=flush_l2, device=device,
                                    region_name="BENCHMARK")
            nbytes = decode_attention_bytes(B, H, K, d, L, b)
            points.append(AttentionPoint(impl, L, res, nbytes, (nbytes / res.median_ns * 1e9 / pk.copy_bytes_per_s)
                                         if pk.copy_bytes_per_s else None))
        fit = fit_line([p.kv_len for p in points], [p.median_ns for p in points]) if len(points) >= 2 else None
        marginal = None
        if fit is not None and fit.slope > 0:
            marginal = 2 * B * K * d * b / fit.slope
        sweep = AttentionSweep(impl, tuple(points), fit, marginal)
        sweeps.append(sweep)
        if on_sweep is not None:
            on_sweep(sweep)
    return sweeps


def _check(torch, out, q, k, v, impl: str) -> None:
    """Every implementation against a float64 reference before it is timed."""
    qd, kd, vd = q.double(), k.double(), v.double()
    ref = torch.softmax(qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ vd
    err = ((out.double() - ref).norm() / ref.norm()).item()
    tol = 1e-5 if q.dtype == torch.float32 else 2e-2
    if not err <= tol:
        raise ArithmeticError(f"decode attention {impl}: relative error {err:.2e} > {tol:.0e} vs the float64 reference")
