#!/usr/bin/env bash
# session 11, call 3: the merge through shared memory (cp.async chunks): every CUDA test on a cold cache;
# default and phases at 512 and 4096; at 4096 also min chunk 256 (17 splits) and 3 stages
set -u
source bench/cuda-device-lib.sh
call_start s11c3 "$1"
cold_tests "$W/cuda-tests.txt" 240
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
for ctx in 512 4096; do
  b1_gen default "$ctx" X=1
  GEN_GREP=$P GEN_LINES=12 b1_gen phases "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
done
b1_gen st3 4096 LLMTS_CUDA_ATT_TC_STAGES=3
b1_gen mc256 4096 LLMTS_CUDA_ATT_TC_MIN_CHUNK=256
b1_gen default2 4096 X=1
call_finish
