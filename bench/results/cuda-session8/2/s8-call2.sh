#!/usr/bin/env bash
# session 8, call 2: Nsight Compute on one B=1 decode graph replay (dense 8B, 512 context; MoE if its model is here):
# each kernel's own duration and DRAM bytes (node mode), and the whole graph's duration (graph mode)
set -u
OUT=$1
W=/tmp/s8c2; mkdir -p $W
T0=$(date +%s)
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1
NCU=/usr/local/cuda/bin/ncu
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__occupancy_limit_registers,sm__throughput.avg.pct_of_peak_sustained_elapsed
prof() { # name, model, graph-profiling mode, window
  LLMTS_CUDA_PROFILER_GRAPHS=$4 timeout 200 $NCU --profile-from-start off --cache-control none --clock-control none \
    --graph-profiling $3 --metrics $M -f -o $W/$1 node --import tsx bench/cuda-generate.ts --device cuda --model $2 \
    --prompt-tokens 512 --decode-tokens 64 --repeats 1 > $W/$1.log 2>&1
  echo "$1: rc $? at $(( $(date +%s) - T0 )) s"; tail -3 $W/$1.log
  timeout 60 $NCU --import $W/$1.ncu-rep --csv --page raw > $W/$1.csv 2>>$W/$1.log
  rm -f $W/$1.ncu-rep; xz -9 $W/$1.csv
}
prof dense-nodes $ML node 60:2
prof dense-graph $ML graph 60:4
MM=/tmp/llmts-qwen3moe-random
[ -f $MM/config.json ] && prof moe-nodes $MM node 60:2
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s8-call2.sh $W/
tar -czf $OUT/s8c2.tar.gz -C /tmp s8c2
