#!/usr/bin/env bash
# session 10, call 1: the CUDA tests on a cold cache (first GPU run of the bulk GEMV tests); B=1 default vs
# LLMTS_CUDA_GEMV_BULK=on at 512 and 4096, alternating
set -u
source bench/cuda-device-lib.sh
call_start s10c1 "$1"
cold_tests "$W/cuda-tests.txt" 230
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror|^gemm|rap|fail" GEN_LINES=12
b1_gen default1 512 X=1
b1_gen bulk1 512 LLMTS_CUDA_GEMV_BULK=on
b1_gen default2 512 X=1
b1_gen bulk2 512 LLMTS_CUDA_GEMV_BULK=on
b1_gen default1 4096 X=1
b1_gen bulk1 4096 LLMTS_CUDA_GEMV_BULK=on
call_finish
