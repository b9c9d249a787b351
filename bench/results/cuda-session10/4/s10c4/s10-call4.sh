#!/usr/bin/env bash
# session 10, call 4: bulk GEMVs with the row copies issued one a lane (was: lane 0 all 16): cuda-ops and
# cuda-fused on a cold cache; B=1 default vs bulk at 512, and bulk with 128- and 512-column units
set -u
source bench/cuda-device-lib.sh
call_start s10c4 "$1"
CUDA_TEST_FILES=(test/backends/cuda-ops.test.ts test/backends/cuda-fused.test.ts)
cold_tests "$W/cuda-tests.txt" 150
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror|^gemm|rap|fail" GEN_LINES=12
b1_gen default1 512 X=1
b1_gen bulk1 512 LLMTS_CUDA_GEMV_BULK=on
b1_gen bulk-p128 512 LLMTS_CUDA_GEMV_BULK=on LLMTS_CUDA_GEMVT_PART_COLS=128
b1_gen bulk-p512 512 LLMTS_CUDA_GEMV_BULK=on LLMTS_CUDA_GEMVT_PART_COLS=512
NCU=/usr/local/cuda/bin/ncu
LLMTS_CUDA_GEMV_BULK=on timeout 150 $NCU --kernel-name regex:k_gemvt --launch-count 12 --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section InstructionStats -f -o $W/bulk \
  node --import tsx bench/cuda-generate.ts --device cuda --model $MODEL_DIR --prompt-tokens 64 --decode-tokens 8 --repeats 1 > $W/ncu-run.log 2>&1
echo "ncu rc $?"
timeout 60 $NCU --import $W/bulk.ncu-rep --page details > $W/details.txt 2>&1
grep -E "^  k_gemvt|Duration|DRAM Throughput|Executed Instructions  " $W/details.txt | head -48
rm -f $W/bulk.ncu-rep
call_finish
