#!/usr/bin/env bash
# session 9, call 4: the host-driven L2 prefetch (a one-shot GEMV right after an attention kernel gets l2Wave 4):
# the CUDA tests on a cold cache, B=1 at 512 / 4096 context against LLMTS_CUDA_GEMV_L2_WAVE=0, 8 x 512/256
set -u
OUT=$1
W=/tmp/s9c4; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1) &
(timeout 60 node scripts/build-native.mjs > $W/build-native.log 2>&1 || echo "native build failed")
CACHE=$(mktemp -d)
LLMTS_CACHE_DIR=$CACHE timeout 220 node --import tsx --test --test-concurrency=1 \
  test/backends/cuda-modules.test.ts test/backends/cuda-ops.test.ts test/backends/cuda-fused.test.ts \
  test/backends/cuda-sampling.test.ts test/backends/cuda-engine-sampling.test.ts test/backends/cuda-fixtures.test.ts \
  test/backends/block-copy.test.ts test/state/prefix-cuda.test.ts > $W/cuda-tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - T0 )) s"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' $W/cuda-tests.txt | head -20
xz -9 $W/cuda-tests.txt
wait
gen() { # name, ctx, then NAME=VALUE settings
  local name=$1 ctx=$2; shift 2
  echo "== $name $ctx ($(( $(date +%s) - T0 )) s)"
  env "$@" timeout 70 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens $ctx \
    --decode-tokens 128 --repeats 2 --json $W/$name-$ctx.json 2>&1 | grep -E "^decode|rror" | cut -c1-200 | head -4
}
for i in 1 2; do
  gen default$i 512 X=1
  gen l2off$i 512 LLMTS_CUDA_GEMV_L2_WAVE=0
done
gen default 4096 X=1
gen l2off 4096 LLMTS_CUDA_GEMV_L2_WAVE=0
for v in default:X=1 l2off:LLMTS_CUDA_GEMV_L2_WAVE=0; do
  echo "== throughput 8 x 512/256 ${v%%:*} ($(( $(date +%s) - T0 )) s)"
  env ${v#*:} timeout 50 node --import tsx bench/cuda-throughput.ts --device cuda --model $ML --requests 8 --max-batch 8 \
    --input-tokens 512 --output-tokens 256 --json $W/tp8-${v%%:*}.json 2>&1 | grep -E '^ +(output|TTFT)|rror' | head -3
done
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s9-call4.sh $W/
tar -czf $OUT/s9c4.tar.gz -C /tmp s9c4
