#!/usr/bin/env bash
# session 13, call 6: the merge run dry before the PDL wait (ATT_TC_WARM=1: its instructions in the SM's
# cache when the merging block needs them) against the noinline call alone (2) and the default (inline);
# a server's table, 512 and 4096; phases at 512
set -u
source bench/cuda-device-lib.sh
call_start s13c6 "$1"
call_wait_model
A=LLMTS_CUDA_ATT_DEFINES=ATT_TC_WARM
MAX_MODEL_LEN=32768 VARIANTS="warm1:$A=1 warm2:$A=2 default2:X=2 warm1b:$A=1" timeout 200 bash bench/cuda-decode-ab.sh "$W/ab"
GEN_TIMEOUT=60 GEN_EXTRA="--max-model-len 32768" GEN_GREP='^decode|rror|phases|^  [a-z]' GEN_LINES=12
b1_gen phases 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
b1_gen phases-warm1 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1,ATT_TC_WARM=1
call_finish
