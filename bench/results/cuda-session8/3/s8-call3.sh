#!/usr/bin/env bash
# session 8, call 3: CUDA tests (cold cache) with rope's early reads on; then B=1 decode A/B at 512 context:
# rope early on/off, attention early reads / 32-key chunks, and the timing-only skips (attention, rope)
set -u
OUT=$1
W=/tmp/s8c3; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1) &
CACHE=$(mktemp -d)
LLMTS_CACHE_DIR=$CACHE timeout 230 node --import tsx --test --test-concurrency=1 \
  test/backends/cuda-modules.test.ts test/backends/cuda-ops.test.ts test/backends/cuda-fused.test.ts \
  test/backends/cuda-sampling.test.ts test/backends/cuda-engine-sampling.test.ts test/backends/cuda-fixtures.test.ts \
  test/backends/block-copy.test.ts test/state/prefix-cuda.test.ts > $W/cuda-tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - T0 )) s"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' $W/cuda-tests.txt | head -20
xz -9 $W/cuda-tests.txt
wait
gen() { # name, then NAME=VALUE settings
  local name=$1; shift
  echo "== $name"
  env "$@" timeout 60 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens 512 \
    --decode-tokens 128 --repeats 2 --json $W/$name.json 2>&1 | grep -E "^decode|rror" | head -3
}
gen default X=1
gen rope-late LLMTS_CUDA_FUSED_DEFINES=ROPE_EARLY=0
gen tc-early LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1
gen tc-early-chunk32 LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1,ATT_TC_MIN_CHUNK=32
gen default2 X=1
gen att-skip LLMTS_CUDA_ATT_DEFINES=ATT_TC_TIMING_SKIP=1
gen rope-skip LLMTS_CUDA_FUSED_DEFINES=ROPE_TIMING_SKIP=1
gen rope-late2 LLMTS_CUDA_FUSED_DEFINES=ROPE_EARLY=0
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s8-call3.sh $W/
tar -czf $OUT/s8c3.tar.gz -C /tmp s8c3
