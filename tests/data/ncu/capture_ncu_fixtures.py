"""Capture the small Nsight Compute fixtures in this folder (run on a machine with an NVIDIA GPU).

    python3 tests/data/ncu/capture_ncu_fixtures.py --capture OUTDIR

profiles, one kernel each (``ncu --set full --clock-control none --launch-count 1 -k regex:...``):

* ``triton_rmsnorm``: a hand-written Triton RMSNorm kernel (``ts_rmsnorm_kernel``), bf16, 8192 x 4096;
* ``sdpa_flash``: ``F.scaled_dot_product_attention`` forced to the flash backend, bf16,
  batch 1, 32 heads, 2048 tokens, head dim 128, causal;
* ``fp8_scaled_mm``: ``torch._scaled_mm`` e4m3 x e4m3 -> bf16, 4096 x 4096 x 4096.

Each report is exported with ``ncu --import X.ncu-rep --csv --page raw`` and ``--page details``,
and everything is gzip'ed. ``--workload NAME`` runs one workload alone (what ncu launches).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import os
import shutil
import subprocess
import sys
import tarfile

WORKLOADS = {
    # name: kernel-name regex given to ncu -k
    "triton_rmsnorm": "regex:ts_rmsnorm_kernel",
    "sdpa_flash": "regex:flash",
    "fp8_scaled_mm": "regex:nvjet|gemm|cutlass|xmma",
}


def run_triton() -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def ts_rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(tl.bfloat16), mask=mask)

    rows, cols = 8192, 4096
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)  # x: [rows, cols]
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ts_rmsnorm_kernel[(rows,)](x, w, y, cols, 1e-5, BLOCK=4096, num_warps=8)
    torch.cuda.synchronize()


def run_sdpa() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # q, k, v: [B, H, S, D]
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()


def run_fp8() -> None:
    import torch

    m = n = k = 4096
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)  # a: [M, K] row-major
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # b: [K, N] column-major
    one = torch.tensor(1.0, device="cuda")
    torch.cuda.synchronize()
    torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()


def find_ncu() -> str:
    found = shutil.which("ncu") or sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    if isinstance(found, list):
        found = found[-1] if found else None
    if not found:
        sys.exit("ncu not found")
    return found


def sh(argv: list[str], log, **kw) -> subprocess.CompletedProcess:
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    log.write(p.stdout[-4000:] + p.stderr[-4000:] + f"\n[rc={p.returncode}]\n")
    log.flush()
    return p


def gz(src: str, dst: str) -> None:
    with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)


def capture(out: str) -> None:
    ncu = find_ncu()
    work = "/tmp/ncu_fixtures"
    os.makedirs(work, exist_ok=True)
    log = open(os.path.join(out, "capture_log.txt"), "w")
    sh([ncu, "--version"], log)
    sh(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv"], log)
    sh([sys.executable, "-c", "import torch, triton; print(torch.__version__, triton.__version__)"], log)
    details = []
    for name, regex in WORKLOADS.items():
        rep = os.path.join(work, name)
        p = sh([ncu, "--set", "full", "--clock-control", "none", "--launch-count", "1", "-k", regex,
                "-f", "-o", rep, sys.executable, os.path.abspath(__file__), "--workload", name],
               log, timeout=170)
        if p.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):
            continue
        gz(rep + ".ncu-rep", os.path.join(out, f"{name}.ncu-rep.gz"))
        for page in ("raw", "details"):
            csv_path = os.path.join(work, f"{name}_{page}.csv")
            with open(csv_path, "w") as f:
                subprocess.run([ncu, "--import", rep + ".ncu-rep", "--csv", "--page", page], stdout=f, check=False)
            if page == "raw":
                gz(csv_path, os.path.join(out, f"{name}_raw.csv.gz"))
            else:
                details.append(csv_path)
    # The device returns at most 8 files: the three details exports travel in one tar.
    with tarfile.open(os.path.join(out, "details_csv.tar.gz"), "w:gz") as t:
        for path in details:
            t.add(path, arcname=os.path.basename(path))
    log.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capture", metavar="OUTDIR")
    ap.add_argument("--workload", choices=sorted(WORKLOADS))
    a = ap.parse_args()
    if a.workload:
        {"triton_rmsnorm": run_triton, "sdpa_flash": run_sdpa, "fp8_scaled_mm": run_fp8}[a.workload]()
    elif a.capture:
        capture(a.capture)
    else:
        ap.error("give --capture OUTDIR or --workload NAME")


if __name__ == "__main__":
    main()
