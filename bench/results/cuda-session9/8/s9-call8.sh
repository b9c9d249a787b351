#!/usr/bin/env bash
# session 9, call 8 (last, ~5 min of device left): the CUDA tests on a cold cache at the tree with the LLMTS_* knob
# parser and the wider persistent GEMV candidates (first use of bench/cuda-device-lib.sh on the GPU); B=1 at 512:
# the tuner's picks (down may take k_gemvp w4) against down pinned to k_gemv_m1_u8/w8, alternating; norm fusion off once
set -u
source bench/cuda-device-lib.sh
call_start s9c8 "$1"
cold_tests "$W/cuda-tests.txt" 170
call_wait_model
GEN_TIMEOUT=40 GEN_GREP="^decode|rror|1x4096x14336"
b1_gen default1 512 X=1
b1_gen down-u8w8-1 512 LLMTS_CUDA_GEMV_PICKS=1x4096x14336=k_gemv_m1_u8/w8
b1_gen default2 512 X=1
b1_gen down-u8w8-2 512 LLMTS_CUDA_GEMV_PICKS=1x4096x14336=k_gemv_m1_u8/w8
b1_gen fuse-norm-off 512 LLMTS_CUDA_FUSE_NORM=off
call_finish
