#!/usr/bin/env bash
# session 12, call 3: the tc decode's splits by att_tc_splits (~sqrt(tiles / 6.5) tiles a split, >= 64 keys): every CUDA
# test on a cold cache; against the old floor (LLMTS_CUDA_ATT_TC_MIN_CHUNK=128) and other tile ratios at 512, 4096, 16384;
# 512 with a 32k table (the slots a server plans: W = 45)
set -u
source bench/cuda-device-lib.sh
call_start s12c3 "$1"
cold_tests "$W/cuda-tests.txt" 240
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
OLD=LLMTS_CUDA_ATT_TC_MIN_CHUNK=128
b1_gen default 512 X=1
b1_gen old 512 $OLD
b1_gen default2 512 X=1
b1_gen old2 512 $OLD
GEN_EXTRA="--max-model-len 32768" b1_gen default-mml32k 512 X=1
GEN_EXTRA="--max-model-len 32768" b1_gen old-mml32k 512 $OLD
b1_gen default 4096 X=1
b1_gen r50 4096 LLMTS_CUDA_ATT_DEFINES=ATT_TC_TILE_RATIO10=50
b1_gen r40 4096 LLMTS_CUDA_ATT_DEFINES=ATT_TC_TILE_RATIO10=40
b1_gen old 4096 $OLD
b1_gen default2 4096 X=1
GEN_TIMEOUT=90
b1_gen default 16384 X=1
b1_gen r40 16384 LLMTS_CUDA_ATT_DEFINES=ATT_TC_TILE_RATIO10=40
call_finish
