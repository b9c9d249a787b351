#!/usr/bin/env bash
# session 9, call 3: GEMV_L2_WAVE on the o projection only (GEMV_L2_MAX_MB 64 leaves out down and the lm head)
# at B=1, 512 context
set -u
OUT=$1
W=/tmp/s9c3; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1)
gen() { # name, ctx, then NAME=VALUE settings
  local name=$1 ctx=$2; shift 2
  echo "== $name $ctx ($(( $(date +%s) - T0 )) s)"
  env "$@" timeout 70 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens $ctx \
    --decode-tokens 128 --repeats 2 --json $W/$name-$ctx.json 2>&1 | grep -E "^decode|rror" | cut -c1-200 | head -4
}
gen default 512 X=1
gen l2o-w4 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=4
gen l2o-w4mb32 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=4,GEMV_L2_MB=32
gen l2o-w3 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=3
gen default-again 512 X=1
gen l2o-w4-again 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=4
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s9-call3.sh $W/
tar -czf $OUT/s9c3.tar.gz -C /tmp s9c3
