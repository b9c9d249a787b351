#!/usr/bin/env bash
# session 14, call 9 (commit 851edd2): Nsight Compute on one launch of the prefill attention (8B heads, 8k causal
# prefill, 3-stage ring): where its warps stall, its pipes' use, occupancy (for the next session's rewrite)
set -u
source bench/cuda-device-lib.sh
call_start s14c9 "$1"
NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout 200 "$NCU" --kernel-name k_attn_prefill_d128 --launch-skip 1 --launch-count 1 --cache-control all --clock-control base \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
  --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats \
  -f -o "$W/prefill" node --import tsx bench/cuda-attention.ts --decode 512 --prefill 8192 > "$W/ncu-run.log" 2>&1
echo "ncu exit $?"; tail -3 "$W/ncu-run.log"
timeout 60 "$NCU" --import "$W/prefill.ncu-rep" --page details > "$W/prefill-details.txt" 2>&1
grep -E "Duration|Throughput|Warp Cycles|Stall|Issued|Occupancy|Registers|Pipe|Eligible|Active Warps|No Eligible|Bank" "$W/prefill-details.txt" | head -70
timeout 60 "$NCU" --import "$W/prefill.ncu-rep" --csv --page raw > "$W/prefill-raw.csv" 2>&1
grep -o 'smsp__pcsamp_warps_issue_stalled_[a-z_]*' "$W/prefill-raw.csv" | head -0
rm -f "$W/prefill.ncu-rep"; xz -9f "$W/prefill-raw.csv"
call_finish
