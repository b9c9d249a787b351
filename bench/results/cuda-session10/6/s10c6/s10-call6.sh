#!/usr/bin/env bash
# session 10, call 6: where the B=1 decode attention's ~12.6 us goes (2 MB of KV at 512 context):
# Nsight Compute full sections and SASS stall samples for one k_attn_decode_tc_d128 launch in a decode graph
set -u
source bench/cuda-device-lib.sh
call_start s10c6 "$1"
call_wait_model
NCU=/usr/local/cuda/bin/ncu
timeout 240 $NCU --kernel-name regex:k_attn_decode_tc --launch-skip 200 --launch-count 1 --set full -f -o $W/att \
  node --import tsx bench/cuda-generate.ts --device cuda --model $MODEL_DIR --prompt-tokens 512 --decode-tokens 16 --repeats 1 > $W/ncu-run.log 2>&1
echo "ncu rc $?"; tail -2 $W/ncu-run.log
timeout 60 $NCU --import $W/att.ncu-rep --page source --csv --print-source sass > $W/source.csv 2> $W/source.err
timeout 60 $NCU --import $W/att.ncu-rep --page details > $W/details.txt 2>&1
timeout 60 $NCU --import $W/att.ncu-rep --page raw --csv > $W/raw.csv 2>&1
grep -E "^  k_|Duration|DRAM Throughput|Executed Instructions  |Grid Size|Block Size|Registers Per|Achieved Occupancy|Issue Slots|Dynamic Shared|Static Shared" $W/details.txt | head -20
xz -9f $W/raw.csv $W/source.csv $W/details.txt; rm -f $W/att.ncu-rep
call_finish
