#!/usr/bin/env bash
# session 14, call 4: the cluster merge where a kv head's splits fit one cluster at 512 (LLMTS_CUDA_ATT_TC_MIN_CHUNK
# 96 / 128: 6-7 / 5 splits at 513-640 keys, against 9-10 at 64), against the same chunks without clusters
# and the default; a server's table, 512 only
set -u
source bench/cuda-device-lib.sh
call_start s14c4 "$1"
call_wait_model
C=LLMTS_CUDA_ATT_TC_CLUSTER=on
M=LLMTS_CUDA_ATT_TC_MIN_CHUNK
MAX_MODEL_LEN=32768 CONTEXTS=512 VARIANTS="cl-mc96:$C,$M=96 mc96:$M=96 cl-mc128:$C,$M=128 mc128:$M=128 default2:X=2 cl-mc96b:$C,$M=96" timeout 150 bash bench/cuda-decode-ab.sh "$W/ab"
GEN_TIMEOUT=40 GEN_EXTRA="--max-model-len 32768" GEN_GREP='^decode|rror|phases|^  [a-z]' GEN_LINES=12 b1_gen phases-cl-mc96 512 $C $M=96 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
call_finish
