#!/usr/bin/env bash
# session 14, call 8 (commit a9e36d3): the prefill attention's key / value ring (LLMTS_CUDA_ATT_PF_STAGES 2 / 3 / 4)
# alone (bench/cuda-attention.ts, 8B heads, 1k / 4k / 8k causal prefill, checked against the generic kernel),
# the 8B's TTFT at 1k and 8k with 2 and 3 stages, then every CUDA test on a cold cache with 3 stages
set -u
source bench/cuda-device-lib.sh
call_start s14c8 "$1"
export LLMTS_COMMIT=a9e36d3
for ns in 2 3 4; do
  echo "== stages $ns"
  LLMTS_CUDA_ATT_PF_STAGES=$ns timeout 60 node --import tsx bench/cuda-attention.ts --decode 512 --prefill 1024,4096,8192 --check \
    --json "$W/att-$ns.json" 2>&1 | grep -E "^prefill|attn_prefill|generic|rror" | cut -c1-240 | head -10
done
call_wait_model
for ns in 2 3; do
  GEN_EXTRA="--prefill-prompts 1024,8192 --prefill-repeats 2" GEN_GREP='^(ttft|decode)|rror' GEN_LINES=4 b1_gen ttft-$ns 512 LLMTS_CUDA_ATT_PF_STAGES=$ns
done
export LLMTS_CUDA_ATT_PF_STAGES=3
cold_tests "$W/cuda-tests-pf3.txt" 200
call_finish
