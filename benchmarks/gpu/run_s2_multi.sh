#!/usr/bin/env bash
# Session-2 device run on nvidia-h200-x4: tensor-parallel captures, all-reduce sweep,
# eager vs compiled Llama decode captures (compare), a memory capture, max-autotune.
# Run from the repository root; everything lands under $OUT (tarballs: the device returns 8 files).
set -u
OUT=${OUT:-s2_out}
W=/tmp/s2; mkdir -p "$OUT" $W/cap $W/traces $W/json
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG="$OUT/run.log"
TS="python3 -m tracestory.cli"
source "$(dirname "$0")/steps.sh"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
nvidia-smi topo -m 2>&1 | head -8 | tee -a "$LOG"
TP="--range step --wait 2 --warmup 2 --active 4 -- python3 examples/tp_llama.py --layers 2 --steps 10"
step tp2-uneven 100 $TS capture torch --out $W/cap --name tp2_uneven --torchrun 2 $TP --slow-rank 1 --extra-gemms 2
step tp2-even 100 $TS capture torch --out $W/cap --name tp2_even --torchrun 2 $TP --slow-rank -1
step tp4-uneven 100 $TS capture torch --out $W/cap --name tp4_uneven --torchrun 4 $TP --slow-rank 2 --extra-gemms 2
step ar-sweep-2 60 torchrun --nproc_per_node=2 benchmarks/gpu/allreduce_sweep.py --json $W/json/allreduce_2gpu.json
step ar-sweep-4 60 torchrun --nproc_per_node=4 benchmarks/gpu/allreduce_sweep.py --json $W/json/allreduce_4gpu.json
step mem-capture 90 $TS capture torch --out $W/cap --name tiny_llama_memory --memory --with-shapes --range BENCHMARK --skip 3 --count 2 -- python3 examples/tiny_llama.py --device cuda --dtype bfloat16
B="llama --preset llama-3-8b --layers 4 --phase decode --batch 1 --kv-len 4096"
step llama-eager-prof 90 $TS bench $B --mode eager --profile torch --profile-out $W/traces/llama_decode_eager.trace.json.gz
step llama-compile-prof 150 $TS bench $B --mode compile --compile-mode default --profile torch --profile-out $W/traces/llama_decode_compile_default.trace.json.gz
step llama-autotune 240 $TS bench $B --mode eager compile --compile-mode max-autotune --json $W/json/llama_decode_autotune.json
step llama-autotune-prof 120 $TS bench $B --mode compile --compile-mode max-autotune --profile torch --profile-out $W/traces/llama_decode_compile_max-autotune.trace.json.gz
step ncu-tp2 120 $TS capture ncu --out $W/cap --name tp2_ncu_gemm --torchrun 2 --kernel-name 'regex:nvjet|gemm' --launch-skip 20 --launch-count 4 --set full -- python3 examples/tp_llama.py --layers 2 --steps 6
(cd $W && tar czf "$OLDPWD/$OUT/cap.tar.gz" cap && tar czf "$OLDPWD/$OUT/traces.tar.gz" traces json)
ls -la "$OUT" $W/cap/* $W/traces | tee -a "$LOG"
