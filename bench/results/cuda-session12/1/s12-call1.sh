#!/usr/bin/env bash
# session 12, call 1: every CUDA test on a cold cache; cuda-decode-ab's default variants at 512 and 4096
# (+ graph profile); phases of the default and of 4 stages at 512
set -u
source bench/cuda-device-lib.sh
call_start s12c1 "$1"
cold_tests "$W/cuda-tests.txt" 240
call_wait_model
bash bench/cuda-decode-ab.sh "$W/ab"
GEN_TIMEOUT=60
P='^decode|rror|phases|^  [a-z]'
GEN_GREP=$P GEN_LINES=12 b1_gen phases 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
GEN_GREP=$P GEN_LINES=12 b1_gen phases-st4 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1 LLMTS_CUDA_ATT_TC_STAGES=4
call_finish
