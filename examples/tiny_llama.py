"""A tiny Llama-style decoder layer (RMSNorm, attention, SwiGLU MLP) marked for capture.

Each timed iteration runs inside ``tracestory.region("BENCHMARK")``, with ``attention`` and
``mlp`` regions inside it; then ``--decode-steps`` decode steps (one new token per sequence
against a KV cache of the prompt and the tokens before it) run each inside
``tracestory.region("decode")``. So one script serves every capture:

    tracestory capture torch --range BENCHMARK --skip 5 --count 1 -- python examples/tiny_llama.py
    tracestory capture torch --range decode --skip 20 --count 1 -- python examples/tiny_llama.py
    tracestory capture ncu --range BENCHMARK --launch-count 20 -- python examples/tiny_llama.py --device cuda
    tracestory capture nsys --range BENCHMARK -- python examples/tiny_llama.py --device cuda

Runs on CPU by default (small enough for CI); ``--device cuda`` for a GPU.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tracestory.capture.region import region


@dataclass(frozen=True)
class Config:
    dim: int = 256
    n_heads: int = 4
    hidden: int = 688          # ~ 8/3 * dim, as Llama's SwiGLU
    seq_len: int = 32
    batch: int = 2


PRESETS = {"cpu-tiny": Config(), "gpu-small": Config(dim=1024, n_heads=8, hidden=2816, seq_len=128, batch=4)}


class Layer(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.norm1 = torch.nn.RMSNorm(c.dim)
        self.norm2 = torch.nn.RMSNorm(c.dim)
        self.qkv = torch.nn.Linear(c.dim, 3 * c.dim, bias=False)
        self.proj = torch.nn.Linear(c.dim, c.dim, bias=False)
        self.gate_up = torch.nn.Linear(c.dim, 2 * c.hidden, bias=False)
        self.down = torch.nn.Linear(c.hidden, c.dim, bias=False)

    def _qkv(self, x: torch.Tensor):
        # x: [B, S, D] -> q, k, v: [B, H, S, D/H]
        b, s, d = x.shape
        h = self.c.n_heads
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        return (t.view(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        with region("mlp"):
            g, u = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, D]; causal self-attention over the S positions
        b, s, d = x.shape
        with region("attention"):
            q, k, v = self._qkv(x)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return self._mlp(x)

    def prefill_cache(self, x: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V caches ``[B, H, max_len, D/H]`` holding the keys and values of ``x`` at 0..S-1."""
        b, s, d = x.shape
        _, k, v = self._qkv(x)
        kc = k.new_zeros(b, self.c.n_heads, max_len, d // self.c.n_heads)
        vc = torch.zeros_like(kc)
        kc[:, :, :s], vc[:, :, :s] = k, v
        return kc, vc

    def decode_step(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], pos: int) -> torch.Tensor:
        """One new token per sequence at position ``pos``: ``x`` [B, 1, D] attends to the cached
        positions 0..pos-1 and itself; its K/V are written at ``pos``."""
        b, _, d = x.shape
        kc, vc = cache
        with region("attention"):
            q, k, v = self._qkv(x)
            kc[:, :, pos:pos + 1], vc[:, :, pos:pos + 1] = k, v
            a = F.scaled_dot_product_attention(q, kc[:, :, :pos + 1], vc[:, :, :pos + 1])
            x = x + self.proj(a.transpose(1, 2).reshape(b, 1, d))
        return self._mlp(x)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--warmup", type=int, default=3, help="untimed iterations, outside any region")
    ap.add_argument("--iters", type=int, default=6, help="iterations, each in region BENCHMARK")
    ap.add_argument("--decode-steps", type=int, default=24,
                    help="decode steps after the iterations, each in region decode (default: 24)")
    args = ap.parse_args(argv)
    c = PRESETS[args.preset or ("gpu-small" if args.device.startswith("cuda") else "cpu-tiny")]
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    layer = Layer(c).to(args.device, dtype)
    x = torch.randn(c.batch, c.seq_len, c.dim, device=args.device, dtype=dtype)
    with torch.inference_mode():
        for _ in range(args.warmup):
            layer(x)
        for _ in range(args.iters):
            with region("BENCHMARK"):
                y = layer(x)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
        # decode: the prompt's K/V cached, then one token per step (the last output fed back in
        # place of an embedded sampled token)
        cache = layer.prefill_cache(x, c.seq_len + args.decode_steps)
        t = x[:, -1:]
        for i in range(args.decode_steps):
            with region("decode"):
                t = layer.decode_step(t, cache, c.seq_len + i)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
    print(f"tiny_llama: {args.iters} iterations and {args.decode_steps} decode steps of {c} on {args.device}, "
          f"out[0,0,0]={float(y[0, 0, 0]):.4f}")


if __name__ == "__main__":
    main()
