"""``tracestory bench moe``: one MoE layer (Qwen3-30B-A3B's shape) in BF16 and FP8 (nvFP4 gated).

Layer (``x: [T, H]`` tokens, ``E`` experts, top ``k``, expert intermediate ``I``)::

    router      logits = x @ Wr^T                 # [T, E]
                p = softmax(logits in fp32)       # [T, E]
                w, ids = topk(p, k)               # [T, k]; w /= sum(w) (Qwen3: norm_topk_prob)
    permute     order = stable argsort(ids.flat)  # [T*k] slots grouped by expert
                xs = x[order // k]                # [T*k, H]; counts[e] = tokens routed to e
    expert_gemm for each expert e with counts[e] > 0, on its rows xs_e:
                g, u = split(xs_e @ Wgu[e]^T)     # [n, 2I] -> two [n, I]
                ys_e = (silu(g) * u) @ Wd[e]^T    # [n, H]
    unpermute   y[order] = ys;  out = sum_j w[:, j] * y.view(T, k, H)[:, j]   # fp32 sum

Grouped GEMM choice: ``--gemm loop`` (default) loops over the experts that received tokens
and runs two dense GEMMs each: no padding FLOPs and exact for any routing, at the price of
~4 kernel launches per active expert (launch-bound at small T; that overhead is part of what
the Amdahl ceiling shows). ``--gemm bmm`` (BF16 only) pads every expert to the largest count
and runs two batched GEMMs: few launches, but it wastes ``E * max(counts) - T*k`` rows of work.

FP8: weights quantized once per output row (e4m3, fp32 scales); activations quantized per
token (row) before each GEMM with the Triton per-row kernel on CUDA (the torch reference on
CPU), then ``torch._scaled_mm`` with row-wise scales, bf16 out. nvFP4 needs SM100/103 (the
precision table of :mod:`tracestory.bench.support`); on such a GPU this bench says the nvFP4 path is not
implemented rather than measuring something else.

Each stage runs inside ``tracestory.region`` (``router``, ``permute``, ``expert_gemm``,
``unpermute``) so the ``moe`` taxonomy and NVTX-aware tools can attribute kernels; the timed
repetitions run inside ``BENCHMARK``. Reported per (precision, T): latency (median, mean, min,
max), tokens/s = T / latency, ms/token = latency / T. The Amdahl ceiling comes from a short
torch.profiler run: ``share = GPU time of kernels launched in expert_gemm / GPU time of all
four stages``, ``max speedup = 1 / (1 - share)`` from infinitely fast expert GEMMs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

from ..errors import TracestoryError, UsageError
from . import common
from .fp8 import ref_quantize_per_row
from .support import sm_version, unsupported_message
from .timer import measure

NAME = "moe"
HELP = "MoE layer (Qwen3-30B-A3B shape): router/permute/expert GEMMs/unpermute, BF16 vs FP8"
STAGES = ("router", "permute", "expert_gemm", "unpermute")
PRECISIONS = ("bf16", "fp8", "nvfp4")


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int = 128
    top_k: int = 8
    hidden: int = 2048
    intermediate: int = 768
    norm_topk_prob: bool = True


PRESETS = {
    "qwen3-30b-a3b": MoEConfig(),
    "tiny": MoEConfig(num_experts=8, top_k=2, hidden=64, intermediate=32),
}


@dataclass(frozen=True)
class MoEWeights:
    """``router [E, H]``, ``gate_up [E, 2I, H]`` (gate rows first), ``down [E, H, I]``. For FP8,
    ``gate_up``/``down`` are e4m3 and ``*_scale`` hold per-row fp32 scales ``[E, 1, rows]``."""

    router: object
    gate_up: object
    down: object
    gate_up_scale: object = None
    down_scale: object = None

    @property
    def fp8(self) -> bool:
        return self.gate_up_scale is not None


@dataclass(frozen=True)
class MoEResult:
    precision: str
    gemm: str
    tokens: int
    median_ns: float
    mean_ns: float
    min_ns: float
    max_ns: float
    tokens_per_s: float
    ms_per_token: float
    expert_gemm_share: float | None       # of the GPU time of the four stages
    amdahl_max_speedup: float | None      # 1 / (1 - share)
    rel_err_vs_fp32: float | None = None  # checked output against the fp32 reference
    amdahl_error: str | None = None       # why the share was not measured (profiler failure)
    timing_warning: str | None = None     # the timer's spread warning


@dataclass(frozen=True)
class MoERun:
    """Every measured (precision, T), and the precisions skipped with the reason."""

    results: tuple[MoEResult, ...]
    skipped: dict[str, str] = field(default_factory=dict)


def make_weights(cfg: MoEConfig, dtype, device, seed: int = 0) -> MoEWeights:
    """Gaussian weights scaled by 1/sqrt(fan_in), so activations stay O(1)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    E, H, I = cfg.num_experts, cfg.hidden, cfg.intermediate

    def rnd(*shape, fan_in):
        return (torch.randn(shape, generator=g, dtype=torch.float32) * fan_in ** -0.5).to(device=device, dtype=dtype)

    return MoEWeights(rnd(E, H, fan_in=H), rnd(E, 2 * I, H, fan_in=H), rnd(E, H, I, fan_in=I))


