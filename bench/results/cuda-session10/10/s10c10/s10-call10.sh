#!/usr/bin/env bash
# session 10, call 10 (last): the tree with the bulk GEMVs and the L2 prefetch removed: every CUDA test on a cold
# cache; B=1 at 512 and 4096 with the defaults
set -u
source bench/cuda-device-lib.sh
call_start s10c10 "$1"
cold_tests "$W/cuda-tests.txt" 230
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
b1_gen default1 512 X=1
b1_gen default2 512 X=1
b1_gen default1 4096 X=1
call_finish
