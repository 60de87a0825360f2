"""``tracestory bench <workload>``: parse the options, call the workload in ``tracestory.bench``,
print its results next to the roofline and write them as JSON.

Workloads: ``llama``, ``attention-decode``, ``fp8``, ``moe`` (each a :class:`Workload`: its name,
help, options and a function from the parsed options to an exit code). Dtypes are given as
``bf16|fp16|fp32`` or the torch names ``bfloat16|float16|float32`` and printed by the short name.

Common flags: ``--json OUT`` (results), ``--device`` (auto/cpu/cuda[:i]), ``--profile``:

* ``torch``: the timed repetitions shrink to one (:func:`tracestory.bench.timer.set_single_iteration`)
  and torch.profiler records the first ``BENCHMARK`` region (warm-up and compilation stay out);
  the Chrome trace is written gzip-compressed to ``--profile-out``
  (default ``tracestory-bench-<name>.trace.json.gz``);
* ``nsys`` / ``ncu``: the same command is re-executed under the tool with the capture range
  bound to ``cudaProfilerStart/Stop``; the timer runs exactly one repetition between them.

``bench fp8`` also takes its older spellings ``--use-profiler`` (= ``--profile torch``) and
``--trace-out`` (= ``--profile-out``), hidden from the help and flagged as deprecated on stderr.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import outputs, telemetry
from ..bench import attention, common, fp8, llama, moe, timer
from ..bench.common import print_table, roofline_line
from ..bench.support import require, sm_version
from ..capture import region as _region
from ..capture.environment import external_profiler
from ..capture.torch import RangeController
from ..errors import ToolNotFound
from .common import refuse_overwrite
from ..models import llama_config
from ..models.llama_config import PRESETS as LLAMA_PRESETS
from ..models.llama_config import LlamaConfig


@dataclass(frozen=True)
class Workload:
    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    # flag checks that need no device, run before anything starts (one UsageError line)
    check: Callable[[argparse.Namespace], None] | None = None


# --------------------------------------------------------------------------- option types
def dtype_arg(text: str) -> str:
    try:
        return common.dtype_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_dtype(p: argparse.ArgumentParser, default: str, what: str) -> None:
    p.add_argument("--dtype", type=dtype_arg, default=default, metavar="{bf16,fp16,fp32}",
                   help=f"{what}; bfloat16, float16, float32 also accepted (default: {default})")


def parse_mnk(text: str) -> tuple[int, int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        m, n, k = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected M,N,K (three integers), got {text!r}") from None
    if min(m, n, k) <= 0:
        raise argparse.ArgumentTypeError(f"M,N,K must be positive, got {text!r}")
    return m, n, k


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _moe_precisions(text: str) -> list[str]:
    vals = [t.strip().lower() for t in text.split(",") if t.strip()]
    vals = ["bf16" if v == "bfloat16" else v for v in vals]
    bad = [v for v in vals if v not in moe.PRECISIONS]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"precisions are {', '.join(moe.PRECISIONS)}; got {text!r}")
    return vals


def _json_args(args) -> dict:
    return {k: v for k, v in vars(args).items() if k != "func"}


def _header(dev: common.BenchDevice) -> None:
    print(common.header(dev.info, dev.peaks))


# --------------------------------------------------------------------------- llama
def _llama_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="llama-3-8b", choices=sorted(LLAMA_PRESETS),
                   help="model shape (default: llama-3-8b)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers in the stack (default: 4)")
    p.add_argument("--phase", nargs="+", default=["decode"], choices=llama.PHASES,
                   help="phases to time (default: decode)")
    p.add_argument("--batch", type=int, default=1, help="sequences per call (default: 1)")
    p.add_argument("--seq", type=int, nargs="+", default=[512], help="prefill lengths (default: 512)")
    p.add_argument("--kv-len", type=int, nargs="+", default=[512], help="decode KV lengths (default: 512)")
    p.add_argument("--mode", nargs="+", default=["eager"], choices=llama.MODES,
                   help="eager and/or torch.compile (default: eager)")
    p.add_argument("--compile-mode", nargs="+", default=["default"], choices=llama.COMPILE_MODES,
                   help="torch.compile modes for --mode compile (default: default)")
    _add_dtype(p, "bf16", "weights, activations and KV cache")
    p.add_argument("--attention-backend", default="matmul", choices=llama.ATTENTION_BACKENDS,
                   help="attention: matmul (SDPA prefill, decode as two batched GEMMs, split in 256-key chunks "
                        "from 512 keys on; default), sdpa "
                        "(F.scaled_dot_product_attention), flex (FlexAttention: causal block mask for "
                        "prefill, its decoding kernel for decode)")
    p.add_argument("--decode-attention", dest="attention_backend", choices=llama.DECODE_ATTENTION,
                   help="older name of --attention-backend (matmul or sdpa)")
    p.add_argument("--sliding-window", type=int, default=None, metavar="W",
                   help="each query sees the W most recent keys, itself included (needs --attention-backend flex)")
    p.add_argument("--fp8", default="off", choices=llama.FP8_MODES,
                   help="FP8 e4m3 projections through torch._scaled_mm: weights quantised once, activations "
                        "per row (rowwise) or per tensor (tensorwise) at each call (default: off)")
    p.add_argument("--warmup-ms", type=float, default=100.0, help="warm-up time budget per case (default: 100)")
    p.add_argument("--rep-ms", type=float, default=300.0, help="timed repetitions' budget per case (default: 300)")


def _case_label(phase: str, batch: int, seq: int, kv_len: int | None) -> str:
    return f"{phase} B={batch} " + (f"kv={kv_len}" if phase == "decode" else f"S={seq}")


def _check_llama(args) -> None:
    llama.check_options(args.attention_backend, args.sliding_window, args.fp8)


def _run_llama(args) -> int:
    dev = common.open_device(args.device)
    cfg = LlamaConfig.from_name(args.preset)
    variants = llama.variants(args.mode, args.compile_mode)
    if args.fp8 != "off" and dev.device.startswith("cuda"):
        require("fp8", sm_version(dev.info.capability))
    _header(dev)
    roof = llama.measure_copy_roof(dev.device)
    if roof is not None:
        print(f"measured copy roof: {roof.bytes_per_s / 1e12:.3f} TB/s (device-to-device copy of "
              f"{roof.nbytes / 2 ** 30:.0f} GiB, read + written, best of {roof.reps}; median "
              f"{2 * roof.nbytes / roof.median_ns / 1e3:.3f} TB/s)"
              + (f"; datasheet {dev.peaks.copy_bytes_per_s / 1e12:.2f} TB/s" if dev.peaks.copy_bytes_per_s else ""))
    wbytes = llama_config.layer_weight_bytes(cfg, common.DTYPE_BYTES[args.dtype], args.fp8)
    window = f", sliding window {args.sliding_window}" if args.sliding_window else ""
    print(f"llama {cfg.name}: D={cfg.dim} H={cfg.n_heads} Hkv={cfg.n_kv_heads} d={cfg.head_dim} I={cfg.ffn_dim}; "
          f"{args.layers} layers, {wbytes / 1e6:,.1f} MB of weights per layer ({args.dtype}"
          f"{', fp8 ' + args.fp8 if args.fp8 != 'off' else ''}); attention {args.attention_backend}{window}")

    def show(c: llama.LlamaCase) -> None:
        line = roofline_line(c.median_ns, bytes_moved=c.bytes, flops=None if c.phase == "decode" else c.flops,
                             pk=dev.peaks)
        if c.measured_copy_fraction is not None:
            line += f", {100 * c.measured_copy_fraction:.1f}% of the measured copy roof"
        first = f"; first call {c.first_call_ns / 1e6:,.1f} ms" if c.first_call_ns is not None else ""
        print(f"{_case_label(c.phase, c.batch, c.seq, c.kv_len):<22} {c.variant:<24} {c.median_ns / 1e6:8.3f} ms  "
              f"{c.ms_per_layer:7.3f} ms/layer  {c.tokens_per_s:12,.0f} tok/s  {line}{first}"
              + (f"  {c.joules_per_token:.4g} J/tok" if c.joules_per_token is not None else ""))
        if c.timing.warning:
            print(f"  warning: {c.timing.warning}")

    results = llama.run_llama(cfg, dev, layers=args.layers, phases=args.phase, batch=args.batch, seqs=args.seq,
                              kv_lens=args.kv_len, variants=variants, dtype=args.dtype,
                              attention_backend=args.attention_backend, sliding_window=args.sliding_window,
                              fp8=args.fp8, copy_roof=roof, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                              on_case=show)
    keys = list(dict.fromkeys((r.phase, r.batch, r.seq, r.kv_len) for r in results))
    by = {(r.phase, r.batch, r.seq, r.kv_len, r.variant): r for r in results}
    rows = [[_case_label(*k)] + [f"{by[(*k, v)].median_ns / 1e6:.3f}" if (*k, v) in by else "-" for v in variants]
            for k in keys]
    print(f"\n{args.layers}-layer stack, median ms:")
    print_table(["case"] + [f"{v} [ms]" for v in variants], rows)
    common.write_json(args.json, {"bench": llama.NAME, "config": asdict(cfg), "device": asdict(dev.info),
                                  "peaks": asdict(dev.peaks), "args": _json_args(args),
                                  "results": [r.to_dict() for r in results],
                                  "copy_roof": roof.to_dict() if roof else None})
    return 0


# --------------------------------------------------------------------------- attention-decode
def _attention_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-len", type=int, nargs="+", default=None, help="KV lengths (default: 256..32768 doubling)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default: 1)")
    p.add_argument("--heads", type=int, default=32, help="query heads (default: 32)")
    p.add_argument("--gqa", type=int, default=4, help="query heads per KV head (default: 4, llama-3-8b)")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension (default: 128)")
    _add_dtype(p, "bf16", "q, K, V")
    p.add_argument("--impl", nargs="+", default=["sdpa", "matmul"], choices=attention.IMPLS,
                   help="sdpa: whichever backend torch picks; sdpa-flash: SDPA forced to FlashAttention; "
                        "matmul: two batched GEMMs (default: sdpa matmul)")
    p.add_argument("--no-flush", action="store_true", help="keep L2 warm between repetitions")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="warm-up time budget per length (default: 25)")
    p.add_argument("--rep-ms", type=float, default=100.0, help="timed repetitions' budget per length (default: 100)")


def _run_attention(args) -> int:
    dev = common.open_device(args.device)
    pk = dev.peaks
    _header(dev)
    print(f"decode attention: B={args.batch} H={args.heads} Hkv={args.heads // args.gqa if args.gqa else '?'} "
          f"d={args.head_dim} {args.dtype}, L2 flush {'off' if args.no_flush else 'on'}")

    def show(sw: attention.AttentionSweep) -> None:
        fit = sw.fit
        print(f"\n[{sw.impl}]")
        print_table(["kv_len", "ITL [us]", "K+V [MB]", "GB/s", "of copy peak", "fit [us]"],
                    [[p.kv_len, f"{p.median_ns / 1e3:.2f}", f"{p.bytes / 1e6:.2f}", f"{p.achieved_gbps:,.0f}",
                      common.pct(p.achieved_gbps * 1e9, pk.copy_bytes_per_s),
                      f"{(fit.intercept + fit.slope * p.kv_len) / 1e3:.2f}" if fit else "-"] for p in sw.points])
        if fit is not None:
            r2 = "n/a" if fit.r2 is None else f"{fit.r2:.4f}"
            mg = sw.marginal_gbps
            print(f"fit: ITL = {fit.intercept / 1e3:.2f} us + {fit.slope:.4f} ns x kv_len  (R^2 = {r2}); "
                  f"marginal bandwidth {f'{mg:,.0f} GB/s' if mg else 'n/a'} "
                  f"({common.pct(mg * 1e9 if mg else None, pk.copy_bytes_per_s)} of copy peak)")

    sweeps = attention.run_attention_decode(
        dev, kv_lens=args.kv_len, batch=args.batch, heads=args.heads, gqa=args.gqa, head_dim=args.head_dim,
        dtype=args.dtype, impls=args.impl, flush_l2=not args.no_flush, warmup_ms=args.warmup_ms,
        rep_ms=args.rep_ms, on_sweep=show)
    fits = {sw.impl: {"fit": asdict(sw.fit) if sw.fit else None, "marginal_gbps": sw.marginal_gbps} for sw in sweeps}
    first = fits[sweeps[0].impl]
    common.write_json(args.json, {
        "bench": attention.NAME, "device": asdict(dev.info), "peaks": asdict(pk), "args": _json_args(args),
        "results": [p.to_dict() for sw in sweeps for p in sw.points],
        "fits": fits, "fit": first["fit"], "marginal_gbps": first["marginal_gbps"]})
    return 0


# --------------------------------------------------------------------------- fp8
class _Deprecated(argparse.Action):
    """An older spelling: sets ``dest`` (to ``const`` for a flag) and says what replaces it."""

    def __init__(self, option_strings, dest, replacement: str, **kw):
        self.replacement = replacement
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"tracestory: {option_string} is deprecated, use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def _fp8_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--test-cases", default=None, metavar="SETS",
                   help="small, medium, large or all, comma separated (default: all)")
    p.add_argument("--custom", type=parse_mnk, action="append", metavar="M,N,K",
                   help="an extra case (repeatable); alone it replaces the preset sets")
    _add_dtype(p, "bf16", "dtype of A, W and the outputs")
    p.add_argument("--iterations", type=int, default=100, help="timed repetitions (default: 100)")
    p.add_argument("--no-fast-accum", dest="fast_accum", action="store_false",
                   help="exact fp32 accumulation in _scaled_mm (default: fast accumulation)")
    p.add_argument("--use-profiler", dest="profile", action=_Deprecated, nargs=0, const="torch",
                   replacement="--profile torch", help=argparse.SUPPRESS)
    p.add_argument("--trace-out", dest="profile_out", action=_Deprecated, replacement="--profile-out",
                   help=argparse.SUPPRESS)


def _fmt(v, scale=1.0, nd=3):
    return "-" if v is None else f"{v * scale:.{nd}f}"


def _run_fp8(args) -> int:
    cases = fp8.select_cases(args.test_cases, args.custom)
    setup = fp8.prepare_fp8(args.device)
    pk, dtype = setup.dev.peaks, args.dtype
    _header(setup.dev)
    if setup.mxfp8_gate:
        print(f"MXFP8 matmul skipped: {setup.mxfp8_gate} (the MXFP8 quantizer still runs)")

    def show(c: fp8.CaseResult) -> None:
        print(f"\n=== M={c.M}, N={c.N}, K={c.K} ({dtype}) ===")
        print(f"  copy of A: {c.copy_ns / 1e6:.4f} ms, {c.copy_gbps:,.0f} GB/s")
        for r in c.quant:
            if r.error:
                print(f"  quant {r.method:<10} FAILED: {r.error}")
            else:
                print(f"  quant {r.method:<10} {r.median_ns / 1e6:.4f} ms, {r.achieved_gbps:,.0f} GB/s "
                      f"({r.copy_fraction:.0%} of copy), reference match {1 - r.mismatch_fraction:.4%}")
        for r in c.matmul:
            if r.error:
                print(f"  matmul {r.method:<10} FAILED: {r.error}")
                continue
            line = (f"  matmul {r.method:<10} {r.matmul_ns / 1e6:.4f} ms, "
                    + roofline_line(r.matmul_ns, bytes_moved=None, flops=r.flops, pk=pk,
                                    dtype="bf16" if r.method == dtype else "fp8"))
            if r.e2e_ns:
                line += (f"; e2e {r.e2e_ns / 1e6:.4f} ms ({r.e2e_tflops:,.1f} TFLOP/s); "
                         f"{r.speedup_vs_baseline or float('nan'):.2f}x the {dtype} matmul; "
                         f"err {r.rel_err_vs_ref:.1e} (same operands), {r.rel_err_vs_fp32:.1e} (fp32)")
            print(line, flush=True)

    results = fp8.run_fp8(cases, dtype, args.iterations, setup=setup, fast_accum=args.fast_accum, on_case=show)
    print("\nSUMMARY: quantization (GB/s = bytes read once + written, over the median)")
    print_table(["M", "K", "quantizer", "time (ms)", "GB/s", "of copy"],
                [[c.M, c.K, q.method, _fmt(q.median_ns, 1e-6, 4), _fmt(q.achieved_gbps, 1, 0),
                  _fmt(q.copy_fraction, 100, 0) + "%" if q.copy_fraction else "-"] for c in results for q in c.quant])
    print(f"\nSUMMARY: matmuls (E2E = quantize A + FP8 matmul; vs {dtype} = {dtype} matmul time / matmul time)")
    print_table(["M", "N", "K", "method", "Quant (ms)", "Matmul (ms)", "E2E (ms)", "Matmul TFLOP/s", "E2E TFLOP/s",
                 f"vs {dtype}"],
                [[c.M, c.N, c.K, m.method, _fmt(m.quant_ns, 1e-6, 4), _fmt(m.matmul_ns, 1e-6, 4),
                  _fmt(m.e2e_ns, 1e-6, 4), _fmt(m.matmul_tflops, 1, 1), _fmt(m.e2e_tflops, 1, 1),
                  _fmt(m.speedup_vs_baseline, 1, 2)] for c in results for m in c.matmul])
    common.write_json(args.json, {"bench": fp8.NAME, "device": setup.dev.info, "peaks": pk,
                                  "mxfp8_gate": setup.mxfp8_gate, "dtype": dtype, "fast_accum": args.fast_accum,
                                  "iterations": args.iterations, "cases": results})
    return 1 if any(c.failed for c in results) else 0


# --------------------------------------------------------------------------- moe
def _moe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(moe.PRESETS),
                   help="layer shape (default: qwen3-30b-a3b: 128 experts, top-8, H 2048, I 768)")
    p.add_argument("--tokens", type=_int_list, default=[16, 4096], metavar="T[,T...]",
                   help="tokens per forward (default: 16,4096)")
    p.add_argument("--precision", type=_moe_precisions, default=list(moe.PRECISIONS), metavar="P[,P...]",
                   help="bf16, fp8, nvfp4 (default: all; unsupported ones are skipped with the reason)")
    p.add_argument("--gemm", default="loop", choices=("loop", "bmm"), help="grouped-GEMM strategy (default: loop)")
    p.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up time budget per case (default: 50)")
    p.add_argument("--rep-ms", type=float, default=300.0, help="timed repetitions' budget per case (default: 300)")
    p.add_argument("--seed", type=int, default=0, help="weight and input seed (default: 0)")
    p.add_argument("--no-amdahl", dest="amdahl", action="store_false",
                   help="skip the profiler run that measures the expert-GEMM share")


def _run_moe(args) -> int:
    dev = common.open_device(args.device)
    cfg = moe.PRESETS[args.preset]
    _header(dev)
    print(f"layer: {args.preset}: {cfg.num_experts} experts, top-{cfg.top_k}, hidden {cfg.hidden}, "
          f"expert intermediate {cfg.intermediate}; grouped GEMM: {args.gemm}")

    def show(r: moe.MoEResult) -> None:
        if r.amdahl_error:
            print(f"      Amdahl ceiling not measured: {r.amdahl_error}")
        extra = (f", expert GEMMs {r.expert_gemm_share:.0%} of stage time -> Amdahl ceiling "
                 f"{r.amdahl_max_speedup:.2f}x" if r.amdahl_max_speedup else "")
        print(f"{r.precision:>5} T={r.tokens:<6} {r.median_ns / 1e6:8.3f} ms  {r.tokens_per_s:12,.0f} tok/s  "
              f"{r.ms_per_token:.4f} ms/tok  (err vs fp32 {r.rel_err_vs_fp32:.1e}){extra}", flush=True)
        if r.timing_warning:
            print(f"      timer: {r.timing_warning}")

    run = moe.run_moe(cfg, dev, tokens=args.tokens, precisions=args.precision, gemm=args.gemm,
                      warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, seed=args.seed, amdahl_share=args.amdahl,
                      on_result=show)
    for prec, msg in run.skipped.items():
        print(f"{prec}: skipped: {msg}")
    if run.results:
        print("\nprecision comparison (latency of one layer forward; tok/s = T / median)")
        print_table(["precision", "gemm", "tokens", "avg (ms)", "min (ms)", "max (ms)", "median (ms)", "tok/s",
                     "ms/tok"],
                    [[r.precision, r.gemm, r.tokens, f"{r.mean_ns / 1e6:.3f}", f"{r.min_ns / 1e6:.3f}",
                      f"{r.max_ns / 1e6:.3f}", f"{r.median_ns / 1e6:.3f}", f"{r.tokens_per_s:,.0f}",
                      f"{r.ms_per_token:.4f}"] for r in run.results])
        rows = [[r.precision, r.tokens, f"{r.expert_gemm_share:.1%}", f"{r.amdahl_max_speedup:.2f}x"]
                for r in run.results if r.amdahl_max_speedup is not None]
        if rows:
            print("\nAmdahl ceiling of the expert GEMMs (max speedup = 1 / (1 - share))")
            print_table(["precision", "tokens", "expert_gemm share", "max speedup"], rows)
    common.write_json(args.json, {"bench": moe.NAME, "device": dev.info, "peaks": dev.peaks, "config": cfg,
                                  "preset": args.preset, "skipped": run.skipped, "results": run.results})
    return 0


WORKLOADS = (
    Workload(llama.NAME, llama.HELP, "A stack of Llama decoder layers (RoPE, grouped-query attention, SwiGLU): "
             "prefill and KV-cache decode, eager vs torch.compile, next to the copy and bf16 peaks.",
             _llama_arguments, _run_llama, _check_llama),
    Workload(attention.NAME, attention.HELP, "Decode attention (one query token) over a KV-length sweep, with the "
             "line fit ITL = a + b * kv_len and the achieved bandwidth against the copy peak.",
             _attention_arguments, _run_attention),
    Workload(fp8.NAME, fp8.HELP, "FP8 / MXFP8 quantization kernels (Triton) and torch._scaled_mm matmuls against "
             "the cuBLAS matmul in --dtype; every kernel is checked against a reference before it is timed.",
             _fp8_arguments, _run_fp8),
    Workload(moe.NAME, moe.HELP, "One MoE layer (Qwen3-30B-A3B's shape): router, permute, expert GEMMs and "
             "unpermute in BF16 and FP8, with the Amdahl ceiling of the expert GEMMs.",
             _moe_arguments, _run_moe),
)


# --------------------------------------------------------------------------- command
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="OUT", help="write results as JSON")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N (default: auto)")
    p.add_argument("--profile", choices=("torch", "nsys", "ncu"),
                   help="run under a profiler: torch records the first BENCHMARK region; nsys/ncu re-run the "
                        "command under the tool")
    p.add_argument("--profile-out", metavar="PATH",
                   help="trace/report path (torch: .trace.json.gz; nsys/ncu: output base name; "
                        "default: tracestory-bench-<workload>)")
    p.add_argument("--skip-power-monitor", action="store_true",
                   help="no GPU telemetry (by default NVML is sampled at 20 Hz while the bench runs, energy per "
                        "repetition is measured and, with --json OUT, OUT's stem + .telemetry.jsonl is written; "
                        "always off under ncu)")


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="built-in GPU workloads with roofline numbers",
                                  description="Built-in GPU workloads, each result next to its roofline.")
    sub = bench.add_subparsers(dest="bench", required=True, metavar="WORKLOAD")
    for w in WORKLOADS:
        p = sub.add_parser(w.name, help=w.help, description=w.description)
        w.add_arguments(p)
        _common(p)
        p.set_defaults(func=_runner(w))


def _runner(w: Workload):
    def run(args) -> int:
        """With ``--json -`` the JSON is stdout's only content: every printed line goes to stderr."""
        refuse_overwrite([], ("--json", args.json), ("--profile-out", getattr(args, "profile_out", None)))
        data = (args.json, getattr(args, "profile_out", None) if getattr(args, "profile", None) == "torch" else None)
        with outputs.prints_to_stderr(any(o and outputs.is_stdout(o) for o in data)):
            return _run(args)

    def _run(args) -> int:
        common.require_package("torch", f"tracestory bench {w.name}", "torch")
        _warn_without_gpu(w.name, getattr(args, "device", "auto"))
        if w.check is not None:
            w.check(args)
        prof = getattr(args, "profile", None)
        if prof in ("nsys", "ncu"):
            return _reexec(prof, w, args)
        with _telemetry(args) as sampler:
            rc = _run_torch_profiled(w, args) if prof == "torch" else int(w.run(args) or 0)
        if sampler is not None and sampler.path is not None:
            print(f"telemetry: {sampler.path} ({sampler.samples} samples at {sampler.rate_hz:g} Hz)")
        return rc

    return run


