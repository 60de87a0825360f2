"""``tracestory bench llama``: a stack of Llama decoder layers, prefill and KV-cache decode, eager
vs ``torch.compile`` (a testbench with RoPE and grouped-query attention).

The layers and their counted work are in :mod:`tracestory.models.llama_config` (formulas) and
:mod:`tracestory.models.llama` (modules). Per case (phase, batch, S or kv_len) and variant
(``eager`` or ``compile:<mode>``), :func:`run_llama` times one call of the stack with
:func:`tracestory.bench.timer.measure` and returns a :class:`LlamaCase`: "ms/layer" is the
stack's time over its layers; achieved GB/s (decode bytes) and TFLOP/s, with their share of the
device's copy and bf16 peaks.

Regions: ``BENCHMARK`` around the timed repetitions, ``prefill``/``decode`` around each call
(outside the compiled function: regions are Python).

Limits: random weights (timing only); no embedding/LM head; batch rows all have the same
kv_len; compile modes recompile per shape (``dynamic=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..models.llama_config import (  # noqa: F401  (re-exported: the bench's public names)
    DECODE_ATTENTION,
    PRESETS,
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
                "timing": self.timing.to_dict(with_samples=True)}


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
              variants: Sequence[str] = ("eager",), dtype: str = "bf16", decode_attention: str = "matmul",
              warmup_ms: float = 100.0, rep_ms: float = 300.0,
              on_case: Callable[[LlamaCase], None] | None = None) -> list[LlamaCase]:
    """Time every (case, variant): decode cases (one per kv_len) first, then prefill (one per S)."""
    import torch

    dtype = common.dtype_name(dtype)
    tdtype, dbytes = common.torch_dtype(dtype), common.DTYPE_BYTES[dtype]
    pk, device = dev.peaks, dev.device
    lens = [k + 1 for k in kv_lens] if "decode" in phases else []
    lens += list(seqs) if "prefill" in phases else []
    model = build_model(cfg, layers=layers, batch=batch, max_len=max(lens), device=device, dtype=tdtype,
                        decode_attention=decode_attention)
    cases = [("decode", batch, 1, kv) for kv in kv_lens] if "decode" in phases else []
    cases += [("prefill", batch, s, 0) for s in seqs] if "prefill" in phases else []
    gen = torch.Generator(device=device).manual_seed(1)
    results = []
    for phase, B, S, kv in cases:
        x = torch.randn(B, S, cfg.dim, device=device, dtype=tdtype, generator=gen)
        pos = kv if phase == "decode" else 0
        for variant in variants:
            with torch.inference_mode():
                res = _measure(model, x, pos, phase, variant, device, warmup_ms, rep_ms)
            t_ns = res.median_ns
            if phase == "decode":
                nbytes, flops = decode_bytes(cfg, B, kv, layers, dbytes), decode_flops(cfg, B, kv, layers)
            else:
                nbytes, flops = None, prefill_flops(cfg, B, S, layers)
            case = LlamaCase(
                phase, variant, B, S, kv if phase == "decode" else None, layers, res, nbytes, flops,
                (nbytes / t_ns * 1e9 / pk.copy_bytes_per_s) if nbytes and pk.copy_bytes_per_s else None,
                (flops / t_ns * 1e9 / pk.flops_per_s["bf16"]) if pk.flops_per_s.get("bf16") else None)
            results.append(case)
            if on_case is not None:
                on_case(case)
    return results


def _measure(model, x, pos, phase, variant, device, warmup_ms, rep_ms) -> TimingStats:
    import torch

    decode = phase == "decode"

    def step(x):
        return model(x, pos, decode)

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
            fn(x)

    return timer.measure(call, warmup_ms=warmup_ms, rep_ms=rep_ms, device=device,
                         before_each=before, region_name="BENCHMARK")
