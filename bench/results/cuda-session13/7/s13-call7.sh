#!/usr/bin/env bash
# session 13, call 7 (last): every CUDA test on a cold cache with LLMTS_CUDA_ATT_TC_TRIGGER=loaded (a merging
# block lets o launch once its partials have landed, not before its merge); loaded against split (the
# default) and exit, a server's table, 512 and 4096; phases with loaded at 512
set -u
source bench/cuda-device-lib.sh
call_start s13c7 "$1"
export LLMTS_CUDA_ATT_TC_TRIGGER=loaded
cold_tests "$W/cuda-tests-loaded.txt" 200
unset LLMTS_CUDA_ATT_TC_TRIGGER
call_wait_model
T=LLMTS_CUDA_ATT_TC_TRIGGER
MAX_MODEL_LEN=32768 VARIANTS="loaded:$T=loaded exit:$T=exit default2:X=2 loaded2:$T=loaded" timeout 170 bash bench/cuda-decode-ab.sh "$W/ab"
GEN_TIMEOUT=40 GEN_EXTRA="--max-model-len 32768" GEN_GREP='^decode|rror|phases|^  [a-z]' GEN_LINES=12 b1_gen phases-loaded 512 $T=loaded LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
call_finish