def _warn_without_gpu(name: str, device: str | None) -> None:
    """Say, before a long silence, that a GPU benchmark is about to run on the CPU (``--device auto``
    on a machine without CUDA); an explicit ``--device cpu`` asked for it and gets no line."""
    import torch

    if device in (None, "auto") and not torch.cuda.is_available():
        print(f"bench {name}: no CUDA GPU here: this is a GPU benchmark; on the CPU it can run for minutes and its "
              "numbers say nothing about a GPU (--device cpu runs it without this line)", file=sys.stderr)


def _telemetry(args):
    """The GPU telemetry sampler of one bench run (:func:`tracestory.telemetry.maybe_sampler`):
    off with --skip-power-monitor and under Nsight Compute (it disturbs ncu's clock control)."""
    path = None
    if args.json and args.json != "-":
        out = Path(args.json)
        path = out.with_name(out.name.removesuffix(".json") + ".telemetry.jsonl")
    on_cpu = getattr(args, "device", None) == "cpu"   # nothing to sample, nothing to say
    enabled = not args.skip_power_monitor and external_profiler() != "ncu" and not on_cpu
    return telemetry.maybe_sampler(path, enabled=enabled, label=f"bench {args.bench}")


def _run_torch_profiled(w: Workload, args) -> int:
    import torch

    out = Path(args.profile_out or f"tracestory-bench-{w.name}.trace.json.gz")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts, record_shapes=True)

    def stop():
        prof.stop()
        with outputs.atomic_path(out) as tmp:
            raw = tmp.with_name(tmp.name + ".raw.json")
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()

    ctl = RangeController("BENCHMARK", 0, 1, prof.start, stop)
    timer.set_single_iteration(True)
    _region.add_listener(ctl)
    try:
        rc = int(w.run(args) or 0)
    finally:
        ctl.finish()
        _region.remove_listener(ctl)
        timer.set_single_iteration(False)
    print(f"torch trace ({ctl.captured} BENCHMARK region): {out}" if ctl.captured else "no BENCHMARK region ran: no trace")
    return rc


