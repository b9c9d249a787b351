#!/usr/bin/env bash
# session 11, call 7: ATT_TC_COMPACT=1 (cold loops not unrolled: d128 2488 instructions of SASS instead of 6216)
# against the default at 512 and 4096, with its phases
set -u
source bench/cuda-device-lib.sh
call_start s11c7 "$1"
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
for ctx in 512 4096; do
  b1_gen default "$ctx" X=1
  b1_gen compact "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_COMPACT=1
  GEN_GREP=$P GEN_LINES=12 b1_gen compact-phases "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_COMPACT=1,ATT_TC_PHASES=1
  b1_gen default2 "$ctx" X=1
  b1_gen compact2 "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_COMPACT=1
done
call_finish
