"""``tracestory bench llama``: a minimal Llama decoder layer, prefill and KV-cache decode, eager vs
``torch.compile`` (seed 001's testbench, with RoPE and grouped-query attention added).

Layer (per decoder layer, pre-norm, as in Llama 2/3)::

    h   = x + Wo · SDPA(RoPE(Wq · n1(x)), RoPE(Wk · n1(x)), Wv · n1(x))      n = RMSNorm
    out = h + Wd · (silu(Wg · n2(h)) * (Wu · n2(h)))                          SwiGLU MLP

Shapes: D = dim, H query heads, Hkv key/value heads (GQA: query head h uses kv head
h // (H/Hkv)), d = D/H head dim, I = MLP width. RMSNorm and RoPE are computed in (at least) float32
and cast back (as Hugging Face does). RoPE uses the rotate-half convention, theta from the preset.

Decode: one new token per sequence; its K/V are written at position ``kv_len`` of a
preallocated cache (filled with random values, never zeros), and attention reads positions
``0..kv_len`` (kv_len + 1 keys). The H query heads are folded into Hkv groups of H/Hkv rows
(``[B, Hkv, H/Hkv, d]``), which is exact for a single query token and lets SDPA use its flash
kernel without copying K/V per query head.

Counted work (``dtype_bytes`` = 2 for bf16), all per layer unless stated:

* weights ``P = D·H·d + 2·D·Hkv·d + H·d·D + 3·D·I + 2·D`` parameters (q, k, v, o, gate/up/down,
  two norm weights);
* decode bytes ``= P·b + 2·B·(kv_len+1)·Hkv·d·b`` (every weight read once, K and V read over
  kv_len+1 positions); activations (a few KB) are ignored;
* prefill FLOPs ``= 2·(P - 2·D)·B·S + 2·B·H·d·S²`` (matmul FLOPs, plus QKᵀ and PV with the
  causal half of the S×S scores counted: 2 matmuls × 2 FLOP × S²/2 × d per head).

Times from :mod:`tracestory.bench.timer`; "ms/layer" is the stack's time over ``--layers``.
Achieved GB/s (decode) and TFLOP/s (prefill) are printed against the measured peaks.
Regions: ``BENCHMARK`` around the timed repetitions, ``prefill``/``decode`` around each call.

Limits: random weights (timing only); no embedding/LM head; batch rows all have the same
kv_len; compile modes recompile per shape (``dynamic=False``).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

NAME = "llama"
HELP = "Llama decoder layer: prefill and KV-cache decode, eager vs torch.compile"


@dataclass(frozen=True)
class LlamaConfig:
    name: str
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_name(cls, name: str) -> LlamaConfig:
        try:
            return PRESETS[name]
        except KeyError:
            from ..errors import UsageError

            raise UsageError(f"unknown llama preset {name!r}: expected one of {', '.join(PRESETS)}") from None


PRESETS = {
    "llama-2-7b": LlamaConfig("llama-2-7b", 4096, 32, 32, 11008, 10000.0, 1e-5),
    "llama-3-8b": LlamaConfig("llama-3-8b", 4096, 32, 8, 14336, 500000.0, 1e-5),
    "tiny": LlamaConfig("tiny", 64, 4, 2, 160, 10000.0, 1e-5),
}


# --------------------------------------------------------------------------- counted work
def layer_params(cfg: LlamaConfig) -> int:
    D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    return D * H * d + 2 * D * K * d + H * d * D + 3 * D * I + 2 * D


def decode_bytes(cfg: LlamaConfig, batch: int, kv_len: int, layers: int = 1, dtype_bytes: int = 2) -> int:
    kv = 2 * batch * (kv_len + 1) * cfg.n_kv_heads * cfg.head_dim * dtype_bytes
    return layers * (layer_params(cfg) * dtype_bytes + kv)


def prefill_flops(cfg: LlamaConfig, batch: int, seq: int, layers: int = 1) -> int:
    matmul = 2 * (layer_params(cfg) - 2 * cfg.dim) * batch * seq
    attn = 2 * batch * cfg.n_heads * cfg.head_dim * seq * seq
    return layers * (matmul + attn)


def decode_flops(cfg: LlamaConfig, batch: int, kv_len: int, layers: int = 1) -> int:
    """2 FLOPs per weight per token plus QKᵀ and PV over kv_len+1 keys."""
    matmul = 2 * (layer_params(cfg) - 2 * cfg.dim) * batch
    attn = 4 * batch * cfg.n_heads * cfg.head_dim * (kv_len + 1)
    return layers * (matmul + attn)


# --------------------------------------------------------------------------- model (torch)
_CLASSES = None


def _classes():
    """Define the nn.Modules on first use, so importing this module does not import torch."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    import torch
    import torch.nn.functional as F
    from torch import nn

    def rms_norm(x, w, eps):
        # x: [B, S, D]; statistics in at least float32, as in the reference models
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * w.to(y.dtype)).to(x.dtype)

    def rope(x, cos, sin):
        # x: [B, h, S, d]; cos/sin: [S, d]
        d2 = x.shape[-1] // 2
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rot = torch.cat((-xf[..., d2:], xf[..., :d2]), dim=-1)
        return (xf * cos + rot * sin).to(x.dtype)

    def sdpa_gqa_causal(q, k, v):
        # q: [B, H, S, d]; k, v: [B, Hkv, S, d]
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        except TypeError:  # torch < 2.5 has no enable_gqa
            g = q.shape[1] // k.shape[1]
            return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                  is_causal=True)

    def decode_attention_matmul(qg, k, v):
        # qg: [B, Hkv, G, d] (the G query heads of each KV head, one token); k, v: [B, Hkv, L, d].
        # Two batched GEMMs with M = G read K and V once each: the memory-bound shape of decode.
        # (SDPA on Hopper picks cuDNN's prefill kernel here, 64-row query tiles for G rows:
        # ~0.3 TB/s on the H200, see docs/BENCHMARKS.md.)
        s = torch.matmul(qg, k.transpose(-1, -2)) * qg.shape[-1] ** -0.5
        p = torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1).to(qg.dtype)
        return torch.matmul(p, v)

    class Layer(nn.Module):
        def __init__(self, cfg, batch, max_len, device, dtype, gen, decode_attention="matmul"):
            super().__init__()
            D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
            self.cfg = cfg
            self.decode_attention = decode_attention

            def w(out_f, in_f):
                # nn.Linear layout [out, in], scaled so activations stay O(1)
                t = torch.randn(out_f, in_f, generator=gen, device="cpu", dtype=torch.float32) / in_f ** 0.5
                return nn.Parameter(t.to(device=device, dtype=dtype), requires_grad=False)

            self.wq, self.wk, self.wv, self.wo = w(H * d, D), w(K * d, D), w(K * d, D), w(D, H * d)
            self.wg, self.wu, self.wd = w(I, D), w(I, D), w(D, I)
            self.n1 = nn.Parameter((1 + 0.1 * torch.randn(D, generator=gen)).to(device, dtype), requires_grad=False)
            self.n2 = nn.Parameter((1 + 0.1 * torch.randn(D, generator=gen)).to(device, dtype), requires_grad=False)
            # KV cache: [B, Hkv, max_len, d], random so decode never reads zeros
            self.register_buffer("k_cache", torch.randn(batch, K, max_len, d, generator=gen).to(device, dtype))
            self.register_buffer("v_cache", torch.randn(batch, K, max_len, d, generator=gen).to(device, dtype))

        def forward(self, x, cos, sin, pos: int, decode: bool):
            # x: [B, S, D]; cos, sin: [S, d] for positions pos..pos+S-1
            cfg = self.cfg
            B, S, D = x.shape
            H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            a = rms_norm(x, self.n1, cfg.norm_eps)
            q = F.linear(a, self.wq).view(B, S, H, d).transpose(1, 2)    # [B, H, S, d]
            k = F.linear(a, self.wk).view(B, S, K, d).transpose(1, 2)    # [B, Hkv, S, d]
            v = F.linear(a, self.wv).view(B, S, K, d).transpose(1, 2)    # [B, Hkv, S, d]
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            self.k_cache[:, :, pos:pos + S] = k
            self.v_cache[:, :, pos:pos + S] = v
            if decode:
                L = pos + S                                               # keys 0..pos
                qg = q.reshape(B, K, cfg.group * S, d)                     # [B, Hkv, H/Hkv, d] (S == 1)
                kk, vv = self.k_cache[:, :, :L], self.v_cache[:, :, :L]
                if self.decode_attention == "sdpa":
                    o = F.scaled_dot_product_attention(qg, kk, vv)
                else:
                    o = decode_attention_matmul(qg, kk, vv)
                o = o.reshape(B, H, S, d)
            else:
                o = sdpa_gqa_causal(q, k, v)                              # [B, H, S, d]
            h = x + F.linear(o.transpose(1, 2).reshape(B, S, H * d), self.wo)
            m = rms_norm(h, self.n2, cfg.norm_eps)
            return h + F.linear(F.silu(F.linear(m, self.wg)) * F.linear(m, self.wu), self.wd)

    class Stack(nn.Module):
        """``layers`` decoder layers sharing one RoPE table."""

        def __init__(self, cfg, layers, batch, max_len, device, dtype, seed, decode_attention="matmul"):
            super().__init__()
            gen = torch.Generator().manual_seed(seed)
            self.cfg = cfg
            self.layers = nn.ModuleList(Layer(cfg, batch, max_len, device, dtype, gen, decode_attention)
                                        for _ in range(layers))
            d = cfg.head_dim
            inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
            ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
            ang = torch.cat((ang, ang), dim=-1)                            # [max_len, d]
            tdt = torch.promote_types(dtype, torch.float32)  # float32 tables, float64 for a float64 model
            self.register_buffer("cos", ang.cos().to(device, tdt))
            self.register_buffer("sin", ang.sin().to(device, tdt))

        def forward(self, x, pos: int = 0, decode: bool = False):
            S = x.shape[1]
            cos, sin = self.cos[pos:pos + S], self.sin[pos:pos + S]
            for layer in self.layers:
                x = layer(x, cos, sin, pos, decode)
            return x

    _CLASSES = (Layer, Stack, rms_norm, rope)
    return _CLASSES


