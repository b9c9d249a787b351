#!/usr/bin/env bash
# session 10, call 7: the L2 weight prefetch hint (k_l2_prefetch between rope and the decode attention):
# cuda-modules + cuda-ops on a cold cache; B=1 default vs LLMTS_CUDA_L2_PREFETCH_MB=32 (o) and 44 (o + 12 MiB of gate/up)
set -u
source bench/cuda-device-lib.sh
call_start s10c7 "$1"
CUDA_TEST_FILES=(test/backends/cuda-modules.test.ts test/backends/cuda-ops.test.ts)
cold_tests "$W/cuda-tests.txt" 150
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
b1_gen default1 512 X=1
b1_gen pf32-1 512 LLMTS_CUDA_L2_PREFETCH_MB=32
b1_gen pf44-1 512 LLMTS_CUDA_L2_PREFETCH_MB=44
b1_gen default2 512 X=1
b1_gen pf32-2 512 LLMTS_CUDA_L2_PREFETCH_MB=32
b1_gen pf44-2 512 LLMTS_CUDA_L2_PREFETCH_MB=44
b1_gen default1 4096 X=1
b1_gen pf32-1 4096 LLMTS_CUDA_L2_PREFETCH_MB=32
call_finish
