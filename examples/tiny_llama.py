"""A tiny Llama-style decoder layer (RMSNorm, attention, SwiGLU MLP) marked for capture.

Each timed iteration runs inside ``tracestory.region("BENCHMARK")``, with ``attention`` and
``mlp`` regions inside it, so one script serves every capture:

    tracestory capture torch --range BENCHMARK --skip 5 --count 1 -- python examples/tiny_llama.py
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, D]
        b, s, d = x.shape
        h = self.c.n_heads
        with region("attention"):
            q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
            # q, k, v: [B, H, S, D/H]
            q, k, v = (t.view(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        with region("mlp"):
            g, u = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
            x = x + self.down(F.silu(g) * u)
        return x


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--warmup", type=int, default=3, help="untimed iterations, outside any region")
    ap.add_argument("--iters", type=int, default=6, help="iterations, each in region BENCHMARK")
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
    print(f"tiny_llama: {args.iters} iterations of {c} on {args.device}, out[0,0,0]={float(y[0, 0, 0]):.4f}")


if __name__ == "__main__":
    main()
