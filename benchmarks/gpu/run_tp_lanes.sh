#!/usr/bin/env bash
# One device call on 4 GPUs in two lanes (docs/BENCHMARKS.md "Serving under load", call 7):
#   lane A, GPUs 0-1: roofs, the TP=2 and TP=1 servers under load, then pytest -m gpu on GPU 0;
#   lane B, GPUs 2-3: the parts in LANE_B (default: capture2, the TP=2 capture), at the same time
#   (session 9: LANE_B="fresh ncufilter ncu");
# then, if less than DEADLINE seconds have passed, the TP=4 server on all four.
# Usage (repository root): OUT=dir DEADLINE=330 bash benchmarks/gpu/run_tp_lanes.sh
set -u
B=benchmarks/gpu/run_tp_serve.sh; S=$(date +%s); DEADLINE=${DEADLINE:-330}
mkdir -p "$OUT/s" "$OUT/c" "$OUT/t"
# lane B's torchrun rendezvous on another port: in call 7 both lanes' launchers took 29500 and the
# TP=2 server of lane A exited at start (EADDRINUSE); PET_MASTER_PORT is torchrun's --master-port
(CUDA_VISIBLE_DEVICES=2,3 PET_MASTER_PORT=29611 OUT=$OUT/c bash $B ${LANE_B:-capture2} > "$OUT/c/stdout.txt" 2>&1) & CAP=$!
OUT=$OUT/s bash $B roofs tp2 tp1
CUDA_VISIBLE_DEVICES=0 OUT=$OUT/t bash $B tests
while kill -0 $CAP 2>/dev/null && [ $(( $(date +%s) - S )) -lt $((DEADLINE + 60)) ]; do sleep 2; done
kill -0 $CAP 2>/dev/null && { echo "capture lane still running at $(( $(date +%s) - S )) s: stopped"; kill -- -$CAP 2>/dev/null; kill $CAP; }
if [ $(( $(date +%s) - S )) -lt "$DEADLINE" ]; then OUT=$OUT/s bash $B tp4; else echo "tp4 not run: $(( $(date +%s) - S )) s passed"; fi
echo "lanes done in $(( $(date +%s) - S )) s"
cd "$OUT" && mv c/serve_tp2_capture.tar.gz c/serve_tp2_ncu.tar.gz . 2>/dev/null; tar czf all.tgz s c t && rm -rf s c t
