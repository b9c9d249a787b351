#!/usr/bin/env bash
# session 8, call 7: the staged GEMV forced with enough shared rows that no row is loaded after the wait (192, 200 KiB)
# and with 128 KiB, in the B=1 graph at 512 context; the default beside them
set -u
OUT=$1
W=/tmp/s8c7; mkdir -p $W
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1
gen() { # name, then NAME=VALUE settings
  local name=$1; shift
  echo "== $name"
  env "$@" timeout 60 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens 512 \
    --decode-tokens 128 --repeats 2 --json $W/$name.json 2>&1 | grep -E "^decode|rror|1x4096x4096" | sed -e 's/k_gemv_m1_u16.*k_gemvs/... k_gemvs/' | head -4
}
gen default X=1
gen tune-192 LLMTS_CUDA_GEMVS_SHARED_KB=192
gen forced-192 LLMTS_CUDA_GEMV=k_gemvs_m1 LLMTS_CUDA_GEMVS_SHARED_KB=192
gen forced-200 LLMTS_CUDA_GEMV=k_gemvs_m1 LLMTS_CUDA_GEMVS_SHARED_KB=200
gen forced-128 LLMTS_CUDA_GEMV=k_gemvs_m1 LLMTS_CUDA_GEMVS_SHARED_KB=128
cp .device/s8-call7.sh $W/
tar -czf $OUT/s8c7.tar.gz -C /tmp s8c7
