#!/usr/bin/env bash
# session 8, call 6: Nsight Compute sections for the staged GEMV (forced, o projection) and k_gemv_m1_u8 (down) in
# the B=1 decode graph
set -u
OUT=$1
W=/tmp/s8c6; mkdir -p $W
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1
NCU=/usr/local/cuda/bin/ncu
LLMTS_CUDA_GEMV=k_gemvs_m1 LLMTS_CUDA_PROFILER_GRAPHS=60:1 timeout 240 $NCU --profile-from-start off --cache-control none --clock-control none \
  -k regex:'k_gemv(s_m1|_m1_u8)' -c 4 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis -f -o $W/staged node --import tsx bench/cuda-generate.ts --device cuda --model $ML \
  --prompt-tokens 512 --decode-tokens 64 --repeats 1 > $W/staged.log 2>&1
echo "ncu rc $?"
timeout 60 $NCU --import $W/staged.ncu-rep --print-details all > $W/staged.txt 2>&1
rm -f $W/staged.ncu-rep
grep -E "k_gemv|Duration|DRAM Throughput|Memory Throughput|Registers|Shared Memory Config|Dynamic Shared|Achieved Occupancy|Warp Cycles Per Issued|Stall|L1/TEX Hit|Mem Busy|Max Bandwidth" $W/staged.txt | head -80
cp .device/s8-call6.sh $W/
tar -czf $OUT/s8c6.tar.gz -C /tmp s8c6
