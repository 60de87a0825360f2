#!/usr/bin/env bash
# Makes the tests/data/capture fixtures on one H200 (see README.md). Run from the repo root:
#   OUT=/some/folder bash tests/data/capture/make_fixtures.sh
# Needs python3 with torch (CUDA) and ncu on PATH; tracestory is taken from ./src.
set -u
W=$(pwd)
export PYTHONPATH=$W/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/capture_out}
mkdir -p "$OUT"
rm -rf /tmp/cap && mkdir /tmp/cap && cd /tmp/cap || exit 1
T="python3 -m tracestory.cli.capture capture"
EX="$W/examples/tiny_llama.py"
{
  nvidia-smi -L; ncu --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  # 1. torch.profiler capture of BENCHMARK occurrences 2 and 3 (of 5), after a warm-up run.
  $T torch --name h200_torch --range BENCHMARK --skip 2 --count 2 --with-shapes --memory --flops \
     --warmup-run -- python3 "$EX" --device cuda --iters 5
  echo "torch rc=$?"
  # 2. ncu capture: the first 12 kernels inside BENCHMARK ranges, --set full, clocks untouched.
  $T ncu --name h200_ncu --range BENCHMARK --launch-count 12 -- python3 "$EX" --device cuda --iters 2
  echo "ncu rc=$?"
  # 3. No nested profilers: `capture torch` run under ncu must not start torch.profiler and
  #    must bracket occurrence 1 of BENCHMARK with cudaProfilerStart/Stop.
  ncu --profile-from-start off --clock-control none --target-processes all \
      --metrics gpu__time_duration.sum \
      python3 -m tracestory.cli.capture capture torch --name nested --out /tmp/cap/nested_art \
      --range BENCHMARK --skip 1 -- python3 "$EX" --device cuda --iters 3
  echo "nested rc=$?"
  # 4. What ncu puts in the environment of its child (for external_profiler()).
  ncu --target-processes all python3 -c "import os; from tracestory.capture.environment import external_profiler as e; print('DETECT', e(), sorted(k for k in os.environ if k.startswith(('NV_','CUDA_INJ','NSYS'))))"
  find /tmp/cap -type f -exec ls -la {} \;
} 2>&1 | tee "$OUT/log.txt"
cd /tmp/cap/artifacts && for d in h200_torch h200_ncu; do [ -d "$d" ] && tar czf "$OUT/$d.tar.gz" "$d"; done
cp /tmp/cap/nested_art/nested/manifest.json "$OUT/nested_manifest.json" 2>/dev/null
ls -la "$OUT"
