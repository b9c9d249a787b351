#!/usr/bin/env bash
# session 12, call 5: ATT_TC_EARLY=1 the default: every CUDA test (cold cache); against ATT_TC_EARLY=0 at 512 and 4096;
# 512 with an 8k table (the 32k table's ~1% loss: the pool's size?); the tile ratio at 2048 (3 tiles a split; 2 and 4)
set -u
source bench/cuda-device-lib.sh
call_start s12c5 "$1"
cold_tests "$W/cuda-tests.txt" 200
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
L=LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=0
b1_gen default 512 X=1
b1_gen late 512 $L
GEN_EXTRA="--max-model-len 8192" b1_gen mml8k 512 X=1
GEN_EXTRA="--max-model-len 32768" b1_gen mml32k 512 X=1
b1_gen default 4096 X=1
b1_gen late 4096 $L
b1_gen default 2048 X=1
b1_gen r120 2048 LLMTS_CUDA_ATT_DEFINES=ATT_TC_TILE_RATIO10=120
b1_gen r40 2048 LLMTS_CUDA_ATT_DEFINES=ATT_TC_TILE_RATIO10=40
b1_gen default2 2048 X=1
call_finish
