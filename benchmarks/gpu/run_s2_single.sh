#!/usr/bin/env bash
# Session-2 device run on one H200: decode with the two-GEMM attention in every mode,
# the decode-attention implementations, --profile torch traces of each bench (for reports),
# perplexity on a small checkpoint trained there, and one bench under ncu (--profile ncu).
set -u
OUT=${OUT:-s2_single}
W=/tmp/s2s; mkdir -p "$OUT" $W/traces $W/json $W/ncu
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG="$OUT/run.log"
TS="python3 -m tracestory.cli"
source "$(dirname "$0")/steps.sh"
B="llama --preset llama-3-8b --layers 4 --phase decode --batch 1"
step llama-decode 170 $TS bench $B --kv-len 4096 --mode eager compile --compile-mode default reduce-overhead max-autotune --json $W/json/llama_decode_matmul.json
step attention 70 $TS bench attention-decode --batch 1 --heads 32 --gqa 4 --head-dim 128 --impl sdpa sdpa-flash matmul --json $W/json/attention_decode_impls.json
step prof-llama 40 $TS bench $B --kv-len 4096 --mode eager --profile torch --profile-out $W/traces/bench_llama_decode_eager.trace.json.gz
step prof-attention 40 $TS bench attention-decode --kv-len 1024 4096 16384 --impl sdpa matmul --profile torch --profile-out $W/traces/bench_attention_decode.trace.json.gz
step prof-fp8 60 $TS bench fp8 --test-cases small --profile torch --profile-out $W/traces/bench_fp8_small.trace.json.gz
step prof-moe 60 $TS bench moe --profile torch --profile-out $W/traces/bench_moe.trace.json.gz
TF=$(python3 -c "import transformers, os; print(os.path.dirname(transformers.__file__))")
find "$TF/models" -name 'modeling_*.py' | sort | head -400 | xargs cat > $W/corpus.txt
step ppl-ckpt 60 python3 benchmarks/gpu/make_ppl_checkpoint.py --text $W/corpus.txt --out $W/ckpt --heldout $W/heldout.txt --seconds 30
step ppl 60 $TS eval ppl --model $W/ckpt --text-file $W/heldout.txt --precision bf16,fp16,fp32,fp8-weight --input-len 512 --num-chunks 50 --json $W/json/ppl_h200.json
step prof-ncu 110 $TS bench llama --preset llama-3-8b --layers 1 --phase decode --batch 1 --kv-len 4096 --mode eager --profile ncu --profile-out $W/ncu/bench_llama_decode
(cd $W && tar czf "$OUT/s2_single.tar.gz" traces json ncu)
ls -la $W/traces $W/json $W/ncu | tee -a "$LOG"
