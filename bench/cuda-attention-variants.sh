#!/usr/bin/env bash
# Decode attention kernel variants side by side (attention-kernels.ts tuning macros through
# $LLMTS_CUDA_ATT_DEFINES, slots per SM through $LLMTS_CUDA_ATT_DECODE_BLOCKS, the kernel kind
# through $LLMTS_CUDA_ATT_DECODE: cuda-core or tc, attention.ts): bench/cuda-attention.ts
# for each at 256 rows (1k, 2k context; the 256 x 1k/1k throughput run's range) and one row (4k),
# then the CUDA attention tests with each variant that compiled. One command on the GPU machine:
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-attention-variants.sh $OUT
#
# VARIANTS: space-separated "BLOCKS:DEFINES[:KIND]" (BLOCKS empty = the default; DEFINES
# comma-separated; KIND tc (default, as the engine's) or cuda-core; BLOCKS sets the CUDA-core kernel's
# slots, $LLMTS_CUDA_ATT_TC_RESIDENT the tc kernel's waves), e.g. VARIANTS=": ::cuda-core :ATT_TC_EARLY=1:tc".
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-attention-variants}
mkdir -p "$OUT"
source bench/device-out.sh
trap 'out_pack "$OUT"' EXIT
VARIANTS=${VARIANTS:-": ::cuda-core :ATT_TC_EARLY=1"}
i=0
for v in $VARIANTS; do
  IFS=: read -r blocks defines kind <<< "$v"
  echo "== variant $i: blocks ${blocks:-default}, defines ${defines:-none}, kernel ${kind:-tc}"
  export LLMTS_CUDA_ATT_DECODE=${kind:-tc}
  LLMTS_CUDA_ATT_DECODE_BLOCKS=$blocks LLMTS_CUDA_ATT_DEFINES=$defines timeout 120 node --import tsx bench/cuda-attention.ts \
    --decode 1024,2048 --prefill '' --batch 256 --json "$OUT/variant-$i-b256.json" 2>&1 | grep -E '^decode|registers|rror'
  LLMTS_CUDA_ATT_DECODE_BLOCKS=$blocks LLMTS_CUDA_ATT_DEFINES=$defines timeout 60 node --import tsx bench/cuda-attention.ts \
    --decode 4096 --prefill '' --batch 1 --json "$OUT/variant-$i-b1.json" 2>&1 | grep -E '^decode|rror'
  if [ "${TESTS:-1}" = 1 ]; then
    LLMTS_CUDA_ATT_DECODE_BLOCKS=$blocks LLMTS_CUDA_ATT_DEFINES=$defines timeout 120 node --import tsx --test \
      --test-name-pattern 'attention' test/backends/cuda-ops.test.ts > "$OUT/variant-$i-tests.txt" 2>&1
    echo "   tests: $(grep -E '^# (pass|fail)' "$OUT/variant-$i-tests.txt" | tr '\n' ' ')"
  fi
  i=$((i + 1))
done
