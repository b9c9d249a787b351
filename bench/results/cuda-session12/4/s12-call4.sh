#!/usr/bin/env bash
# session 12, call 4: the slots a server plans (a 32k table: W = 45 whatever the context) cost idle blocks; with
# ATT_TC_EARLY=1 an idle block exits before the PDL wait. Every CUDA test with ATT_TC_EARLY=1 (cold cache); A/B at 512 and
# 4096 with a 32k table and at 512 with the bench's; phases with a 32k table
set -u
source bench/cuda-device-lib.sh
call_start s12c4 "$1"
LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1 cold_tests "$W/cuda-tests-early.txt" 200
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
E=LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1
P='^decode|rror|phases|^  [a-z]'
export GEN_EXTRA="--max-model-len 32768"
b1_gen mml-default 512 X=1
b1_gen mml-early 512 $E
b1_gen mml-default2 512 X=1
b1_gen mml-early2 512 $E
b1_gen mml-default 4096 X=1
b1_gen mml-early 4096 $E
GEN_GREP=$P GEN_LINES=12 b1_gen mml-phases 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
GEN_GREP=$P GEN_LINES=12 b1_gen mml-phases-early 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1,ATT_TC_EARLY=1
export GEN_EXTRA=""
b1_gen default 512 X=1
b1_gen early 512 $E
call_finish
