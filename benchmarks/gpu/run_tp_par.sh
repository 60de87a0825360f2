#!/usr/bin/env bash
# One device call on 4 GPUs (docs/BENCHMARKS.md "Serving under load", session 9 call 3): the roofs on
# GPU 0, then at the same time the TP=1 server on GPU 0, the TP=2 server on GPUs 1-2 and
# pytest -m gpu on GPU 3; then, if less than DEADLINE seconds have passed, the TP=4 server on all four;
# then, with CAPTURE=1, the TP=2 capture under load on GPUs 0-1 (the fixture tests/data/tp_serve_gpu) beside
# the 2-GPU test file on GPUs 2-3 (SYMM=1 instead: that file alone, on GPUs 0-1, after TP=4).
# Usage (repository root): OUT=dir DEADLINE=190 [SYMM=1] [CAPTURE=1] bash benchmarks/gpu/run_tp_par.sh
set -u
B=benchmarks/gpu/run_tp_serve.sh; S=$(date +%s); DEADLINE=${DEADLINE:-190}
mkdir -p "$OUT/s1" "$OUT/s2" "$OUT/t"
CUDA_VISIBLE_DEVICES=0 OUT=$OUT/s1 bash $B roofs
(CUDA_VISIBLE_DEVICES=0 OUT=$OUT/s1 bash $B tp1 > "$OUT/s1/stdout.txt" 2>&1) & P1=$!
# the TP=2 server's torchrun rendezvous on a port of its own (PET_MASTER_PORT: torchrun's --master-port)
(CUDA_VISIBLE_DEVICES=1,2 PET_MASTER_PORT=29611 OUT=$OUT/s2 bash $B tp2 > "$OUT/s2/stdout.txt" 2>&1) & P2=$!
CUDA_VISIBLE_DEVICES=3 OUT=$OUT/t bash $B tests
wait $P1 $P2
if [ $(( $(date +%s) - S )) -lt "$DEADLINE" ]; then OUT=$OUT/s2 bash $B tp4; else echo "tp4 not run: $(( $(date +%s) - S )) s passed"; fi
if [ "${SYMM:-0}" = 1 ]; then    # the 2-GPU test file (the tests lane sees one GPU)
  CUDA_VISIBLE_DEVICES=0,1 OUT=$OUT/t bash $B symmtest
fi
if [ "${CAPTURE:-0}" = 1 ]; then
  mkdir -p "$OUT/c"
  (CUDA_VISIBLE_DEVICES=0,1 OUT=$OUT/c bash $B capture2 > "$OUT/c/stdout.txt" 2>&1) & P3=$!
  CUDA_VISIBLE_DEVICES=2,3 PET_MASTER_PORT=29611 OUT=$OUT/t bash $B symmtest
  wait $P3
fi
echo "done in $(( $(date +%s) - S )) s"
cd "$OUT" && tar czf all.tgz s1 s2 t $( [ -d c ] && echo c ) && rm -rf s1 s2 t c
