#!/usr/bin/env bash
# session 12, call 2: the split plan (LLMTS_CUDA_ATT_TC_MIN_CHUNK x the new LLMTS_CUDA_ATT_TC_MAX_SPLITS) at 512, 4096
# and 16384; phases of mc64 at 512; the graph profile of the rope epilogue
set -u
source bench/cuda-device-lib.sh
call_start s12c2 "$1"
node --import tsx --test test/backends/cuda-ops.test.ts > "$W/cuda-ops.txt" 2>&1; echo "cuda-ops exit $?"; grep -E '^# (pass|fail)' "$W/cuda-ops.txt"
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
M64=LLMTS_CUDA_ATT_TC_MIN_CHUNK=64
b1_gen default 512 X=1
b1_gen mc64x32 512 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=32
b1_gen mc32x32 512 LLMTS_CUDA_ATT_TC_MIN_CHUNK=32 LLMTS_CUDA_ATT_TC_MAX_SPLITS=32
b1_gen default2 512 X=1
b1_gen mc64x32-2 512 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=32
GEN_GREP=$P GEN_LINES=12 b1_gen phases-mc64 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1 $M64
b1_gen default 4096 X=1
b1_gen mc64x32 4096 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=32
b1_gen mc64x24 4096 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=24
b1_gen mc64x16 4096 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=16
b1_gen default2 4096 X=1
b1_gen mc64x32-2 4096 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=32
GEN_TIMEOUT=90
b1_gen default 16384 X=1
b1_gen mc64x32 16384 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=32
b1_gen mc64x64 16384 $M64 LLMTS_CUDA_ATT_TC_MAX_SPLITS=64
GEN_EXTRA="--profile-graph --profile-batch 1" GEN_GREP="^(decode|graph|layer|  |rror)|Error" GEN_LINES=40 b1_gen profile-rope-epi 512 LLMTS_CUDA_ROPE_EPILOGUE=on
call_finish