_PROFILE_FLAGS = ("--profile", "--profile-out", "--trace-out")


def _strip_profile(argv: list[str]) -> list[str]:
    """``argv`` without the profiling options (the re-executed command must not profile again)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _PROFILE_FLAGS:
            skip = True
            continue
        if a == "--use-profiler" or a.startswith(tuple(f + "=" for f in _PROFILE_FLAGS)):
            continue
        out.append(a)
    return out


def profiler_argv(tool: str, out_base: str, bench_argv: list[str]) -> list[str]:
    """The command that re-runs ``tracestory bench ...`` under nsys or ncu."""
    me = [sys.executable, "-m", "tracestory.cli", *bench_argv]
    if tool == "nsys":
        return ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
                "--capture-range-end=stop", "--force-overwrite=true", "-o", out_base, *me]
    return ["ncu", "--profile-from-start", "off", "--set", "full", "--nvtx", "-f", "-o", out_base, *me]


def _reexec(tool: str, w: Workload, args) -> int:
    if shutil.which(tool) is None:
        raise ToolNotFound(tool, f"{tool} is not on PATH: install Nsight {'Systems' if tool == 'nsys' else 'Compute'}")
    argv = sys.argv[1:]
    i = argv.index("bench") if "bench" in argv else 0
    bench_argv = _strip_profile(argv[i:])
    out_base = args.profile_out or f"tracestory-bench-{w.name}"
    cmd = profiler_argv(tool, out_base, bench_argv)
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=dict(os.environ))