def _quant_rows(x):
    """Per-row e4m3 quantization: the Triton kernel on CUDA, the torch reference elsewhere."""
    if x.is_cuda:
        from ..models.quant_triton import quantize_per_row   # imports triton

        return quantize_per_row(x)
    return ref_quantize_per_row(x)


def quantize_weights_fp8(w: MoEWeights) -> MoEWeights:
    """Row-wise (per output channel) FP8 copies of the expert weights; the router stays as is."""
    import torch

    def q(stack):
        qs, ss = [], []
        for e in range(stack.shape[0]):
            qe, se = _quant_rows(stack[e].contiguous())
            qs.append(qe)
            ss.append(se.reshape(1, -1))
        return torch.stack(qs), torch.stack(ss)

    gu, gus = q(w.gate_up)
    dn, dns = q(w.down)
    return MoEWeights(w.router, gu, dn, gus, dns)


def _acc(t):
    """fp32 for 16-bit tensors (softmax and the weighted sum), the tensor's own dtype otherwise."""
    return t.float() if t.element_size() < 4 else t


def route(x, router_w, cfg: MoEConfig):
    """-> ``(topw [T, k] fp32 (fp64 for fp64 inputs), topi [T, k] int64)``."""
    import torch

    probs = torch.softmax(_acc(x @ router_w.t()), dim=-1)
    topw, topi = torch.topk(probs, cfg.top_k, dim=-1)
    if cfg.norm_topk_prob:
        topw = topw / topw.sum(dim=-1, keepdim=True)
    return topw, topi


def permute(x, topi, num_experts: int):
    """-> ``(xs [T*k, H] grouped by expert, order [T*k], counts list[int])``."""
    import torch

    flat = topi.reshape(-1)
    order = torch.argsort(flat, stable=True)
    xs = x[order // topi.shape[1]]
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # host sync: the loop needs it
    return xs, order, counts


def _linear(a, w, scale, e):
    """``a @ w[e]^T``; FP8 weights: quantize ``a`` per row and use row-wise ``_scaled_mm``."""
    import torch

    if scale is None:
        return a @ w[e].t()
    qa, sa = _quant_rows(a)
    return torch._scaled_mm(qa, w[e].t(), scale_a=sa, scale_b=scale[e], out_dtype=torch.bfloat16)


def experts_loop(xs, counts, w: MoEWeights, cfg: MoEConfig):
    import torch

    I = cfg.intermediate
    out = torch.empty((xs.shape[0], cfg.hidden), dtype=torch.bfloat16 if w.fp8 else xs.dtype,
                      device=xs.device)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = xs[start:start + n]
        h = _linear(rows, w.gate_up, w.gate_up_scale, e)                    # [n, 2I]
        a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]                    # [n, I]
        out[start:start + n] = _linear(a.contiguous(), w.down, w.down_scale, e)  # [n, H]
        start += n
    return out


