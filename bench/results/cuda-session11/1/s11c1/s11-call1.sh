#!/usr/bin/env bash
# session 11, call 1: session 10's attention changes (block-table prologue, one-pass merge, phase counters)
# on the GPU: every CUDA test on a cold cache; phases at 512 and 4096; stages 3/4 and early at both
set -u
source bench/cuda-device-lib.sh
call_start s11c1 "$1"
cold_tests "$W/cuda-tests.txt" 240
node --import tsx tools/device/kernel-resources.ts --filter attn_decode 2>&1 | head -20 > "$W/attn-resources.txt"; cat "$W/attn-resources.txt"
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
b1_gen default 512 X=1
GEN_GREP='^decode|rror|phases|^  [a-z]' GEN_LINES=12 b1_gen phases 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
b1_gen default 4096 X=1
GEN_GREP='^decode|rror|phases|^  [a-z]' GEN_LINES=12 b1_gen phases 4096 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
call_finish
