#!/usr/bin/env bash
# One device call on 4 GPUs (docs/BENCHMARKS.md "Serving under load", session 10): the decode-size
# all-reduce sweep at TP=4; the roofs on GPU 0; then at the same time the TP=1 server on GPU 0, the
# TP=2 server on GPUs 1-2 and pytest -m gpu on GPU 3; then the TP=4 server; then at the same time
# the TP=2 decode step, NCCL against symmetric memory (GPUs 0-1) and the serving all-reduce's GPU
# test (GPUs 2-3); then, if less than DEADLINE seconds have passed, the TP=4 decode step.
# Usage (repository root): OUT=dir DEADLINE=400 bash benchmarks/gpu/run_tp_symm.sh
set -u
B=benchmarks/gpu/run_tp_serve.sh; S=$(date +%s); DEADLINE=${DEADLINE:-400}
mkdir -p "$OUT/s1" "$OUT/s2" "$OUT/t" "$OUT/c"
OUT=$OUT/c bash $B ar4 > "$OUT/c/stdout.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 OUT=$OUT/s1 bash $B roofs
(CUDA_VISIBLE_DEVICES=0 OUT=$OUT/s1 bash $B tp1 > "$OUT/s1/stdout.txt" 2>&1) & P1=$!
(CUDA_VISIBLE_DEVICES=1,2 PET_MASTER_PORT=29611 OUT=$OUT/s2 bash $B tp2 > "$OUT/s2/stdout.txt" 2>&1) & P2=$!
CUDA_VISIBLE_DEVICES=3 OUT=$OUT/t bash $B tests
wait $P1 $P2
echo "servers 1, 2 and tests done after $(( $(date +%s) - S )) s"
OUT=$OUT/s2 bash $B tp4
(CUDA_VISIBLE_DEVICES=0,1 PET_MASTER_PORT=29611 OUT=$OUT/c bash $B dec2 >> "$OUT/c/stdout.txt" 2>&1) & P3=$!
CUDA_VISIBLE_DEVICES=2,3 OUT=$OUT/t bash $B symmtest
wait $P3
if [ $(( $(date +%s) - S )) -lt "$DEADLINE" ]; then OUT=$OUT/c bash $B dec4 >> "$OUT/c/stdout.txt" 2>&1; else echo "dec4 not run: $(( $(date +%s) - S )) s passed"; fi
echo "done in $(( $(date +%s) - S )) s"
cd "$OUT" && tar czf all.tgz s1 s2 t c && rm -rf s1 s2 t c
