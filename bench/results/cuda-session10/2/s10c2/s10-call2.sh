#!/usr/bin/env bash
# session 10, call 2: why the bulk GEMVs are slow (k_gemvt_m1 22.6 us alone for 4096x4096 vs cuBLASLt's 15.0):
# Nsight Compute full sections on the k_gemvt kernels (tuner's lone runs and the graph's fused twins)
set -u
source bench/cuda-device-lib.sh
call_start s10c2 "$1"
call_wait_model
ls /usr/local/cuda/bin | tr '\n' ' '; echo
NCU=/usr/local/cuda/bin/ncu
LLMTS_CUDA_GEMV_BULK=on timeout 300 $NCU --kernel-name regex:k_gemvt --launch-count 9 --set full -f -o $W/bulk \
  node --import tsx bench/cuda-generate.ts --device cuda --model $MODEL_DIR --prompt-tokens 64 --decode-tokens 8 --repeats 1 > $W/ncu-run.log 2>&1
echo "ncu rc $?"; tail -3 $W/ncu-run.log
timeout 120 $NCU --import $W/bulk.ncu-rep --page details > $W/details.txt 2>&1
timeout 120 $NCU --import $W/bulk.ncu-rep --page raw --csv > $W/raw.csv 2>&1
grep -E "k_gemvt|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Dynamic Shared|Grid Size|Waves|Stall|L2 Hit|One or More|No Eligible|Issued Warp" $W/details.txt | head -120
xz -9f $W/raw.csv
call_finish
