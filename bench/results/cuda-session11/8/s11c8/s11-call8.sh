#!/usr/bin/env bash
# session 11, call 8 (last): copy-issue loops rolled and the fold rolled up to 8 splits (ATT_TC_FOLD_ROLLED_MAX):
# every CUDA test on a cold cache; against ATT_TC_FOLD_ROLLED_MAX=0 (folds always unrolled) at 512 and 4096; phases
set -u
source bench/cuda-device-lib.sh
call_start s11c8 "$1"
cold_tests "$W/cuda-tests.txt" 200
call_wait_model
GEN_TIMEOUT=50 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
for ctx in 512 4096; do
  b1_gen default "$ctx" X=1
  b1_gen unrolled "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_FOLD_ROLLED_MAX=0
  GEN_GREP=$P GEN_LINES=12 b1_gen phases "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
  b1_gen default2 "$ctx" X=1
done
call_finish
