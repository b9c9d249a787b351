#!/usr/bin/env bash
# session 11, call 6 (an uncommitted experiment tree): the merge run twice in a row (phases mload2/mfold2: the same
# work with the code and data warm) at 512 and 4096; the decode graph's kernel profile at 512
set -u
source bench/cuda-device-lib.sh
call_start s11c6 "$1"
call_wait_model
GEN_TIMEOUT=60 GEN_GREP="^decode|rror" GEN_LINES=4
P='^decode|rror|phases|^  [a-z]'
for ctx in 512 4096; do
  GEN_GREP=$P GEN_LINES=14 b1_gen twice-phases "$ctx" LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
done
GEN_GREP="^(decode|graph|layer|  |rror)|Error" GEN_EXTRA="--profile-graph --profile-batch 1" GEN_LINES=60 b1_gen graph-profile 512 X=1
call_finish
