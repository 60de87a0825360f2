#!/usr/bin/env bash
# The device runs behind docs/BENCHMARKS.md's "Serving under load" table (tensor-parallel serving).
# Usage (repository root): OUT=dir [STACKS_MS=8] bash benchmarks/gpu/run_tp_serve.sh PART...
# PARTS: tests (pytest -m gpu), roofs (dense GEMM rate, copy roof), capture2 (the TP=2 capture under
# load, its report and table row), tp1 / tp2 / tp4 (the server under the same load without a profiler,
# table row each; tp1bf16: TP=1 without --fp8, for the bf16 prefill), stop4 (Ctrl-C of `tracestory serve --tensor-parallel 4`), glue (one GPU: the decode
# GEMM study and the step profiles of benchmarks/gpu/decode_glue.py), chunkattn (one GPU: the chunk
# attention kernel alone against SDPA, benchmarks/gpu/chunk_attn.py), ar2 / ar4 (decode-size
# all-reduce, NCCL against symmetric memory, benchmarks/gpu/allreduce_small.py; AR_ROWS: the row
# counts), dec1 / dec2 / dec4 (the decode step at TP=N, NCCL against symmetric memory,
# benchmarks/gpu/tp_decode.py), symmtest (tests/gpu/test_tp_allreduce_gpu.py on 2 GPUs), ncu (the
# docs/CAPTURE.md recipe "Kernels of a serving run under ncu", TP=2, rank 0 under ncu), ncufilter
# (which kernels ncu's NCCL-free filter keeps), fresh (one GPU: fresh-prompt flash attention against
# the chunk kernel, benchmarks/gpu/fresh_attn.py). Each step is time-limited.
set -u
OUT=${OUT:-tp_serve}
W=/tmp/tpserve; mkdir -p "$OUT" $W/json
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD/src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG="$OUT/run.log"
TS="python3 -m tracestory.cli"
source "$(dirname "$0")/steps.sh"
# the issue's load: 12 req/s, prompts 512-1023 tokens, 128 output tokens
LOAD="--model llama-3-8b --request-rate 12 --duration 15 --random-input-len 768 --random-range-ratio 0.333 --random-output-len 128 --ignore-eos --no-progress"
SERVE=${SERVE:-"--device cuda --fp8 rowwise --attention-backend flex"}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$LOG"
python3 --version | tee -a "$LOG"

cpu_stat() {    # the container's CPU quota and throttling counters (cgroup v2 or v1), the load average
  local f
  for f in /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.stat; do
    [ -r $f ] && echo "[$1] $f: $(tr '\n' ' ' < $f)" | tee -a "$LOG"
  done
  echo "[$1] nproc $(nproc), loadavg $(cat /proc/loadavg)" | tee -a "$LOG"
}

serve_run() {   # serve_run N PORT [NAME [SERVE-FLAGS]]: server (tp N) under the load, no profiler; row in $W/json/NAME.json (NAME: tpN)
  local n=$1 port=$2 name=${3:-tp$1} flags=${4:-$SERVE}; local d=$W/$name; mkdir -p $d
  local tp=""; [ "$n" -gt 1 ] && tp="--tensor-parallel $n"
  echo "=== [$name] $(date +%T) \$ $TS serve $tp $flags --port $port --event-log $d/serve.sched.jsonl --skip-power-monitor" | tee -a "$LOG"
  # STACKS_MS=N: every rank writes the Python stacks of host steps over N ms (serve/stackwatch.py)
  TRACESTORY_STALL_STACKS_MS=${STACKS_MS:-0} TRACESTORY_STALL_STACKS_DIR=$d \
    $TS serve $tp $flags --port $port --event-log $d/serve.sched.jsonl --skip-power-monitor > $d/serve.log 2>&1 &
  local srv=$! t0=$(date +%s)
  for i in $(seq 400); do curl -sf localhost:$port/health >/dev/null && break; kill -0 $srv 2>/dev/null || break; sleep 1; done
  echo "healthy after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
  cpu_stat "$name before the load"
  # the throttling counters every 50 ms during the load (unix ns first), to set beside the event log's stalls
  (f=/sys/fs/cgroup/cpu.stat; [ -r $f ] || f=/sys/fs/cgroup/cpu/cpu.stat
   while :; do echo "$(date +%s%N) $(tr '\n' ' ' < $f 2>/dev/null)"; sleep 0.05; done > $d/cpu_stat.txt) & local mon=$!
  step $name-load 60 $TS load --port $port $LOAD --json $d/load.summary.json --output $d/load.requests.jsonl
  kill $mon 2>/dev/null
  cpu_stat "$name after the load"
  gzip -c $d/cpu_stat.txt > "$OUT/${name}_cpu_stat.txt.gz"
  local ts=$(date +%s.%N); kill -INT $srv; wait $srv; local rc=$?
  echo "=== [$name] server exit code $rc, stopped in $(python3 -c "import time;print(round(time.time()-$ts,2))") s" | tee -a "$LOG"
  grep -E "startup|prefill/mixed|stopped|Traceback|Error|error" $d/serve.log | tail -12 | tee -a "$LOG"
  step $name-table 30 python3 benchmarks/gpu/serve_table.py $d --gpus $n --roofs $W/json/roofs.json --json $W/json/$name.json
  cp $d/serve.log "$OUT/${name}_serve.log"
  gzip -c $d/serve.sched.jsonl > "$OUT/${name}.sched.jsonl.gz"   # the event log behind the row
  if ls $d/stall_stacks.*.txt >/dev/null 2>&1; then (cd $d && tar czf "$OUT/${name}_stall_stacks.tgz" stall_stacks.*.txt); fi
}