def build_model(cfg: LlamaConfig, *, layers: int = 1, batch: int = 1, max_len: int = 128,
                device: str = "cpu", dtype=None, seed: int = 0, decode_attention: str = "matmul"):
    """A :class:`Stack` of ``layers`` random-weight layers with KV caches of ``max_len``.

    ``decode_attention``: ``matmul`` (two batched GEMMs per KV head group) or ``sdpa``
    (``F.scaled_dot_product_attention``, whichever backend torch picks)."""
    import torch

    _, Stack, _, _ = _classes()
    return Stack(cfg, layers, batch, max_len, device, dtype or torch.float32, seed, decode_attention).eval()


# --------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="llama-3-8b", choices=sorted(PRESETS), help="model shape (default: llama-3-8b)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers in the stack (default: 4)")
    p.add_argument("--phase", nargs="+", default=["decode"], choices=("decode", "prefill"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, nargs="+", default=[512], help="prefill lengths (default: 512)")
    p.add_argument("--kv-len", type=int, nargs="+", default=[512], help="decode KV lengths (default: 512)")
    p.add_argument("--mode", nargs="+", default=["eager"], choices=("eager", "compile"))
    p.add_argument("--compile-mode", nargs="+", default=["default"],
                   choices=("default", "reduce-overhead", "max-autotune"))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--decode-attention", default="matmul", choices=("matmul", "sdpa"),
                   help="decode attention: two batched GEMMs (default) or F.scaled_dot_product_attention")
    p.add_argument("--warmup-ms", type=float, default=100.0)
    p.add_argument("--rep-ms", type=float, default=300.0)


