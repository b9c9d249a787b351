#!/usr/bin/env bash
# session 14, call 1: GEMV_L2_EVICT_FIRST=1 (weight loads evict their L2 lines first) against the default,
# a server's 32k table, 512 and 4096, each twice in alternation
set -u
source bench/cuda-device-lib.sh
call_start s14c1 "$1"
call_wait_model
E=LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_EVICT_FIRST=1
MAX_MODEL_LEN=32768 VARIANTS="evict-first:$E default2:X=2 evict-first2:$E" timeout 200 bash bench/cuda-decode-ab.sh "$W/ab"
call_finish
