#!/usr/bin/env bash
# session 8, call 4: CUDA tests (cold cache) with the staged GEMV (k_gemvs_m1); then B=1 decode A/B at 512 and 4k
# context: the tuner's pick, the staged kernel forced, k_gemv_m1_u8 forced (the old o projection)
set -u
OUT=$1
W=/tmp/s8c4; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1) &
(timeout 60 node scripts/build-native.mjs > $W/build-native.log 2>&1 || echo "native build failed"; tail -2 $W/build-native.log)
CACHE=$(mktemp -d)
LLMTS_CACHE_DIR=$CACHE timeout 240 node --import tsx --test --test-concurrency=1 \
  test/backends/cuda-modules.test.ts test/backends/cuda-ops.test.ts test/backends/cuda-fused.test.ts \
  test/backends/cuda-sampling.test.ts test/backends/cuda-engine-sampling.test.ts test/backends/cuda-fixtures.test.ts \
  test/backends/block-copy.test.ts test/state/prefix-cuda.test.ts > $W/cuda-tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - T0 )) s"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' $W/cuda-tests.txt | head -20
xz -9 $W/cuda-tests.txt
wait
gen() { # name, context, then NAME=VALUE settings
  local name=$1 ctx=$2; shift 2
  echo "== $name, $ctx"
  env "$@" timeout 60 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens $ctx \
    --decode-tokens 128 --repeats 2 --json $W/$name-$ctx.json 2>&1 | grep -E "^decode|rror|1x4096x4096" | head -4
}
for ctx in 512 4096; do
  gen default $ctx X=1
  gen staged $ctx LLMTS_CUDA_GEMV=k_gemvs_m1
  gen u8 $ctx LLMTS_CUDA_GEMV=k_gemv_m1_u8
  gen staged2 $ctx LLMTS_CUDA_GEMV=k_gemvs_m1
done
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s8-call4.sh $W/
tar -czf $OUT/s8c4.tar.gz -C /tmp s8c4
