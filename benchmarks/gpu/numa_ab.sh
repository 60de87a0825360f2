#!/usr/bin/env bash
# The NUMA-balancing A/B behind docs/BENCHMARKS.md "Serving under load" (the stall clusters): two
# TP=2 servers at once under the same load at the same time, X on GPUs 0-1 with
# TRACESTORY_NUMA_LOCAL=0 (the default memory policy, scanned by the kernel's NUMA balancing), Y on
# GPUs 2-3 as shipped (serve/numa.py: MPOL_LOCAL where the balancing is on); twice: phase a as the
# machine is, phase b with kernel.numa_balancing=0 where it can be written. $OUT gets both event
# logs, each phase's load summaries and the /proc/vmstat NUMA counters before and after each phase
# (run.log). Split the logs per phase and count the stalls with benchmarks/gpu/numa_ab_table.py.
# Usage (repository root, 4 GPUs): OUT=dir bash benchmarks/gpu/numa_ab.sh
set -u
OUT=${OUT:-numa_ab}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD/src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TS="python3 -m tracestory.cli"
LOAD="--model llama-3-8b --request-rate 12 --duration 15 --random-input-len 768 --random-range-ratio 0.333 --random-output-len 128 --ignore-eos --no-progress"
SERVE="--tensor-parallel 2 --device cuda --fp8 rowwise --attention-backend flex --skip-power-monitor"
LOG=$OUT/run.log
info() {
  echo "[$1] $(date +%s.%N) numa_balancing=$(cat /proc/sys/kernel/numa_balancing 2>&1)" \
       "$(grep -E '^numa_(hint_faults|hint_faults_local|pte_updates|pages_migrated) ' /proc/vmstat | tr '\n' ' ')" | tee -a "$LOG"
}
lscpu | grep -iE "numa|model name|^cpu\(s\)" | tee -a "$LOG"
info start
CUDA_VISIBLE_DEVICES=0,1 PET_MASTER_PORT=29611 TRACESTORY_NUMA_LOCAL=0 $TS serve $SERVE --port 8011 \
  --event-log "$OUT/x.sched.jsonl" > "$OUT/x_serve.log" 2>&1 & X=$!
CUDA_VISIBLE_DEVICES=2,3 PET_MASTER_PORT=29612 $TS serve $SERVE --port 8012 \
  --event-log "$OUT/y.sched.jsonl" > "$OUT/y_serve.log" 2>&1 & Y=$!
t0=$(date +%s)
for i in $(seq 400); do
  curl -sf localhost:8011/health >/dev/null && curl -sf localhost:8012/health >/dev/null && break
  kill -0 $X 2>/dev/null && kill -0 $Y 2>/dev/null || break; sleep 1
done
echo "healthy after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
for phase in a b; do
  if [ $phase = b ]; then
    (echo 0 > /proc/sys/kernel/numa_balancing) 2>/dev/null && echo "numa_balancing set to 0" | tee -a "$LOG" \
      || echo "numa_balancing not writable: phase b repeats phase a" | tee -a "$LOG"
  fi
  info "$phase before"
  timeout 60 $TS load --port 8011 $LOAD --json "$OUT/x_$phase.summary.json" > "$OUT/x_$phase.load.txt" 2>&1 & L=$!
  timeout 60 $TS load --port 8012 $LOAD --json "$OUT/y_$phase.summary.json" > "$OUT/y_$phase.load.txt" 2>&1
  wait $L
  info "$phase after"
  sleep 3
done
kill -INT $X $Y; wait $X $Y
grep -hE "NUMA|stopped|Traceback|Error" "$OUT/x_serve.log" "$OUT/y_serve.log" | head -12 | tee -a "$LOG"
