#!/usr/bin/env bash
# session 8, call 9 (last): CUDA tests (cold cache) with the tensor-core decode attention's ring in dynamic shared memory
# (2 stages, the default); the attention alone at 16 rows with 2, 3, 4 stages; CUDA ops + fixtures at 3 stages; 16 x 512/256 at 3
set -u
OUT=$1
W=/tmp/s8c9; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1) &
(timeout 60 node scripts/build-native.mjs > $W/build-native.log 2>&1 || echo "native build failed")
CACHE=$(mktemp -d)
LLMTS_CACHE_DIR=$CACHE timeout 200 node --import tsx --test --test-concurrency=1 \
  test/backends/cuda-modules.test.ts test/backends/cuda-ops.test.ts test/backends/cuda-fused.test.ts \
  test/backends/cuda-sampling.test.ts test/backends/cuda-engine-sampling.test.ts test/backends/cuda-fixtures.test.ts \
  test/backends/block-copy.test.ts test/state/prefix-cuda.test.ts > $W/cuda-tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - T0 )) s"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' $W/cuda-tests.txt | head -20
xz -9 $W/cuda-tests.txt
for st in 2 3 4; do
  echo "== attention alone, 16 rows, $st stages"
  LLMTS_CUDA_ATT_TC_STAGES=$st timeout 45 node --import tsx bench/cuda-attention.ts --batch 16 --decode 1024,4096 --prefill '' \
    --json $W/att16-s$st.json 2>&1 | grep -E "decode|rror" | head -4
done
echo "at $(( $(date +%s) - T0 )) s"
LLMTS_CUDA_ATT_TC_STAGES=3 timeout 100 node --import tsx --test --test-concurrency=1 test/backends/cuda-ops.test.ts \
  test/backends/cuda-fixtures.test.ts > $W/cuda-tests-s3.txt 2>&1
echo "tests at 3 stages exit $? at $(( $(date +%s) - T0 )) s"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' $W/cuda-tests-s3.txt | head -10
xz -9 $W/cuda-tests-s3.txt
wait
echo "== throughput 16 x 512/256, 3 stages"
LLMTS_CUDA_ATT_TC_STAGES=3 timeout 40 node --import tsx bench/cuda-throughput.ts --device cuda --model $ML --requests 16 --max-batch 16 \
  --input-tokens 512 --output-tokens 256 --json $W/tp16-s3.json 2>&1 | grep -E '^ +(output|TTFT)|rror' | head -3
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s8-call9.sh $W/
tar -czf $OUT/s8c9.tar.gz -C /tmp s8c9
