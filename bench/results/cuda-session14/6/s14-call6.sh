#!/usr/bin/env bash
# session 14, call 6 (commit 62884e9): 256 x 1k/1k throughput, llmts alone (the batched figure on
# this tree; transformers' continuous batching was measured in session 2 and finished none of its
# requests in 284 s); MoE (Qwen3-30B-A3B layers, 6 of 48) with the GEMVs' evict-first weight loads
# (default) against plain loads (its expert kernels share gemv_ld_stream)
set -u
source bench/cuda-device-lib.sh
call_start s14c6 "$1"
export LLMTS_COMMIT=62884e9
call_wait_model
echo "== throughput 256 x 1024/1024"
timeout 230 node --import tsx bench/cuda-throughput.ts --model "$MODEL_DIR" --device cuda --requests 256 --input-tokens 1024 \
  --output-tokens 1024 --max-batch 256 --token-budget 8192 --budget-s 200 --json "$W/tp256.json" > "$W/tp256.log" 2>&1
echo "exit $?"; grep -vi "warm" "$W/tp256.log" | tail -14
LAYERS=6 MODEL_DIR=/tmp/moe6 VARIANTS="evict-off:LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_EVICT_FIRST=0" timeout 240 bash bench/cuda-moe.sh "$W/moe"
call_finish
