"""Which kernels ncu's ``--kernel-name`` filter of ``capture ncu --profile-rank`` profiles.

Run under ncu (benchmarks/gpu/run_tp_serve.sh part ``ncufilter``): launches two Triton kernels,
one named like an NCCL kernel (``ncclDevKernel_lookalike``) and one not (``keep_me_kernel``),
plus a bf16 matmul (cuBLAS). ncu's "==PROF== Profiling" lines then say which names the filter
kept: the filter is right when the NCCL look-alike is never profiled and the others are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def ncclDevKernel_lookalike(x_ptr, n, BLOCK: tl.constexpr):  # noqa: N802 -- the name is the point
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)


@triton.jit
def keep_me_kernel(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


def main() -> None:
    x = torch.zeros(4096, device="cuda")
    ncclDevKernel_lookalike[(4,)](x, 4096, BLOCK=1024)
    keep_me_kernel[(4,)](x, 4096, BLOCK=1024)
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    print("values", x[:2].tolist(), flush=True)     # (0 + 1) * 2 = 2.0 when both kernels ran


if __name__ == "__main__":
    main()
