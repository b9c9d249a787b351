#!/usr/bin/env bash
# B=1 decode A/B on the GPU machine: bench/cuda-generate.ts on Llama-3.1-8B shapes (made by
# bench/make_random_llama.py unless MODEL_DIR has one) with the defaults, then with each variant's
# environment, at a 512- and a 4k-token context; then one run with --profile-graph (the kernels
# inside the decode graph's last replay, and the gaps between them). One command:
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-decode-ab.sh $OUT
#
# VARIANTS: space-separated "name:NAME=VALUE,NAME=VALUE" (default: the weight loads as plain streaming
# loads, GEMV_L2_EVICT_FIRST=0; the tc attention triggering its dependents once its splits are counted
# (split), at entry with o on cuBLASLt, and at exit; o on cuBLASLt and on k_gemv_m1_u8/w2; the rope
# epilogue). Other variants the knobs allow: slots-first:LLMTS_CUDA_ATT_TC_GRID=slots-first,
# mc128:LLMTS_CUDA_ATT_TC_MIN_CHUNK=128, late:LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=0,
# st3:LLMTS_CUDA_ATT_TC_STAGES=3, rope-v-late:LLMTS_CUDA_FUSED_DEFINES=ROPE_V_EARLY=0,
# flush-write:LLMTS_CUDA_TUNE_FLUSH=write, glu-off:LLMTS_CUDA_GLU_EPILOGUE=off,
# margin-1.1:LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION=1.1. What each measured against the defaults:
# BENCHMARKS.md ("CUDA decode" and "Tried and dropped").
# MAX_MODEL_LEN: the engine's longest row (--max-model-len; default: the run's own length, so the
# attention's slots fit the context; a server plans them for its max model length, e.g. 32768).
# Output: OUT/run.log (every run's lines) and OUT/results.tar.gz (their JSON; bench/device-out.sh).
# CONTEXTS (default "512 4096"), PROFILE_BATCH (rows of the profiled step, default 1), MODEL_DIR (default
# /tmp/llmts-llama8b-random), DEVICE (cuda; cpu
# with MODEL_DIR=models/demo tests the plumbing).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-decode-ab}
source bench/cuda-device-lib.sh
VARIANTS=${VARIANTS:-"evict-off:LLMTS_CUDA_GEMV_DEFINES=GEMV_L2_EVICT_FIRST=0 split:LLMTS_CUDA_ATT_TC_TRIGGER=split entry-cublas:LLMTS_CUDA_ATT_TC_TRIGGER=entry,LLMTS_CUDA_GEMV_PICKS=1x4096x4096=cublaslt exit:LLMTS_CUDA_ATT_TC_TRIGGER=exit o-cublas:LLMTS_CUDA_GEMV_PICKS=1x4096x4096=cublaslt o-w2:LLMTS_CUDA_GEMV_PICKS=1x4096x4096=k_gemv_m1_u8/w2 rope-epilogue:LLMTS_CUDA_ROPE_EPILOGUE=on"}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
source bench/device-out.sh
trap 'out_pack "$OUT"' EXIT
make_model "$OUT/make-model.log" || exit 1
GEN_DIR=$OUT
GEN_GREP="^(decode|graph|layer|  |rror)|Error"
MML=${MAX_MODEL_LEN:+--max-model-len $MAX_MODEL_LEN}
gen() { GEN_EXTRA="${GEN_EXTRA:-} $MML" b1_gen "$@"; }
for ctx in ${CONTEXTS:-512 4096}; do
  gen default "$ctx" X=1
  for v in $VARIANTS; do
    name=${v%%:*}; settings=${v#*:}
    IFS=, read -r -a envs <<< "$settings"
    gen "$name" "$ctx" "${envs[@]}"
  done
done
GEN_EXTRA="--profile-graph --profile-batch ${PROFILE_BATCH:-1}" GEN_LINES=40 gen graph-profile 512 X=1
