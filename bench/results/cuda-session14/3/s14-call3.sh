#!/usr/bin/env bash
# session 14, call 3: the tensor-core decode attention's cluster merge (k_attn_decode_tcc_d<D>,
# LLMTS_CUDA_ATT_TC_CLUSTER=on): its cuda-ops test alone first; then B=1 with a server's table at 512
# and 4096, on against off; its phases at 512; then every CUDA test on a cold cache with it on
set -u
source bench/cuda-device-lib.sh
call_start s14c3 "$1"
timeout 180 node --import tsx --test --test-name-pattern="in clusters" test/backends/cuda-ops.test.ts > "$W/cluster-test.txt" 2>&1
echo "cluster test exit $?"
grep -E '^# (tests|pass|fail)|not ok|rror' "$W/cluster-test.txt" | head -12
call_wait_model
C=LLMTS_CUDA_ATT_TC_CLUSTER=on
MAX_MODEL_LEN=32768 VARIANTS="cluster:$C default2:X=2 cluster2:$C" timeout 150 bash bench/cuda-decode-ab.sh "$W/ab"
GEN_TIMEOUT=40 GEN_EXTRA="--max-model-len 32768" GEN_GREP='^decode|rror|phases|^  [a-z]' GEN_LINES=12 b1_gen phases-cluster 512 $C LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
export LLMTS_CUDA_ATT_TC_CLUSTER=on
cold_tests "$W/cuda-tests-cluster.txt" 200
call_finish
