#!/usr/bin/env bash
# session 14, call 7: the tensor-core prefill attention alone (bench/cuda-attention.ts, Llama-3.1-8B's
# heads, causal prefill of 1k / 4k / 8k tokens in one row) under register / tile variants
# (LLMTS_CUDA_ATT_DEFINES: ATT_PF_MINB, ATT_PF_KU, ATT_PF_BK128); nvcc 13 for sm_90: default 255
# registers with spills, KU=2 219, BK128=32 221, BK128=32 + MINB=3 168 (small spills)
set -u
source bench/cuda-device-lib.sh
call_start s14c7 "$1"
for v in default ATT_PF_KU=2 ATT_PF_BK128=32 ATT_PF_BK128=32,ATT_PF_MINB=3 ATT_PF_MINB=3 default2; do
  d=$v; case $v in default*) d=;; esac
  echo "== $v"
  LLMTS_CUDA_ATT_DEFINES=$d timeout 60 node --import tsx bench/cuda-attention.ts --decode 512 --prefill 1024,4096,8192 --check \
    --json "$W/att-$v.json" 2>&1 | grep -E "^prefill|kernels|generic|rror" | cut -c1-260 | head -14
done
call_finish
