#!/usr/bin/env bash
# session 13, call 3: when the decode attention lets the next kernel launch (ATT_TC_TRIGGER in
# LLMTS_CUDA_ATT_DEFINES: 0 after its wait, 1 after a split counts itself, 2 at exit), with o on cuBLASLt
# (no PDL) and on our one-shot GEMVs (PDL into gate/up); a server's table, 512 and 4096
set -u
source bench/cuda-device-lib.sh
call_start s13c3 "$1"
call_wait_model
P16=LLMTS_CUDA_GEMV_PICKS=1x4096x4096=k_gemv_m1_u16
P8=LLMTS_CUDA_GEMV_PICKS=1x4096x4096=k_gemv_m1_u8
T=LLMTS_CUDA_ATT_DEFINES=ATT_TC_TRIGGER
MAX_MODEL_LEN=32768 VARIANTS="trig1:$T=1 o8w4:$P8/w4 o8w4-trig1:$P8/w4,$T=1 o8w4-trig2:$P8/w4,$T=2 o16w2-trig1:$P16/w2,$T=1 default2:X=2 o8w4-trig1b:$P8/w4,$T=1" \
  timeout 330 bash bench/cuda-decode-ab.sh "$W/ab"
call_finish
