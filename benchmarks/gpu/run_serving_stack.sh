#!/usr/bin/env bash
# The device run behind docs/BENCHMARKS.md's "FP8 + FlexAttention serving" rows, on one GPU.
# Usage (repository root): OUT=dir bash benchmarks/gpu/run_serving_stack.sh PART...
# PARTS: tests (pytest -m gpu), telemetry (sampler overhead with real NVML), llama, llama-fp8,
# llama-flex (batch-1 decode against the copy roof measured in the same run), ppl (FP8 vs bf16 perplexity on a small
# checkpoint trained here), recompiles (what compiles after start-up, under load), serve (capture of `serve --fp8 rowwise` under load, its report and
# the busy-per-iteration numbers). Each step is time-limited; a failure does not stop the rest.
set -u
OUT=${OUT:-serving_stack}
W=/tmp/stack; mkdir -p "$OUT" $W/json
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD/src
LOG="$OUT/run.log"
TS="python3 -m tracestory.cli"
source "$(dirname "$0")/steps.sh"
LLAMA="llama --preset llama-3-8b --layers 8 --phase decode --batch 1 --kv-len 4096 --mode compile --compile-mode reduce-overhead --warmup-ms 200 --rep-ms 500"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$LOG"
for part in "$@"; do case $part in
tests)
  step gpu-tests 240 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/gpu ;;
telemetry)
  step telemetry-overhead 40 python3 benchmarks/telemetry_overhead.py --seconds 5 ;;
llama)
  step llama-bf16 120 $TS bench $LLAMA --attention-backend matmul --json $W/json/llama_decode_matmul_bf16.json ;;
llama-fp8)
  for m in tensorwise rowwise; do
    step llama-fp8-$m 100 $TS bench $LLAMA --attention-backend matmul --fp8 $m --json $W/json/llama_decode_matmul_fp8_$m.json
  done ;;
llama-flex)
  step llama-flex-fp8 120 $TS bench $LLAMA --attention-backend flex --fp8 rowwise --json $W/json/llama_decode_flex_fp8_rowwise.json ;;
ppl)
  TF=$(python3 -c "import transformers, os; print(os.path.dirname(transformers.__file__))")
  find "$TF/models" -name 'modeling_*.py' | sort | head -400 | xargs cat > $W/corpus.txt
  step ppl-ckpt 60 python3 benchmarks/gpu/make_ppl_checkpoint.py --text $W/corpus.txt --out $W/ckpt --heldout $W/heldout.txt --seconds 30
  step ppl 90 $TS eval ppl --model $W/ckpt --text-file $W/heldout.txt --precision bf16,fp8-rowwise,fp8-tensorwise --input-len 512 --num-chunks 50 --json $W/json/ppl.json ;;
serve)
  step serve-fp8 240 $TS capture torch --name serve_fp8 --out $W/artifacts --load "--model llama-3-8b --request-rate 2 --duration 12 --random-input-len 512 --random-output-len 512 --ignore-eos --no-progress" --range iteration --skip 300 --count 16 -- $TS serve --device cuda --port 8000 --fp8 rowwise
  step serve-report 90 $TS report $W/artifacts/serve_fp8 -o $W/artifacts/serve_fp8/report.md
  step serve-check 30 $TS check $W/artifacts/serve_fp8/report.md
  step serve-busy 60 python3 benchmarks/gpu/serve_busy.py $W/artifacts/serve_fp8 --json $W/json/serve_fp8_busy.json
  cp $W/artifacts/serve_fp8/report.md "$OUT/serve_fp8_report.md" 2>/dev/null
  (cd $W/artifacts && tar czf "$OUT/serve_fp8_capture.tar.gz" --exclude='*.png' serve_fp8) ;;
recompiles)
  # which shapes compile after start-up (TTFT stalls): the server under load with torch's recompile log
  TORCH_LOGS=recompiles $TS serve --device cuda --port 8001 --fp8 rowwise --event-log $W/rc.sched.jsonl \
      --skip-power-monitor > $W/rc.serve.log 2>&1 &
  SRV=$!
  for i in $(seq 120); do curl -sf localhost:8001/health >/dev/null && break; sleep 1; done
  step recompiles-load 60 $TS load --base-url http://127.0.0.1:8001 --model llama-3-8b --request-rate 2 \
      --duration 10 --random-input-len 512 --random-output-len 128 --ignore-eos --no-progress
  kill -INT $SRV; wait $SRV
  grep -n -i -A3 "recompil" $W/rc.serve.log | head -60 | tee -a "$LOG"
  cp $W/rc.serve.log "$OUT/" ;;
esac; done
(cd $W && tar czf "$OUT/json.tar.gz" json)
