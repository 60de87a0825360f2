"""Tensor-parallel Llama decoder layers (Megatron split) with deliberately uneven work per rank.

Each rank holds 1/N of the heads and of the MLP's intermediate size:

* attention: QKV is column-parallel (this rank's heads), the output projection is row-parallel,
  so its partial sums meet in an **all-reduce after attention**;
* MLP: gate/up are column-parallel, down is row-parallel: an **all-reduce after the MLP**.

``--slow-rank R --extra-gemms K`` gives rank R K extra GEMMs of the down projection's shape
before each all-reduce (inside region ``extra_work``), so R reaches every all-reduce late and
the other ranks wait in it: the straggler a multi-GPU report must name.

Every iteration runs in ``tracestory.region("step")`` (``attention``, ``mlp`` inside), so

    tracestory capture torch --torchrun 2 --range step --wait 2 --warmup 2 --active 4 \\
        -- python examples/tp_llama.py --slow-rank 1 --extra-gemms 2

records four ProfilerSteps on every rank. ``--device cpu`` runs on gloo with a tiny shape (a
smoke test of the script; no GPU kernels to analyse).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tracestory.capture.region import region


@dataclass(frozen=True)
class Shape:
    dim: int
    heads: int
    kv_heads: int
    hidden: int
    batch: int
    seq: int


SHAPES = {
    # Llama-3-8B's layer at a prefill of 4 x 512 tokens.
    "llama-3-8b": Shape(dim=4096, heads=32, kv_heads=8, hidden=14336, batch=4, seq=512),
    "tiny": Shape(dim=64, heads=4, kv_heads=2, hidden=128, batch=1, seq=8),
}


class TPLayer(torch.nn.Module):
    """One decoder layer's shard for ``rank`` of ``world`` (weights random, fixed seed)."""

    def __init__(self, s: Shape, world: int, extra_gemms: int):
        super().__init__()
        if s.heads % world or s.kv_heads % world or s.hidden % world:
            raise SystemExit(f"heads {s.heads}, kv heads {s.kv_heads} and hidden {s.hidden} must divide by {world}")
        self.s, self.world, self.extra = s, world, extra_gemms
        self.hd = s.dim // s.heads
        self.h, self.hkv, self.inter = s.heads // world, s.kv_heads // world, s.hidden // world
        self.norm1 = torch.nn.RMSNorm(s.dim)
        self.norm2 = torch.nn.RMSNorm(s.dim)
        self.qkv = torch.nn.Linear(s.dim, (self.h + 2 * self.hkv) * self.hd, bias=False)   # column-parallel
        self.o = torch.nn.Linear(self.h * self.hd, s.dim, bias=False)                     # row-parallel
        self.gate_up = torch.nn.Linear(s.dim, 2 * self.inter, bias=False)                 # column-parallel
        self.down = torch.nn.Linear(self.inter, s.dim, bias=False)                        # row-parallel

    def _straggle(self, t: torch.Tensor) -> None:
        """Extra GEMMs of the down projection's shape: work only the slow rank does."""
        if self.extra:
            with region("extra_work"):
                for _ in range(self.extra):
                    self.down(t)

    def forward(self, x: torch.Tensor, inter_act: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        with region("attention"):
            q, k, v = self.qkv(self.norm1(x)).split([self.h * self.hd, self.hkv * self.hd, self.hkv * self.hd], -1)
            q = q.view(b, s, self.h, self.hd).transpose(1, 2)
            k = k.view(b, s, self.hkv, self.hd).transpose(1, 2)
            v = v.view(b, s, self.hkv, self.hd).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            partial = self.o(a.transpose(1, 2).reshape(b, s, self.h * self.hd))
            self._straggle(inter_act)
            dist.all_reduce(partial)
            x = x + partial
        with region("mlp"):
            g, u = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
            act = F.silu(g) * u
            partial = self.down(act)
            self._straggle(act)
            dist.all_reduce(partial)
            x = x + partial
        return x


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES), help="default: llama-3-8b on cuda, tiny on cpu")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="iterations, each in region 'step'")
    ap.add_argument("--slow-rank", type=int, default=1, help="the rank given extra work (-1: none)")
    ap.add_argument("--extra-gemms", type=int, default=2, help="extra down-projection GEMMs per all-reduce on the slow rank")
    args = ap.parse_args(argv)

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda" if cuda else "cpu")
    s = SHAPES[args.shape or ("llama-3-8b" if cuda else "tiny")]
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(rank)
    extra = args.extra_gemms if rank == args.slow_rank else 0
    layers = [TPLayer(s, world, extra).to(dev, dtype) for _ in range(args.layers)]
    x = torch.randn(s.batch, s.seq, s.dim, device=dev, dtype=dtype)
    inter_act = torch.randn(s.batch, s.seq, s.hidden // world, device=dev, dtype=dtype)
    with torch.inference_mode():
        for _ in range(args.steps):
            with region("step"):
                h = x
                for layer in layers:
                    h = layer(h, inter_act)
            if cuda:
                torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
