#!/usr/bin/env bash
# session 8, call 8: CUDA tests (cold cache) with decode graphs skipping the prefill attention kernel
# (StepLayout.oneTokenPerRow); 16-row decode with and without the hint; 16- and 64-row step profiles
set -u
OUT=$1
W=/tmp/s8c8; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1) &
(timeout 60 node scripts/build-native.mjs > $W/build-native.log 2>&1 || echo "native build failed")
CACHE=$(mktemp -d)
LLMTS_CACHE_DIR=$CACHE timeout 240 node --import tsx --test --test-concurrency=1 \
  test/backends/cuda-modules.test.ts test/backends/cuda-ops.test.ts test/backends/cuda-fused.test.ts \
  test/backends/cuda-sampling.test.ts test/backends/cuda-engine-sampling.test.ts test/backends/cuda-fixtures.test.ts \
  test/backends/block-copy.test.ts test/state/prefix-cuda.test.ts > $W/cuda-tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - T0 )) s"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' $W/cuda-tests.txt | head -20
xz -9 $W/cuda-tests.txt
wait
tp() { # name, then NAME=VALUE settings
  echo "== throughput 16 x 512/256, $1"; local name=$1; shift
  env "$@" timeout 60 node --import tsx bench/cuda-throughput.ts --device cuda --model $ML --requests 16 --max-batch 16 \
    --input-tokens 512 --output-tokens 256 --json $W/tp16-$name.json 2>&1 | grep -E '^ +(output|TTFT)|rror' | head -3
}
tp hint X=1
tp no-hint LLMTS_CUDA_ATT_ONE_TOKEN_HINT=off
tp hint2 X=1
tp no-hint2 LLMTS_CUDA_ATT_ONE_TOKEN_HINT=off
for b in 16 64; do
  echo "== profile, $b rows"
  timeout 90 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens 1024 --decode-tokens 32 --repeats 1 \
    --profile-graph --profile-batch $b --json $W/profile-$b.json 2>&1 | grep -E '^(graph|  )' | head -16
done
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s8-call8.sh $W/
tar -czf $OUT/s8c8.tar.gz -C /tmp s8c8
