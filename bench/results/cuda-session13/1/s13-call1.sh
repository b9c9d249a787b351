#!/usr/bin/env bash
# session 13, call 1: every CUDA test (cold cache; session 12's last call ran out before the prefix-cache
# groups); cuda-decode-ab's variants with a server's table (--max-model-len 32768) at 512 and 4096 (+ graph
# profile); the decode attention alone at 64 and 256 rows, kv heads first against slots first
set -u
source bench/cuda-device-lib.sh
call_start s13c1 "$1"
cold_tests "$W/cuda-tests.txt" 220
call_wait_model
echo "== ab at $(call_elapsed) s"
MAX_MODEL_LEN=32768 timeout 260 bash bench/cuda-decode-ab.sh "$W/ab-mml"
echo "== attention alone at $(call_elapsed) s"
for b in 64 256; do for g in heads-first slots-first; do
  echo "== attention alone, $b rows, grid $g"
  LLMTS_CUDA_ATT_TC_GRID=$g timeout 45 node --import tsx bench/cuda-attention.ts --decode 512,2048 --prefill 1024 --batch $b \
    --json "$W/att-b$b-$g.json" 2>&1 | grep -E "decode|rror" | head -4
done; done
call_finish
