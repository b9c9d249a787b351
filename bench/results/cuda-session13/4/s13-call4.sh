#!/usr/bin/env bash
# session 13, call 4: the attention triggering after its split's count (ATT_TC_TRIGGER=1) with o on our
# GEMVs: u8/w4, u8/w2, the persistent one, the tuner's pick at an after-attention margin of 1.2, and rope
# triggering at exit (ROPE_TRIGGER=1); a server's table, 512 and 4096; then 64 x 512/256 throughput,
# default against ATT_TC_TRIGGER=1 (B > 1)
set -u
source bench/cuda-device-lib.sh
call_start s13c4 "$1"
call_wait_model
P=LLMTS_CUDA_GEMV_PICKS=1x4096x4096
T=LLMTS_CUDA_ATT_DEFINES=ATT_TC_TRIGGER=1
MAX_MODEL_LEN=32768 VARIANTS="t1-o8w4:$T,$P=k_gemv_m1_u8/w4 t1-o8w2:$T,$P=k_gemv_m1_u8/w2 t1-ogemvp:$T,$P=k_gemvp_m1_u16/w1/b2 t1-o8w4-rope1:$T,$P=k_gemv_m1_u8/w4,LLMTS_CUDA_FUSED_DEFINES=ROPE_TRIGGER=1 t1-m12:$T,LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION=1.2 default2:X=2 t1-o8w4b:$T,$P=k_gemv_m1_u8/w4" \
  timeout 300 bash bench/cuda-decode-ab.sh "$W/ab"
grep -h -o '"shape":"1x4096x4096[^}]*}' $W/ab/*.json 2>/dev/null | head -3
for v in default t1 default2 t1b; do
  E=X=1; case $v in t1*) E=$T;; esac
  echo "== throughput 64 x 512/256, $v"
  env $E timeout 60 node --import tsx bench/cuda-throughput.ts --model "$MODEL_DIR" --device cuda --requests 64 --input-tokens 512 \
    --output-tokens 256 --max-batch 64 --json "$W/tp-$v.json" 2>&1 | grep -E "output tok/s|rror" | head -3
done
call_finish
