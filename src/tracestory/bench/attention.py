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

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-len", type=int, nargs="+", default=None, help="KV lengths (default: 256..32768 doubling)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32, help="query heads (default: 32)")
    p.add_argument("--gqa", type=int, default=4, help="query heads per KV head (default: 4, llama-3-8b)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--impl", nargs="+", default=["sdpa", "matmul"], choices=IMPLS,
                   help="sdpa: whichever backend torch picks; sdpa-flash: SDPA forced to FlashAttention; "
                        "matmul: two batched GEMMs (default: sdpa matmul)")
    p.add_argument("--no-flush", action="store_true", help="keep L2 warm between repetitions")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)


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


def main(args) -> int:
    import torch

    from ..errors import UsageError
    from . import common, timer

    if args.heads % args.gqa:
        raise UsageError(f"--heads {args.heads} is not a multiple of --gqa {args.gqa}")
    dev = common.resolve_device(getattr(args, "device", None))
    info = common.device_info(dev)
    pk = common.peaks(info)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    b = torch.tensor([], dtype=dtype).element_size()
    B, H, G, d = args.batch, args.heads, args.gqa, args.head_dim
    K = H // G
    kv_lens = args.kv_len or default_kv_lens()
    impls = list(dict.fromkeys(getattr(args, "impl", None) or ["sdpa"]))
    print(common.header(info, pk))
    print(f"decode attention: B={B} H={H} Hkv={K} d={d} {args.dtype}, L2 flush {'off' if args.no_flush else 'on'}")
    rows, fits = [], {}
    for impl in impls:
        fn = _attention_fn(impl)
        gen = torch.Generator(device=dev).manual_seed(0)
        impl_rows = []
        for L in kv_lens:
            q = torch.randn(B, K, G, d, device=dev, dtype=dtype, generator=gen)     # H query heads as [Hkv, G]
            k = torch.randn(B, K, L, d, device=dev, dtype=dtype, generator=gen)     # [B, Hkv, L, d]
            v = torch.randn(B, K, L, d, device=dev, dtype=dtype, generator=gen)
            with torch.inference_mode():
                _check(torch, fn(q, k, v), q, k, v, impl)

                def call(q=q, k=k, v=v):
                    with common.region("decode"):
                        fn(q, k, v)

                res = timer.measure(call, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                                    flush_l2=not args.no_flush, device=dev, region_name="BENCHMARK")
            nbytes = decode_attention_bytes(B, H, K, d, L, b)
            impl_rows.append({"impl": impl, "kv_len": L, "median_ns": res.median_ns, "bytes": nbytes,
                              "achieved_gbps": nbytes / res.median_ns,
                              "copy_peak_fraction": (nbytes / res.median_ns * 1e9 / pk.copy_bytes_per_s)
                              if pk.copy_bytes_per_s else None,
                              "timing": res.to_dict()})
        fits[impl] = _report_impl(common, pk, impl, impl_rows, B, K, d, b)
        rows += impl_rows
    first = fits[impls[0]]
    common.write_json(getattr(args, "json", None), {
        "bench": NAME, "device": asdict(info), "peaks": asdict(pk),
        "args": {k: v for k, v in vars(args).items() if k != "func"}, "results": rows,
        "fits": fits, "fit": first["fit"], "marginal_gbps": first["marginal_gbps"]})
    return 0


def _check(torch, out, q, k, v, impl: str) -> None:
    """Every implementation against a float64 reference before it is timed."""
    qd, kd, vd = q.double(), k.double(), v.double()
    ref = torch.softmax(qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ vd
    err = ((out.double() - ref).norm() / ref.norm()).item()
    tol = 1e-5 if q.dtype == torch.float32 else 2e-2
    if not err <= tol:
        raise ArithmeticError(f"decode attention {impl}: relative error {err:.2e} > {tol:.0e} vs the float64 reference")


def _report_impl(common, pk, impl, rows, B, K, d, b) -> dict:
    """Print one implementation's table and line fit; return the fit and marginal bandwidth."""
    fit = fit_line([r["kv_len"] for r in rows], [r["median_ns"] for r in rows]) if len(rows) >= 2 else None
    print(f"\n[{impl}]")
    table = [[r["kv_len"], f"{r['median_ns'] / 1e3:.2f}", f"{r['bytes'] / 1e6:.2f}", f"{r['achieved_gbps']:,.0f}",
              common.pct(r["achieved_gbps"] * 1e9, pk.copy_bytes_per_s),
              f"{(fit.intercept + fit.slope * r['kv_len']) / 1e3:.2f}" if fit else "-"] for r in rows]
    common.print_table(["kv_len", "ITL [us]", "K+V [MB]", "GB/s", "of copy peak", "fit [us]"], table)
    marginal = None
    if fit is not None:
        per_pos = 2 * B * K * d * b
        marginal = per_pos / fit.slope if fit.slope > 0 else None
        r2 = "n/a" if fit.r2 is None else f"{fit.r2:.4f}"
        mg = f"{marginal:,.0f} GB/s" if marginal else "n/a"
        print(f"fit: ITL = {fit.intercept / 1e3:.2f} us + {fit.slope:.4f} ns x kv_len  (R^2 = {r2}); "
              f"marginal bandwidth {mg} ({common.pct(marginal * 1e9 if marginal else None, pk.copy_bytes_per_s)} of copy peak)")
    return {"fit": asdict(fit) if fit else None, "marginal_gbps": marginal}
