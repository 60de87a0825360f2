#!/usr/bin/env bash
# The H200 run behind docs/BENCHMARKS.md. Run from the repository root; writes into $OUT
# (default ./bench_out). Each step is time-limited and guarded: a failure does not stop the rest.
set -u
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=src
LOG="$OUT/bench.log"
TS="python3 -m tracestory.cli bench"
source "$(dirname "$0")/steps.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_capability())'
} 2>&1 | tee -a "$LOG"

# 1. the timer against triton.testing.do_bench on the same kernels (both flush L2, median)
step timer-vs-do_bench 90 python3 - "$OUT/timer_check.json" <<'PY'
import json, sys, torch, triton
from triton.testing import do_bench
from tracestory.bench.timer import measure
torch.manual_seed(0)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
x = torch.randn(256 * 1024 * 1024, device="cuda", dtype=torch.float32)  # 1 GiB
y = torch.empty_like(x)
q = torch.randn(1, 8, 4, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
kernels = {"gemm_bf16_8192^3": lambda: a @ b, "copy_1GiB": lambda: y.copy_(x),
           "sdpa_decode_kv4096": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
rows = []
for name, fn in kernels.items():
    for trial in range(2):
        ours = measure(fn, warmup_ms=25, rep_ms=100, flush_l2=True).median_ns / 1e6
        theirs = do_bench(fn, warmup=25, rep=100, return_mode="median")
        rows.append({"kernel": name, "trial": trial, "tracestory_ms": ours, "do_bench_ms": theirs,
                     "ratio": ours / theirs})
        print(f"{name:22s} trial {trial}: tracestory {ours:.4f} ms  do_bench {theirs:.4f} ms  ratio {ours / theirs:.4f}")
cp = [r for r in rows if r["kernel"] == "copy_1GiB"]
print("copy bandwidth (read+write):", ", ".join(f"{2 * x.numel() * 4 / (r['tracestory_ms'] * 1e-3) / 1e12:.3f} TB/s" for r in cp))
gm = [r for r in rows if r["kernel"].startswith("gemm")]
print("bf16 GEMM:", ", ".join(f"{2 * 8192 ** 3 / (r['tracestory_ms'] * 1e-3) / 1e12:.1f} TFLOP/s" for r in gm))
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PY

# 2. llama-3-8b decode, batch 1, bf16: eager vs compiled, kv 512 and 4096
step llama-decode 230 $TS llama --preset llama-3-8b --layers 4 --phase decode --batch 1 --kv-len 512 4096 \
    --mode eager compile --compile-mode default reduce-overhead --json "$OUT/llama_decode.json"
# 3. decode attention sweep
step attention-decode 60 $TS attention-decode --batch 1 --heads 32 --gqa 4 --head-dim 128 --json "$OUT/attention_decode.json"
# 4. one llama run under torch.profiler (one timed iteration, gzip trace)
step llama-profile 60 $TS llama --preset llama-3-8b --layers 4 --phase decode --kv-len 4096 --mode eager \
    --profile torch --profile-out "$OUT/llama_decode_eager.trace.json.gz"
# 5. prefill
step llama-prefill 120 $TS llama --preset llama-3-8b --layers 4 --phase prefill --batch 1 --seq 512 2048 \
    --mode eager compile --compile-mode default --json "$OUT/llama_prefill.json"
# 6. helper H2's benches, when present
if [ -f src/tracestory/bench/fp8.py ]; then
  step fp8 120 $TS fp8 --test-cases all --json "$OUT/fp8.json"
fi
if [ -f src/tracestory/bench/moe.py ]; then
  step moe 90 $TS moe --json "$OUT/moe.json"
fi
# 7. GPU tests
step gpu-tests 90 python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/gpu/test_bench_gpu.py
ls -la "$OUT" | tee -a "$LOG"
