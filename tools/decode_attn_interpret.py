"""Check the paged split-KV decode kernels (tracestory.models.decode_attn_triton) under Triton's
interpreter, on the CPU: outside CI, which has no Triton.

Usage: TRITON_INTERPRET=1 PYTHONPATH=src python tools/decode_attn_interpret.py [float32|float16]

Per case: random caches and scattered block tables, the kernels' output (fused, and with the
second combine kernel) against each sequence's keys gathered by torch indexing with a float64
softmax; prints the largest absolute difference and exits 1 when it exceeds 1e-5 (float32) or
2e-3 (float16), or when an arrival counter of the fused kernel is left non-zero. The interpreter's bf16 dots and
fp8 casts are unreliable: keep to float32 and float16 with modest values.
"""

from __future__ import annotations

import math
import os
import sys

import torch


def reference(q, kc, vc, tables, pos, bs):
    H, B, d = q.shape
    KH = kc.shape[1]
    out = []
    for b in range(B):
        j = torch.arange(int(pos[b]) + 1)
        slots = tables[b, j // bs] * bs + j % bs
        k = kc[slots].double().transpose(0, 1)                     # [KH, L, d]
        v = vc[slots].double().transpose(0, 1)
        qb = q[:, b].double().view(KH, H // KH, d)
        out.append((torch.softmax(qb @ k.transpose(1, 2) / math.sqrt(d), -1) @ v).reshape(H * d))
    return torch.stack(out)


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("tools/decode_attn_interpret.py: expected TRITON_INTERPRET=1, found it unset", file=sys.stderr)
        return 2
    from tracestory.models import decode_attn_triton as dat

    dat.sm_count = lambda device: 132
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32")
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    # (H, Hkv, d, block size, contexts, splits or None for the default)
    for H, KH, d, bs, ctxs, S in [(8, 2, 16, 16, [1, 15, 16, 17], None), (4, 4, 32, 16, [70, 1], 3),
                                  (32, 8, 128, 16, [600], None), (4, 2, 16, 8, [130, 5, 64], 4),
                                  (6, 2, 24, 16, [200], 32)]:
        B, nb = len(ctxs), 64
        W = max(-(-c // bs) for c in ctxs) + 2
        kc = (torch.randn(nb * bs + bs, KH, d, generator=gen) * 0.5).to(dtype)
        vc = torch.randn(nb * bs + bs, KH, d, generator=gen).to(dtype)
        perm = torch.randperm(nb, generator=gen)
        tables = torch.full((B, W), nb, dtype=torch.int64)
        off = 0
        for b, c in enumerate(ctxs):
            n = -(-c // bs)
            tables[b, :n] = perm[off:off + n]
            off += n
        pos = torch.tensor([c - 1 for c in ctxs], dtype=torch.int64)
        q = (torch.randn(B, H, d, generator=gen) * 0.5).to(dtype).transpose(0, 1)
        ref = reference(q, kc, vc, tables, pos, bs)
        for fused in (True, False):
            out = dat.decode(q, kc, vc, tables, pos, bs, splits=S, fused=fused)
            err = (out.double() - ref).abs().max().item()
            worst = max(worst, err)
            print(f"H={H} Hkv={KH} d={d} bs={bs} contexts={ctxs} splits={S or dat.splits_for(q, kc, tables, bs)} "
                  f"{'fused' if fused else 'two kernels'}: max |diff| {err:.3g}")
    counters_left = int(sum(int(c.abs().sum()) for c in dat._COUNTERS.values()))
    print(f"arrival counters left non-zero: {counters_left}")
    return 0 if worst <= tol and counters_left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
