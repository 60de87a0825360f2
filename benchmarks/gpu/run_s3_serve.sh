#!/usr/bin/env bash
# Session-3 device run on one H200: `tracestory capture --load` of the reference
# server. (1) torch.profiler over COUNT scheduler iterations of a 12-QPS run, started on the
# engine thread after SKIP iterations of warm-up; (2) the same server under Nsight Compute,
# one iteration bracketed by cudaProfilerStart/Stop, its first 4 GEMM kernels, with a small KV
# cache (ncu saves and restores device memory for every replay pass); (3) a plain serve + load
# at 12 QPS without any profiler, to compare the client's numbers.
# Run 1 (24 iterations, 12 unfiltered kernels, KV at --gpu-memory-fraction 0.5) was made
# before the CUPTI priming in capture/torch.py; run 2 is this script as it stands.
set -u
OUT=${OUT:-s3_serve}
W=/tmp/s3; rm -rf $W; mkdir -p "$OUT" $W
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG="$OUT/run.log"
TS="python3 -m tracestory.cli"
source "$(dirname "$0")/steps.sh"
# SERVE/LOAD/SKIP can be overridden for a CPU rehearsal of this script.
SERVE=${SERVE:-"tracestory serve --preset llama-3-8b --layers 4 --device cuda --port 8000"}
LOAD=${LOAD:-"--model llama-3-8b --target-qps 12 --duration 15 --prompt-len-min 512 --prompt-len-max 1024 --max-new-tokens 128 --ignore-eos --no-progress --timeout 60"}
SKIP=${SKIP:-600}
COUNT=${COUNT:-16}
cd $W
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee -a "$LOG"
step capture-torch 200 $TS capture torch --name serve_q12 --load "$LOAD" --range iteration --skip $SKIP --count $COUNT -- $SERVE
step capture-ncu 200 $TS capture ncu --name serve_q12 --load "$LOAD --duration 10" --range iteration --skip $((SKIP / 2)) --launch-count 4 --kernel-name "gemm|nvjet|xmma" -- $SERVE --gpu-memory-fraction 0.05
mkdir -p artifacts/plain_q12
step plain 90 python3 -c 'import shlex, sys
from tracestory.capture.under_load import run_under_load
r = run_under_load(shlex.split(sys.argv[1]), sys.argv[2], health_timeout_s=120)
print("ok" if r.ok else r.error)' "python3 -m ${SERVE/tracestory /tracestory.cli } --event-log artifacts/plain_q12/serve.sched.jsonl" "tracestory load $LOAD --output artifacts/plain_q12/load.requests.jsonl --json artifacts/plain_q12/load.summary.json"
tar czf "$OUT/s3_serve.tar.gz" artifacts
ls -laR artifacts | tee -a "$LOG"