for part in "$@"; do case $part in
tests)   # the whole pytest output in $OUT/pytest_gpu.txt, its end in the log
  step gpu-tests ${TESTS_LIMIT:-240} bash -c "python3 -m pytest -q -rfE -m gpu --noconftest -p no:cacheprovider tests/gpu > $OUT/pytest_gpu.txt 2>&1; rc=\$?; tail -30 $OUT/pytest_gpu.txt; exit \$rc" ;;
roofs)
  step roofs 60 python3 benchmarks/gpu/roofs.py --json $W/json/roofs.json ;;
capture2)
  A=$W/artifacts
  step capture-tp2 330 $TS capture torch --name serve_tp2 --out $A --torchrun 2 --stop-timeout 60 \
      --load "$LOAD --port 8000" --range iteration --skip 200 --count 8 \
      -- $TS serve --tensor-parallel 2 $SERVE --port 8000
  python3 -c "import json;m=json.load(open('$A/serve_tp2/manifest.json'));c=m['captures'][-1];print('capture status:',c['status'],c.get('error'));[print(' step',s['name'],s['status'],s.get('exit_code'),s.get('stop_signal'),s.get('stopped'),s.get('stop_ns')) for s in c['steps']]" 2>&1 | tee -a "$LOG"
  ls -la $A/serve_tp2/* | tee -a "$LOG"
  step report-tp2 120 $TS report $A/serve_tp2 -o $A/serve_tp2/report.md
  grep -n -i -A4 "multi-gpu\|limitation" $A/serve_tp2/report.md | head -40 | tee -a "$LOG"
  step capture2-table 30 python3 benchmarks/gpu/serve_table.py $A/serve_tp2 --gpus 2 --roofs $W/json/roofs.json --json $W/json/capture_tp2.json
  (cd $A && tar czf "$OUT/serve_tp2_capture.tar.gz" --exclude='*.png' serve_tp2) ;;
glue)
  step decode-glue 330 python3 benchmarks/gpu/decode_glue.py --json $W/json/decode_glue.json ;;
chunkattn)
  step chunk-attn 420 python3 benchmarks/gpu/chunk_attn.py --json $W/json/chunk_attn.json ;;
ar2|ar4)
  n=${part#ar}
  step allreduce-tp$n 180 torchrun --nproc_per_node=$n benchmarks/gpu/allreduce_small.py \
      --rows ${AR_ROWS:-1,2,4,8,16,32,64,128,256,512,1024,2080} --json $W/json/allreduce_tp$n.json ;;
dec1)   # the decode step at TP=1 (benchmarks/gpu/tp_decode.py)
  step tp-decode-1 300 python3 benchmarks/gpu/tp_decode.py --json $W/json/tp_decode_tp1.json ;;
dec2|dec4)   # the decode step at TP=2/4, NCCL against symmetric-memory all-reduce
  n=${part#dec}
  step tp-decode-$n 200 torchrun --nproc_per_node=$n benchmarks/gpu/tp_decode.py --modes nccl,auto \
      --json $W/json/tp_decode_tp$n.json ;;
symmtest)   # the GPU test of the serving all-reduce on 2 GPUs, its output in $OUT/pytest_symm.txt
  step symm-test 240 bash -c "python3 -m pytest -q -rfEs -m gpu --noconftest -p no:cacheprovider tests/gpu/test_tp_allreduce_gpu.py > $OUT/pytest_symm.txt 2>&1; rc=\$?; tail -40 $OUT/pytest_symm.txt; exit \$rc" ;;
ncufilter)
  # which kernels the --profile-rank filter keeps (NCCL look-alike out, the others in)
  for F in 'regex:^(?!.*nccl).*' 'regex:^(?!.*nccl)(?=.*(?:keep|gemm|nvjet)).*'; do
    echo "=== [ncu-filter] $(date +%T) \$ ncu --kernel-name $F ..." | tee -a "$LOG"
    timeout 90 ncu --kernel-name "$F" --clock-control none --section SpeedOfLight \
        python3 benchmarks/gpu/ncu_filter_check.py 2>&1 | grep -E "==PROF== Profiling|^values|==ERROR==" | tee -a "$LOG"
  done ;;
ncu)
  # docs/CAPTURE.md "Kernels of a serving run under ncu": rank 0 of TP=2 under ncu, NCCL kernels
  # left out there, an eager SDPA server (nothing compiles), the first iteration (a prefill)
  A=$W/artifacts; t0=$(date +%s)
  echo "=== [ncu-tp2] $(date +%T)" | tee -a "$LOG"
  # its own process group and output file: a timeout stops every process of it
  setsid $TS capture ncu --name serve_tp2_ncu --out $A --torchrun 2 --profile-rank 0 --health-timeout 300 \
      --stop-timeout 60 --range iteration --skip ${NCU_ITER:-0} --launch-count ${NCU_COUNT:-40} --set ${NCU_SET:-basic} \
      --load "--model llama-3-8b --request-rate 2 --duration 8 --random-input-len 512 --random-output-len 16 --ignore-eos --port 8000 --no-progress" \
      -- $TS serve --tensor-parallel 2 $SERVE --attention-backend sdpa --enforce-eager --num-blocks 4096 \
         --stall-timeout 900 --port 8000 \
      > $W/ncu_capture.txt 2>&1 &
  CP=$!
  while kill -0 $CP 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt ${NCU_SECS:-240} ]; do
    sleep 2
    [ -s $W/ps.txt ] || [ $(( $(date +%s) - t0 )) -lt 40 ] || ps -eo pid,ppid,pgid,etimes,args --forest | grep -E "ncu|tracestory|torchrun" | grep -v grep | cut -c1-220 > $W/ps.txt
  done
  cat $W/ps.txt 2>/dev/null | tee -a "$LOG"
  kill -0 $CP 2>/dev/null && { echo "ncu capture still running after ${NCU_SECS:-240} s: stopped" | tee -a "$LOG"; kill -INT -- -$CP; sleep 20; kill -KILL -- -$CP 2>/dev/null; }
  wait $CP; echo "=== [ncu-tp2] rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
  grep -v Warning $W/ncu_capture.txt | grep -E "==PROF==|capture ncu|Error|error|Traceback" | head -80 | tee -a "$LOG"
  grep -c "==PROF== Profiling" $W/ncu_capture.txt | sed 's/^/profiled kernels: /' | tee -a "$LOG"
  python3 -c "import json;m=json.load(open('$A/serve_tp2_ncu/manifest.json'));c=m['captures'][-1];print('capture status:',c['status'],c.get('error'));[print(' step',s['name'],s['status'],s.get('exit_code'),s.get('stop_signal'),s.get('stopped'),s.get('duration_ns')) for s in c['steps']]" 2>&1 | tee -a "$LOG"
  find $A/serve_tp2_ncu -type f | xargs ls -la | tee -a "$LOG"
  step report-ncu 120 $TS report $A/serve_tp2_ncu -o $A/serve_tp2_ncu/report.md
  grep -n -i -B2 -A12 "kernel metrics\|ncu\|Nsight Compute" $A/serve_tp2_ncu/report.md | head -60 | tee -a "$LOG"
  gzip -c $W/ncu_capture.txt > "$OUT/ncu_capture.txt.gz"
  (cd $A && tar czf "$OUT/serve_tp2_ncu.tar.gz" --exclude='*.ncu-rep' serve_tp2_ncu) ;;
fresh)
  step fresh-attn 240 python3 benchmarks/gpu/fresh_attn.py --json $W/json/fresh_attn.json ;;
tp1) serve_run 1 8001 ;;
tp2) serve_run 2 8002 ;;
tp4) serve_run 4 8004 ;;
tp1bf16) serve_run 1 8011 tp1bf16 "--device cuda --attention-backend flex" ;;   # no --fp8: the bf16 prefill against the bf16 GEMM roof
esac; done
(cd $W && tar czf "$OUT/json.tar.gz" json)
