#!/usr/bin/env bash
# session 8, call 5: why the staged GEMV loses: its shared rows (0 / 64 / 176 KiB) and carveout (default vs 100),
# timed alone by the tuner (default mode) and in the decode graph (forced), 512 context
set -u
OUT=$1
W=/tmp/s8c5; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1
gen() { # name, then NAME=VALUE settings
  local name=$1; shift
  echo "== $name"
  env "$@" timeout 60 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens 512 \
    --decode-tokens 128 --repeats 2 --json $W/$name.json 2>&1 | grep -E "^decode|rror|1x4096x4096" | sed -e 's/k_gemv_m1_u16.*k_gemvs/... k_gemvs/' | head -4
}
gen tune-176 X=1
gen tune-0 LLMTS_CUDA_GEMVS_SHARED_KB=0
gen tune-64-nocarve LLMTS_CUDA_GEMVS_SHARED_KB=64 LLMTS_CUDA_GEMVS_CARVEOUT=-1
gen forced-0 LLMTS_CUDA_GEMV=k_gemvs_m1 LLMTS_CUDA_GEMVS_SHARED_KB=0
gen forced-64-nocarve LLMTS_CUDA_GEMV=k_gemvs_m1 LLMTS_CUDA_GEMVS_SHARED_KB=64 LLMTS_CUDA_GEMVS_CARVEOUT=-1
gen forced-176-nocarve LLMTS_CUDA_GEMV=k_gemvs_m1 LLMTS_CUDA_GEMVS_CARVEOUT=-1
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s8-call5.sh $W/
tar -czf $OUT/s8c5.tar.gz -C /tmp s8c5
