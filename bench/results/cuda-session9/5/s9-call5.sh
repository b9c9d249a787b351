#!/usr/bin/env bash
# session 9, call 5: the o projection on cuBLASLt (call 3's "L2 prefetch" gain was the tuner moving o to cuBLASLt)
# against the tuner's k_gemv_m1_u8/w4, alternating, B=1 at 512 and 4096 context; o and down both on cuBLASLt once
set -u
OUT=$1
W=/tmp/s9c5; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1)
gen() { # name, ctx, then NAME=VALUE settings
  local name=$1 ctx=$2; shift 2
  echo "== $name $ctx ($(( $(date +%s) - T0 )) s)"
  env "$@" timeout 70 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens $ctx \
    --decode-tokens 128 --repeats 2 --json $W/$name-$ctx.json 2>&1 | grep -E "^decode|rror" | cut -c1-200 | head -4
}
for i in 1 2 3; do
  gen default$i 512 X=1
  gen o-cublas$i 512 LLMTS_CUDA_GEMV_PICKS=1x4096x4096=cublaslt
done
gen o-down-cublas 512 LLMTS_CUDA_GEMV_PICKS=1x4096x4096=cublaslt,1x4096x14336=cublaslt
gen default 4096 X=1
gen o-cublas 4096 LLMTS_CUDA_GEMV_PICKS=1x4096x4096=cublaslt
echo "== profile, o on cuBLASLt"
LLMTS_CUDA_GEMV_PICKS=1x4096x4096=cublaslt timeout 70 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens 512 \
  --decode-tokens 64 --repeats 1 --profile-graph --profile-batch 1 --json $W/profile-o-cublas.json > $W/profile-o-cublas.txt 2>&1
grep -E "gemm|gemv|attn" $W/profile-o-cublas.txt | head -12
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s9-call5.sh $W/
tar -czf $OUT/s9c5.tar.gz -C /tmp s9c5