def experts_bmm(xs, counts, w: MoEWeights, cfg: MoEConfig):
    import torch

    if w.fp8:
        raise UsageError("--gemm bmm is BF16 only (torch has no batched _scaled_mm); use --gemm loop")
    E, I = cfg.num_experts, cfg.intermediate
    cnt = torch.tensor(counts, device=xs.device)
    cap = max(max(counts), 1)
    expert_of = torch.repeat_interleave(torch.arange(E, device=xs.device), cnt)    # [T*k]
    pos = torch.arange(xs.shape[0], device=xs.device) - (torch.cumsum(cnt, 0) - cnt)[expert_of]
    padded = xs.new_zeros((E, cap, xs.shape[1]))                                  # [E, cap, H]
    padded[expert_of, pos] = xs
    h = torch.bmm(padded, w.gate_up.transpose(1, 2))                              # [E, cap, 2I]
    a = torch.nn.functional.silu(h[..., :I]) * h[..., I:]                         # [E, cap, I]
    y = torch.bmm(a, w.down.transpose(1, 2))                                      # [E, cap, H]
    return y[expert_of, pos]


def unpermute(ys, order, topw):
    """-> ``[T, H]``: each token's k expert outputs weighted by its routing weights (fp32 sum)."""
    import torch

    T, k = topw.shape
    y = torch.empty_like(ys)
    y[order] = ys
    return (_acc(y.view(T, k, -1)) * topw[..., None]).sum(dim=1)


def moe_forward(x, w: MoEWeights, cfg: MoEConfig, gemm: str = "loop", region=None):
    """The layer (module docstring); ``region(name)`` context managers mark the four stages.
    Returns ``[T, H]`` in ``x``'s dtype."""
    reg = region or (lambda name: nullcontext())
    with reg("router"):
        topw, topi = route(x, w.router, cfg)
    with reg("permute"):
        xs, order, counts = permute(x, topi, cfg.num_experts)
    with reg("expert_gemm"):
        ys = (experts_bmm if gemm == "bmm" else experts_loop)(xs, counts, w, cfg)
    with reg("unpermute"):
        out = unpermute(ys, order, topw)
    return out.to(x.dtype)


# --------------------------------------------------------------------------- run
def stage_times_us(fn, iterations: int = 3) -> dict[str, float] | None:
    """Run ``fn`` under torch.profiler; per stage region, the device time (us) of the kernels
    launched inside it (on CUDA), or its CPU time (on a CPU run). ``None`` when a profiler is
    already recording (``--profile torch``), since profilers do not nest."""
    import torch

    if torch.autograd._profiler_enabled():
        return None
    cuda = torch.cuda.is_available()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iterations):
            fn()
        if cuda:
            torch.cuda.synchronize()
    times = {s: 0.0 for s in STAGES}
    for ev in prof.events():
        # The CPU-side annotation; its device_time_total sums the kernels of all ops inside it.
        if ev.name in times and ev.device_type == torch.autograd.DeviceType.CPU:
            times[ev.name] += float(ev.device_time_total if cuda else ev.cpu_time_total)
    return times


def amdahl(times: dict[str, float] | None) -> tuple[float | None, float | None]:
    """``(expert_gemm share, 1 / (1 - share))``; ``None`` where not measurable."""
    if not times:
        return None, None
    total = sum(times.values())
    if total <= 0:
        return None, None
    share = times["expert_gemm"] / total
    return share, (1.0 / (1.0 - share) if share < 1.0 else None)


def same_routing(x, w: MoEWeights, ref_w: MoEWeights, cfg: MoEConfig):
    """Tokens whose top-k expert set is the same in the tested precision and the fp32 reference.

    Top-k routing is discontinuous: a near-tie among the router logits can pick a different
    expert after bf16 rounding, which changes that token's output by O(1) while being correct
    behaviour. The numerical check compares only tokens routed identically (and bounds how many
    are not)."""
    a = route(x, w.router, cfg)[1].sort(dim=-1).values
    b = route(x.float(), ref_w.router, cfg)[1].sort(dim=-1).values
    return (a == b).all(dim=-1)


