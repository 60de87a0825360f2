"""``tracestory bench llama``: a stack of Llama decoder layers, prefill and KV-cache decode, eager
vs ``torch.compile`` (a testbench with RoPE and grouped-query attention), with an attention
backend (``sdpa``, ``matmul``, ``flex``) and FP8 projections (``off``, ``rowwise``,
``tensorwise``).

The layers and their counted work are in :mod:`tracestory.models.llama_config` (formulas) and
:mod:`tracestory.models.llama` (modules; FlexAttention in :mod:`tracestory.models.flex`, FP8 in
:mod:`tracestory.models.fp8`). Per case (phase, batch, S or kv_len) and variant (``eager`` or
``compile:<mode>``), :func:`run_llama` times one call of the stack with
:func:`tracestory.bench.timer.measure` and returns a :class:`LlamaCase`: "ms/layer" is the
stack's time over its layers; achieved GB/s (decode bytes, FP8 weights at 1 byte plus scales)
and TFLOP/s, with their share of the device's datasheet copy and bf16 peaks.

Measured roof: on CUDA, :func:`measure_copy_roof` times a device-to-device copy of a 1 GiB
tensor at the start of the run (bytes read + written over the best of several copies), and every
decode case also reports its share of that roof (``measured_copy_fraction``), the number the
decode goal is stated against.

First call: each (case, variant) is called once before the timer's warm-up, timed on the host
clock with a device synchronise; that time (``first_call_ms``) holds the compilation (of the
stack for ``compile`` variants, of the FlexAttention kernel for the ``flex`` backend) and is
never part of the timed repetitions. CUDA graphs of ``reduce-overhead`` are recorded during the
warm-up that follows.

Regions: ``BENCHMARK`` around the timed repetitions, ``prefill``/``decode`` around each call
(outside the compiled function: regions are Python).

Limits: random weights (timing only); no embedding/LM head; batch rows all have the same
kv_len; compile modes recompile per shape (``dynamic=False``); the copy roof is measured on CUDA
only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import UsageError
from ..models.llama_config import (  # noqa: F401  (re-exported: the bench's public names)
    ATTENTION_BACKENDS,
    DECODE_ATTENTION,
    FP8_MODES,
    PRESETS,
    SPLIT_KEYS,
    LlamaConfig,
    decode_bytes,
    decode_flops,
    layer_params,
    prefill_flops,
)
from . import common, timer
from .timer import TimingStats

NAME = "llama"
HELP = "Llama decoder layers: prefill and KV-cache decode, eager vs torch.compile"
PHASES = ("decode", "prefill")
MODES = ("eager", "compile")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
COPY_ROOF_BYTES = 1 << 30            # the tensor copied to measure the roof: 1 GiB
COPY_ROOF_REPS = 10


@dataclass(frozen=True)
class CopyRoof:
    """Device-to-device copy bandwidth measured in this run: ``2 * nbytes`` (read + written)
    over the best of ``reps`` copies timed with CUDA events."""

    bytes_per_s: float
    nbytes: int
    best_ns: float
    median_ns: float
    reps: int

    def to_dict(self) -> dict:
        return {"bytes_per_s": self.bytes_per_s, "nbytes": self.nbytes, "best_ns": self.best_ns,
                "median_ns": self.median_ns, "reps": self.reps}


def measure_copy_roof(device: str, nbytes: int = COPY_ROOF_BYTES, reps: int = COPY_ROOF_REPS) -> CopyRoof | None:
    """The measured copy roof on CUDA (class docstring); None on other devices."""
    import torch

    if not str(device).startswith("cuda"):
        return None
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):                                  # warm-up
        dst.copy_(src)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e6)           # ms -> ns
    del src, dst
    torch.cuda.empty_cache()
    times.sort()
    return CopyRoof(2 * nbytes / (times[0] * 1e-9), nbytes, times[0], times[len(times) // 2], reps)


@dataclass(frozen=True)
class LlamaCase:
    """One timed (case, variant) of the stack."""

    phase: str                        # decode | prefill
    variant: str                      # eager | compile:<mode>
    batch: int
    seq: int                          # tokens per sequence in the call (1 for decode)
    kv_len: int | None                # decode: keys already in the cache
    layers: int
    timing: TimingStats
    bytes: int | None                 # decode: weights + K/V read; prefill: None
    flops: int
    copy_peak_fraction: float | None
    bf16_peak_fraction: float | None
    attention_backend: str = "matmul"
    fp8: str = "off"
    sliding_window: int | None = None
    first_call_ns: float | None = None       # first call: compilation included, not in timing
    measured_copy_fraction: float | None = None   # achieved bytes/s over the copy roof of this run

    @property
    def median_ns(self) -> float:
        return self.timing.median_ns

    @property
    def ms_per_layer(self) -> float:
        return self.median_ns / 1e6 / self.layers

    @property
    def tokens_per_s(self) -> float:
        tokens = self.batch if self.phase == "decode" else self.batch * self.seq
        return tokens / (self.median_ns * 1e-9)

    @property
    def tokens_per_call(self) -> int:
        return self.batch if self.phase == "decode" else self.batch * self.seq

    @property
    def joules_per_token(self) -> float | None:
        """Energy of one call (NVML counter over the timed repetitions, see
        :mod:`tracestory.bench.timer`) over the tokens of one call; None without telemetry.
        Decode and prefill cases are separate cases, so each phase has its own value."""
        e = self.timing.energy_j_per_rep
        return e / self.tokens_per_call if e is not None and self.tokens_per_call else None

    @property
    def achieved_gbps(self) -> float | None:
        return self.bytes / self.median_ns if self.bytes else None

    @property
    def achieved_tflops(self) -> float:
        return self.flops / self.median_ns / 1e3

    def to_dict(self) -> dict:
        return {"phase": self.phase, "variant": self.variant, "batch": self.batch, "seq": self.seq,
                "kv_len": self.kv_len, "layers": self.layers, "median_ns": self.median_ns,
                "ms_per_layer": self.ms_per_layer, "tokens_per_s": self.tokens_per_s, "bytes": self.bytes,
                "flops": self.flops, "achieved_gbps": self.achieved_gbps, "achieved_tflops": self.achieved_tflops,
                "copy_peak_fraction": self.copy_peak_fraction, "bf16_peak_fraction": self.bf16_peak_fraction,
                "joules_per_token": self.joules_per_token,
                "timing": self.timing.to_dict(with_samples=True),
                "attention_backend": self.attention_backend, "fp8": self.fp8, "sliding_window": self.sliding_window,
                "first_call_ms": None if self.first_call_ns is None else self.first_call_ns / 1e6,
                "measured_copy_fraction": self.measured_copy_fraction}


def build_model(cfg: LlamaConfig, **kwargs):
    """:func:`tracestory.models.llama.build_model` (imports torch)."""
    from ..models import llama

    return llama.build_model(cfg, **kwargs)


def variants(modes: Sequence[str], compile_modes: Sequence[str]) -> list[str]:
    """``eager`` and ``compile:<mode>`` for each compile mode, in the order asked."""
    out = []
    for m in modes:
        out += ["eager"] if m == "eager" else [f"compile:{c}" for c in compile_modes]
    return out


def run_llama(cfg: LlamaConfig, dev: common.BenchDevice, *, layers: int = 4, phases: Sequence[str] = ("decode",),
              batch: int = 1, seqs: Sequence[int] = (512,), kv_lens: Sequence[int] = (512,),
              variants: Sequence[str] = ("eager",), dtype: str = "bf16", attention_backend: str | None = None,
              decode_attention: str | None = None, sliding_window: int | None = None, fp8: str = "off",
              copy_roof: CopyRoof | None = None, warmup_ms: float = 100.0, rep_ms: float = 300.0,
              on_case: Callable[[LlamaCase], None] | None = None) -> list[LlamaCase]:
    """Time every (case, variant): decode cases (one per kv_len) first, then prefill (one per S).

    ``attention_backend`` (``decode_attention`` is its older name), ``sliding_window`` and ``fp8``
    configure the layers (:func:`tracestory.models.llama.build_model`); ``copy_roof`` (from
    :func:`measure_copy_roof`) gives each decode case its ``measured_copy_fraction``."""
    import torch

    backend = attention_backend or decode_attention or "matmul"
    check_options(backend, sliding_window, fp8)
    dtype = common.dtype_name(dtype)
    tdtype, dbytes = common.torch_dtype(dtype), common.DTYPE_BYTES[dtype]
    pk, device = dev.peaks, dev.device
    lens = [k + 1 for k in kv_lens] if "decode" in phases else []
    lens += list(seqs) if "prefill" in phases else []
    capacity = -(-max(lens) // SPLIT_KEYS) * SPLIT_KEYS          # whole chunks for the split-KV decode
    model = build_model(cfg, layers=layers, batch=batch, max_len=capacity, device=device, dtype=tdtype,
                        attention_backend=backend, sliding_window=sliding_window, fp8_mode=fp8)
    cases = [("decode", batch, 1, kv) for kv in kv_lens] if "decode" in phases else []
    cases += [("prefill", batch, s, 0) for s in seqs] if "prefill" in phases else []
    gen = torch.Generator(device=device).manual_seed(1)
    results = []
    for phase, B, S, kv in cases:
        x = torch.randn(B, S, cfg.dim, device=device, dtype=tdtype, generator=gen)
        pos = kv if phase == "decode" else 0
        mask = model.prefill_block_mask(S) if phase == "prefill" else None
        for variant in variants:
            with torch.inference_mode():
                first_ns, res = _measure(model, x, pos, phase, variant, device, warmup_ms, rep_ms, mask)
            t_ns = res.median_ns
            if phase == "decode":
                nbytes = decode_bytes(cfg, B, kv, layers, dbytes, fp8=fp8, window=sliding_window)
                flops = decode_flops(cfg, B, kv, layers, window=sliding_window)
            else:
                nbytes, flops = None, prefill_flops(cfg, B, S, layers, window=sliding_window)
            case = LlamaCase(
                phase, variant, B, S, kv if phase == "decode" else None, layers, res, nbytes, flops,
                (nbytes / t_ns * 1e9 / pk.copy_bytes_per_s) if nbytes and pk.copy_bytes_per_s else None,
                (flops / t_ns * 1e9 / pk.flops_per_s["bf16"]) if pk.flops_per_s.get("bf16") else None,
                backend, fp8, sliding_window, first_ns,
                (nbytes / t_ns * 1e9 / copy_roof.bytes_per_s) if nbytes and copy_roof else None)
            results.append(case)
            if on_case is not None:
                on_case(case)
    return results


def check_options(attention_backend: str, sliding_window: int | None, fp8: str) -> None:
    """One :class:`UsageError` line for a backend, window or FP8 mode the layer cannot run."""
    if attention_backend not in ATTENTION_BACKENDS:
        raise UsageError(f"--attention-backend {attention_backend!r}: expected one of {', '.join(ATTENTION_BACKENDS)}")
    if fp8 not in FP8_MODES:
        raise UsageError(f"--fp8 {fp8!r}: expected one of {', '.join(FP8_MODES)}")
    if sliding_window is not None:
        if sliding_window < 1:
            raise UsageError(f"--sliding-window: expected a positive number of keys, found {sliding_window}")
        if attention_backend != "flex":
            raise UsageError(f"--sliding-window needs --attention-backend flex, found {attention_backend}")


def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _measure(model, x, pos, phase, variant, device, warmup_ms, rep_ms, mask=None) -> tuple[float, TimingStats]:
    """``(first call ns, timing of the repetitions after a warm-up)``."""
    import torch

    decode = phase == "decode"

    def step(x, mask):
        return model(x, pos, decode, mask)

    before = None
    if variant == "eager":
        fn = step
    else:
        mode = variant.split(":", 1)[1]
        fn = torch.compile(step, mode=None if mode == "default" else mode, dynamic=False)
        if mode == "reduce-overhead":
            before = torch.compiler.cudagraph_mark_step_begin

    def call():
        with common.region(phase):  # outside the compiled function: regions are Python
            fn(x, mask)

    _sync(device)
    t0 = time.perf_counter_ns()
    if before is not None:
        before()
    call()
    _sync(device)
    first_ns = float(time.perf_counter_ns() - t0)
    return first_ns, timer.measure(call, warmup_ms=warmup_ms, rep_ms=rep_ms, device=device,
                                   before_each=before, region_name="BENCHMARK")
