#!/usr/bin/env bash
# session 9, call 2: GEMV_L2_WAVE (gemv_rows' first wave prefetches the later waves' rows into L2 before the PDL
# wait) at B=1, 512 and 4096 context, against the default
set -u
OUT=$1
W=/tmp/s9c2; mkdir -p $W
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
gen l2w4 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=4
gen l2w2 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=2
gen l2w4mb40 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=4,GEMV_L2_MB=40
gen l2w4mb12 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=4,GEMV_L2_MB=12
gen l2w8 512 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=8
gen default-again 512 X=1
gen default 4096 X=1
gen l2w4 4096 LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_WAVE=4
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s9-call2.sh $W/
tar -czf $OUT/s9c2.tar.gz -C /tmp s9c2
