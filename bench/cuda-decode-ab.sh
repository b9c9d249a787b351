#!/usr/bin/env bash
# B=1 decode A/B on the GPU machine: bench/cuda-generate.ts on Llama-3.1-8B shapes (made by
# bench/make_random_llama.py unless MODEL_DIR has one) with the defaults, then with each variant's
# environment, at a 512- and a 4k-token context; then one run with --profile-graph (the kernels
# inside the decode graph's last replay, and the gaps between them). One command:
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-decode-ab.sh $OUT
#
# VARIANTS: space-separated "name:NAME=VALUE,NAME=VALUE" (default: the decode attention's ring at 3 and
# 4 stages, its shortest split at 64 keys, and the rope epilogue in the q/k/v GEMV: each measured no
# faster before session 11 cut the attention's merge and code; and rope's v loads where they were
# before session 11, which has not been timed; the attention's reads before its PDL wait (+0.0-0.5% in
# sessions 7, 8 and 11); and 4 stages with 256-key splits (at 4k half the splits, so the merging
# block pulls half the partials, 33 KB, through its SM, with 8 tiles a split in flight four at a
# time); session 6's switches were
# flush-write:LLMTS_CUDA_TUNE_FLUSH=write glu-off:LLMTS_CUDA_GLU_EPILOGUE=off; session 10's margin-1.1:LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION=1.1).
# Output: OUT/run.log (every run's lines) and OUT/results.tar.gz (their JSON; bench/device-out.sh).
# CONTEXTS (default "512 4096"), PROFILE_BATCH (rows of the profiled step, default 1), MODEL_DIR (default
# /tmp/llmts-llama8b-random), DEVICE (cuda; cpu
# with MODEL_DIR=models/demo tests the plumbing).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-decode-ab}
source bench/cuda-device-lib.sh
VARIANTS=${VARIANTS:-"st3:LLMTS_CUDA_ATT_TC_STAGES=3 st4:LLMTS_CUDA_ATT_TC_STAGES=4 mc64:LLMTS_CUDA_ATT_TC_MIN_CHUNK=64 rope-epilogue:LLMTS_CUDA_ROPE_EPILOGUE=on rope-v-late:LLMTS_CUDA_FUSED_DEFINES=ROPE_V_EARLY=0 early:LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=1 st4-mc256:LLMTS_CUDA_ATT_TC_STAGES=4,LLMTS_CUDA_ATT_TC_MIN_CHUNK=256"}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
source bench/device-out.sh
trap 'out_pack "$OUT"' EXIT
make_model "$OUT/make-model.log" || exit 1
GEN_DIR=$OUT
GEN_GREP="^(decode|graph|layer|  |rror)|Error"
gen() { b1_gen "$@"; }
for ctx in ${CONTEXTS:-512 4096}; do
  gen default "$ctx" X=1
  for v in $VARIANTS; do
    name=${v%%:*}; settings=${v#*:}
    IFS=, read -r -a envs <<< "$settings"
    gen "$name" "$ctx" "${envs[@]}"
  done
done
GEN_EXTRA="--profile-graph --profile-batch ${PROFILE_BATCH:-1}" GEN_LINES=40 gen graph-profile 512 X=1
