#!/usr/bin/env bash
# session 9, call 7 (o now on cuBLASLt, so the attention's latency is exposed): the tensor-core decode's shortest
# split through the new LLMTS_CUDA_ATT_TC_MIN_CHUNK (host slots and kernel alike), early reads; B=1 at 512 / 4096;
# then cuda-ops + fixtures at chunk 32
set -u
OUT=$1
W=/tmp/s9c7; mkdir -p $W
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
gen chunk64 512 LLMTS_CUDA_ATT_TC_MIN_CHUNK=64
gen chunk32 512 LLMTS_CUDA_ATT_TC_MIN_CHUNK=32
gen early 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1
gen chunk32-early 512 LLMTS_CUDA_ATT_TC_MIN_CHUNK=32 LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1
gen default-again 512 X=1
gen default 4096 X=1
gen chunk64 4096 LLMTS_CUDA_ATT_TC_MIN_CHUNK=64
gen chunk32 4096 LLMTS_CUDA_ATT_TC_MIN_CHUNK=32
echo "== cuda-ops + fixtures at chunk 32 ($(( $(date +%s) - T0 )) s)"
LLMTS_CUDA_ATT_TC_MIN_CHUNK=32 timeout 150 node --import tsx --test --test-concurrency=1 test/backends/cuda-ops.test.ts \
  test/backends/cuda-fixtures.test.ts > $W/cuda-tests-c32.txt 2>&1
echo "tests exit $?"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' $W/cuda-tests-c32.txt | head -10
xz -9 $W/cuda-tests-c32.txt
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s9-call7.sh $W/
tar -czf $OUT/s9c7.tar.gz -C /tmp s9c7