def _variants(args) -> list[str]:
    out = []
    for m in args.mode:
        out += ["eager"] if m == "eager" else [f"compile:{c}" for c in args.compile_mode]
    return out


def main(args) -> int:
    import torch

    from . import common, timer

    dev = common.resolve_device(getattr(args, "device", None))
    info = common.device_info(dev)
    pk = common.peaks(info)
    cfg = LlamaConfig.from_name(args.preset)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dbytes = torch.tensor([], dtype=dtype).element_size()
    lens = [k + 1 for k in args.kv_len] if "decode" in args.phase else []
    lens += list(args.seq) if "prefill" in args.phase else []
    max_len = max(lens)
    model = build_model(cfg, layers=args.layers, batch=args.batch, max_len=max_len, device=dev, dtype=dtype,
                        decode_attention=getattr(args, "decode_attention", "matmul"))
    print(common.header(info, pk))
    print(f"llama {cfg.name}: D={cfg.dim} H={cfg.n_heads} Hkv={cfg.n_kv_heads} d={cfg.head_dim} I={cfg.ffn_dim}; "
          f"{args.layers} layers, {layer_params(cfg) * dbytes / 1e6:,.1f} MB of weights per layer ({args.dtype})")
    cases = []
    if "decode" in args.phase:
        cases += [("decode", args.batch, 1, kv) for kv in args.kv_len]
    if "prefill" in args.phase:
        cases += [("prefill", args.batch, s, 0) for s in args.seq]
    gen = torch.Generator(device=dev).manual_seed(1)
    results = []
    for phase, B, S, kv in cases:
        x = torch.randn(B, S, cfg.dim, device=dev, dtype=dtype, generator=gen)
        pos = kv if phase == "decode" else 0
        for variant in _variants(args):
            with torch.inference_mode():
                res = _run_case(torch, common, timer, model, x, pos, phase, variant, args, dev)
            t_ns = res.median_ns
            if phase == "decode":
                nbytes, flops = decode_bytes(cfg, B, kv, args.layers, dbytes), decode_flops(cfg, B, kv, args.layers)
                tokens = B
            else:
                nbytes, flops = None, prefill_flops(cfg, B, S, args.layers)
                tokens = B * S
            row = {"phase": phase, "variant": variant, "batch": B, "seq": S, "kv_len": kv if phase == "decode" else None,
                   "layers": args.layers, "median_ns": t_ns, "ms_per_layer": t_ns / 1e6 / args.layers,
                   "tokens_per_s": tokens / (t_ns * 1e-9), "bytes": nbytes, "flops": flops,
                   "achieved_gbps": nbytes / t_ns if nbytes else None,
                   "achieved_tflops": flops / t_ns / 1e3,
                   "copy_peak_fraction": (nbytes / t_ns * 1e9 / pk.copy_bytes_per_s) if nbytes and pk.copy_bytes_per_s else None,
                   "bf16_peak_fraction": (flops / t_ns * 1e9 / pk.flops_per_s["bf16"]) if pk.flops_per_s.get("bf16") else None,
                   "timing": res.to_dict(with_samples=True)}
            results.append(row)
            label = f"{phase} B={B} " + (f"kv={kv}" if phase == "decode" else f"S={S}")
            line = common.roofline_line(t_ns, bytes_moved=nbytes, flops=None if phase == "decode" else flops, pk=pk)
            print(f"{label:<22} {variant:<24} {t_ns / 1e6:8.3f} ms  {row['ms_per_layer']:7.3f} ms/layer  "
                  f"{row['tokens_per_s']:12,.0f} tok/s  {line}")
            if res.warning:
                print(f"  warning: {res.warning}")
    _print_table(common, results, args)
    common.write_json(getattr(args, "json", None), {
        "bench": NAME, "config": asdict(cfg), "device": asdict(info),
        "peaks": asdict(pk), "args": {k: v for k, v in vars(args).items() if k != "func"}, "results": results})
    return 0


def _run_case(torch, common, timer, model, x, pos, phase, variant, args, dev):
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

    return timer.measure(call, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, device=dev,
                         before_each=before, region_name="BENCHMARK")


def _print_table(common, results, args) -> None:
    """Seed 001's comparison: one row per case, one column per variant (ms for the stack)."""
    variants = _variants(args)
    keys = []
    for r in results:
        k = (r["phase"], r["batch"], r["seq"], r["kv_len"])
        if k not in keys:
            keys.append(k)
    rows = []
    for k in keys:
        label = f"{k[0]} B={k[1]} " + (f"kv={k[3]}" if k[0] == "decode" else f"S={k[2]}")
        cells = [label]
        for v in variants:
            m = [r for r in results if (r["phase"], r["batch"], r["seq"], r["kv_len"]) == k and r["variant"] == v]
            cells.append(f"{m[0]['median_ns'] / 1e6:.3f}" if m else "-")
        rows.append(cells)
    print(f"\n{args.layers}-layer stack, median ms:")
    common.print_table(["case"] + [f"{v} [ms]" for v in variants], rows)
