#!/usr/bin/env bash
# session 11, call 5: ATT_TC_SYNC=1 as the default (every CUDA test, cold cache); where the merge's fold time
# goes (phases with PDL off); when the attention lets the o projection launch (ATT_TC_TRIGGER 1, 2)
set -u
source bench/cuda-device-lib.sh
call_start s11c5 "$1"
cold_tests "$W/cuda-tests.txt" 240
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
GEN_GREP=$P GEN_LINES=12 b1_gen pdl-off-phases 512 LLMTS_CUDA_PDL=off LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
for ctx in 512 4096; do
  b1_gen default "$ctx" X=1
  b1_gen trig1 "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_TRIGGER=1
  b1_gen trig2 "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_TRIGGER=2
  GEN_GREP=$P GEN_LINES=12 b1_gen trig1-phases "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1,ATT_TC_TRIGGER=1
  b1_gen default2 "$ctx" X=1
done
call_finish
