#!/usr/bin/env bash
# session 14, call 2: every CUDA test on a cold cache with the GEMVs' evict-first weight loads (the new
# default); B=1 with a server's table at 512 and 4096: evict-off, the attention's KV copies with an L2
# policy (ATT_TC_KV_L2=1 evict_first, 2 evict_last on half), o on cuBLASLt; 64 x 512/256 throughput,
# evict-first against evict-off (B > 1)
set -u
source bench/cuda-device-lib.sh
call_start s14c2 "$1"
cold_tests "$W/cuda-tests.txt" 200
call_wait_model
A=LLMTS_CUDA_ATT_DEFINES=ATT_TC_KV_L2
EO=LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_EVICT_FIRST=0
MAX_MODEL_LEN=32768 VARIANTS="evict-off:$EO kv-ef:$A=1 kv-el:$A=2 o-cublas:LLMTS_CUDA_GEMV_PICKS=1x4096x4096=cublaslt default2:X=2" timeout 170 bash bench/cuda-decode-ab.sh "$W/ab"
for v in default evict-off default2 evict-off2; do
  E=X=1; case $v in evict-off*) E=$EO;; esac
  echo "== throughput 64 x 512/256, $v"
  env $E timeout 45 node --import tsx bench/cuda-throughput.ts --model "$MODEL_DIR" --device cuda --requests 64 --input-tokens 512 \
    --output-tokens 256 --max-batch 64 --json "$W/tp-$v.json" 2>&1 | grep -E "output tok/s|rror" | head -3
done
call_finish
