#!/usr/bin/env bash
# session 9, call 1: the CUDA tests on a cold kernel cache at main (51e50c3 GEMV picks test, 9be5ed4 dyn_smem, cf669ab
# one-token decode list, a53e1e7); then B=1 in-graph A/Bs at 512 context: attention switched off (its in-graph cost),
# 4 ring stages, the o projection's pick w2 and u16/w1
set -u
OUT=$1
W=/tmp/s9c1; mkdir -p $W
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
gen() { # name, then NAME=VALUE settings
  local name=$1; shift
  echo "== $name ($(( $(date +%s) - T0 )) s)"
  env "$@" timeout 70 node --import tsx bench/cuda-generate.ts --device cuda --model $ML --prompt-tokens 512 \
    --decode-tokens 128 --repeats 2 --json $W/$name.json 2>&1 | grep -E "^decode|rror|1x4096x4096" | cut -c1-220 | head -4
}
gen default X=1
gen att-skipped LLMTS_CUDA_ATT_DEFINES=ATT_TC_TIMING_SKIP=1
gen stages4 LLMTS_CUDA_ATT_TC_STAGES=4
gen o-w2 LLMTS_CUDA_GEMV_PICKS=1x4096x4096=k_gemv_m1_u8/w2
gen o-u16w1 LLMTS_CUDA_GEMV_PICKS=1x4096x4096=k_gemv_m1_u16/w1
gen default-again X=1
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s9-call1.sh $W/
tar -czf $OUT/s9c1.tar.gz -C /tmp s9c1
