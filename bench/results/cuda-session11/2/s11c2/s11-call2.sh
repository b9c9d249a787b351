#!/usr/bin/env bash
# session 11, call 2: ring stages 3 / 4 and the early reads at 512 and 4096, each beside the default
set -u
source bench/cuda-device-lib.sh
call_start s11c2 "$1"
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
for ctx in 512 4096; do
  b1_gen default "$ctx" X=1
  GEN_GREP=$P GEN_LINES=12 b1_gen st3-phases "$ctx" LLMTS_CUDA_ATT_TC_STAGES=3 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
  b1_gen st3 "$ctx" LLMTS_CUDA_ATT_TC_STAGES=3
  b1_gen st4 "$ctx" LLMTS_CUDA_ATT_TC_STAGES=4
  b1_gen early "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1
done
call_finish
