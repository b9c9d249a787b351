#!/usr/bin/env bash
# session 13, call 2: the o projection on a one-shot GEMV that waits before its first weight loads
# (GEMV_LATE_U16 / GEMV_LATE_U8 in LLMTS_CUDA_GEMV_DEFINES) against early loads and cuBLASLt, with a
# server's table (--max-model-len 32768), at 512 and 4096; the attention's phases at 512
set -u
source bench/cuda-device-lib.sh
call_start s13c2 "$1"
call_wait_model
P16=LLMTS_CUDA_GEMV_PICKS=1x4096x4096=k_gemv_m1_u16
P8=LLMTS_CUDA_GEMV_PICKS=1x4096x4096=k_gemv_m1_u8
MAX_MODEL_LEN=32768 VARIANTS="o16w2:$P16/w2 o16w2-late:$P16/w2,LLMTS_CUDA_GEMV_DEFINES=GEMV_LATE_U16=1 o16w1-late:$P16/w1,LLMTS_CUDA_GEMV_DEFINES=GEMV_LATE_U16=1 o8w4-late8:$P8/w4,LLMTS_CUDA_GEMV_DEFINES=GEMV_LATE_U8=1 late8:LLMTS_CUDA_GEMV_DEFINES=GEMV_LATE_U8=1 default2:X=2 o16w2-late2:$P16/w2,LLMTS_CUDA_GEMV_DEFINES=GEMV_LATE_U16=1" \
  timeout 330 bash bench/cuda-decode-ab.sh "$W/ab"
GEN_TIMEOUT=60 GEN_EXTRA="--max-model-len 32768" GEN_GREP='^decode|rror|phases|^  [a-z]' GEN_LINES=12 b1_gen phases 512 LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
call_finish
