#!/usr/bin/env bash
# session 12, call 6 (last): the tc decode's grid kv heads first (LLMTS_CUDA_ATT_TC_GRID=heads-first, the default): every
# CUDA test (cold cache); against slots-first at 512 (the bench's table and a 32k one) and 4096 (32k table)
set -u
source bench/cuda-device-lib.sh
call_start s12c6 "$1"
cold_tests "$W/cuda-tests.txt" 110
call_wait_model
GEN_TIMEOUT=40 GEN_GREP="^decode|rror" GEN_LINES=4
S=LLMTS_CUDA_ATT_TC_GRID=slots-first
GEN_EXTRA="--max-model-len 32768" b1_gen mml-default 512 X=1
GEN_EXTRA="--max-model-len 32768" b1_gen mml-slots 512 $S
b1_gen default 512 X=1
b1_gen slots 512 $S
GEN_EXTRA="--max-model-len 32768" b1_gen mml-default 4096 X=1
GEN_EXTRA="--max-model-len 32768" b1_gen mml-slots 4096 $S
call_finish
