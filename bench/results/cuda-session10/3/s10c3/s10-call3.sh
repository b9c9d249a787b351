#!/usr/bin/env bash
# session 10, call 3: the bulk GEMVs rewritten (a ring a warp, no block barrier in the loop, mma.sync):
# the CUDA tests on a cold cache; B=1 default vs LLMTS_CUDA_GEMV_BULK=on at 512; ncu on k_gemvt kernels
set -u
source bench/cuda-device-lib.sh
call_start s10c3 "$1"
cold_tests "$W/cuda-tests.txt" 230
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror|^gemm|rap|fail" GEN_LINES=12
b1_gen default1 512 X=1
b1_gen bulk1 512 LLMTS_CUDA_GEMV_BULK=on
b1_gen default2 512 X=1
b1_gen bulk2 512 LLMTS_CUDA_GEMV_BULK=on
NCU=/usr/local/cuda/bin/ncu
LLMTS_CUDA_GEMV_BULK=on timeout 200 $NCU --kernel-name regex:k_gemvt --launch-count 12 --section SpeedOfLight --section WarpStateStats \
  --section LaunchStats --section SchedulerStats --section InstructionStats -f -o $W/bulk \
  node --import tsx bench/cuda-generate.ts --device cuda --model $MODEL_DIR --prompt-tokens 64 --decode-tokens 8 --repeats 1 > $W/ncu-run.log 2>&1
echo "ncu rc $?"
timeout 60 $NCU --import $W/bulk.ncu-rep --page details > $W/details.txt 2>&1
grep -E "^  k_gemvt|Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Dynamic Shared" $W/details.txt | head -80
rm -f $W/bulk.ncu-rep
call_finish
