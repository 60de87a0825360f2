#!/usr/bin/env bash
# One device call on 4 GPUs (docs/BENCHMARKS.md "Serving under load", session 10 call 1): the
# serving all-reduce's GPU test on GPUs 0-1, then the TP=2 decode step (NCCL against symmetric
# memory) there; at the same time the decode-size all-reduce sweep at TP=2 on GPUs 2-3, then the
# TP=1 decode step on GPU 2; then, if less than DEADLINE seconds have passed, the sweep and the
# decode step at TP=4.
# Usage (repository root): OUT=dir DEADLINE=300 bash benchmarks/gpu/run_tp_symm.sh
set -u
B=benchmarks/gpu/run_tp_serve.sh; S=$(date +%s); DEADLINE=${DEADLINE:-300}
mkdir -p "$OUT/a" "$OUT/b" "$OUT/c"
(CUDA_VISIBLE_DEVICES=0,1 PET_MASTER_PORT=29611 OUT=$OUT/a bash $B symmtest dec2 > "$OUT/a/stdout.txt" 2>&1) & P1=$!
(CUDA_VISIBLE_DEVICES=2,3 PET_MASTER_PORT=29622 OUT=$OUT/b bash $B ar2 > "$OUT/b/stdout.txt" 2>&1;
 CUDA_VISIBLE_DEVICES=2 OUT=$OUT/b bash $B dec1 >> "$OUT/b/stdout.txt" 2>&1) & P2=$!
wait $P1 $P2
if [ $(( $(date +%s) - S )) -lt "$DEADLINE" ]; then OUT=$OUT/c bash $B ar4 dec4; else echo "ar4/dec4 not run: $(( $(date +%s) - S )) s passed"; fi
echo "done in $(( $(date +%s) - S )) s"
cd "$OUT" && tar czf all.tgz a b c && rm -rf a b c
