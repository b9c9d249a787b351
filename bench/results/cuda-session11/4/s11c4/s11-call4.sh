#!/usr/bin/env bash
# session 11, call 4: the merge's sub-phases (fence, loads, folds); ATT_TC_SYNC=1 (tid 0's atom.acq_rel) against
# the all-thread fences, at 512 and 4096; the phases test
set -u
source bench/cuda-device-lib.sh
call_start s11c4 "$1"
timeout 200 node --import tsx --test --test-name-pattern=attentionPhases test/backends/cuda-ops.test.ts > "$W/phases-test.txt" 2>&1; echo "phases test exit $?"; grep -E "^# (pass|fail)" "$W/phases-test.txt"
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
for ctx in 512 4096; do
  b1_gen default "$ctx" X=1
  b1_gen sync1 "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_SYNC=1
  GEN_GREP=$P GEN_LINES=12 b1_gen phases "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
  GEN_GREP=$P GEN_LINES=12 b1_gen sync1-phases "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1,ATT_TC_SYNC=1
  b1_gen default2 "$ctx" X=1
  b1_gen sync1-2 "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_SYNC=1
done
call_finish
