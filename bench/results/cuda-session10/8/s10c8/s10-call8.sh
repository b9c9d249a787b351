#!/usr/bin/env bash
# session 10, call 8: the L2 prefetch hint lost 4% at B=1 (call 7): is it the extra kernel in the PDL chain or
# the prefetch traffic? B=1 at 512: default vs LLMTS_CUDA_L2_PREFETCH_MB=1 (a launch, ~no traffic) and 8
set -u
source bench/cuda-device-lib.sh
call_start s10c8 "$1"
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
b1_gen default1 512 X=1
b1_gen pf1-1 512 LLMTS_CUDA_L2_PREFETCH_MB=1
b1_gen pf8-1 512 LLMTS_CUDA_L2_PREFETCH_MB=8
b1_gen default2 512 X=1
b1_gen pf1-2 512 LLMTS_CUDA_L2_PREFETCH_MB=1
b1_gen pf8-2 512 LLMTS_CUDA_L2_PREFETCH_MB=8
call_finish