def _check(out, ref, precision: str, same=None) -> float:
    if same is not None:
        if float(same.float().mean()) < 0.9:
            raise TracestoryError(f"bench moe: {precision} routes {1 - float(same.float().mean()):.1%} of tokens "
                                  "differently from the fp32 reference (expected < 10%)")
        out, ref = out[same], ref[same]
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    bound = 0.25 if precision == "fp8" else 2e-2
    if not err < bound:
        raise TracestoryError(f"bench moe: {precision} output off the fp32 reference by {err:.2e} "
                              f"(relative Frobenius; expected < {bound})")
    return err


def _gate(prec: str, sm: int | None) -> str | None:
    if prec == "bf16":
        return None if sm is None else unsupported_message("bf16", sm)
    if sm is None:
        # torch's CPU _scaled_mm runs row-wise FP8, so fp8 works on a CPU (slowly); nvFP4 does not.
        return None if prec == "fp8" else "nvFP4 needs data-center Blackwell (SM100 or SM103); this device is a CPU"
    msg = unsupported_message(prec, sm)
    if msg is None and prec == "nvfp4":
        msg = "nvFP4 expert GEMMs are not implemented in this bench yet (the GPU supports them)"
    return msg


def run_moe(cfg: MoEConfig, dev: common.BenchDevice, *, tokens: Sequence[int] = (16, 4096),
            precisions: Sequence[str] = PRECISIONS, gemm: str = "loop", warmup_ms: float = 50.0,
            rep_ms: float = 300.0, seed: int = 0, amdahl_share: bool = True,
            on_result: Callable[[MoEResult], None] | None = None) -> MoERun:
    """Check each (precision, T) against the fp32 reference, time it, and (at the largest T)
    measure the expert-GEMM share; precisions the device or bench cannot run are skipped."""
    import torch

    device = dev.device
    sm = sm_version(dev.info.capability) if dev.info.capability else None
    base = make_weights(cfg, torch.bfloat16, device, seed)
    ref_w = MoEWeights(*(t.float() for t in (base.router, base.gate_up, base.down)))
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    xs = {T: torch.randn((T, cfg.hidden), generator=g).to(device=device, dtype=torch.bfloat16) for T in tokens}
    refs = {T: moe_forward(x.float(), ref_w, cfg) for T, x in xs.items()}
    results, skipped = [], {}
    for prec in precisions:
        msg = _gate(prec, sm)
        if msg is None and prec == "fp8" and gemm == "bmm":
            msg = "--gemm bmm is BF16 only (no batched _scaled_mm); run fp8 with --gemm loop"
        if msg:
            skipped[prec] = msg
            continue
        w = base if prec == "bf16" else quantize_weights_fp8(base)
        for T in tokens:
            x = xs[T]

            def fwd(x=x, w=w):
                return moe_forward(x, w, cfg, gemm, region=common.region)

            err = _check(fwd(), refs[T], prec, same_routing(x, w, ref_w, cfg))
            with common.region("BENCHMARK"):
                st = measure(fwd, warmup_ms=warmup_ms, rep_ms=rep_ms)
            share, ceiling, why = None, None, None
            if amdahl_share and T == max(tokens):
                try:
                    share, ceiling = amdahl(stage_times_us(fwd))
                except Exception as e:  # noqa: BLE001  (profiler API drift must not lose the timings)
                    why = f"{type(e).__name__}: {e}"
            r = MoEResult(prec, gemm, T, st.median_ns, st.mean_ns, st.min_ns, st.max_ns,
                          T / (st.median_ns * 1e-9), st.median_ns / 1e6 / T, share, ceiling, err, why, st.warning)
            results.append(r)
            if on_result is not None:
                on_result(r)
        del w
    return MoERun(tuple(results), skipped)
