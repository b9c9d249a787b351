#!/usr/bin/env bash
# Mixture-of-experts on the GPU machine: a random-weight model with
# Qwen3-30B-A3B's layers (hidden 2048, 32 heads of 128 on 4 kv heads, 128 experts of 768, top-8,
# vocab 151936; LAYERS of its 48, default 24: 30 GB of bf16, which the 64 GB disk holds with room),
# then, with the defaults and with each variant's environment: B=1 decode after a 2,048-token prompt
# (bench/cuda-generate.ts: prefill tok/s, decode tok/s and the bytes a token reads, router and its 8
# experts, against copy bandwidth) and a 16-request batch (bench/cuda-throughput.ts: 512/256). One
# command, in the repository root:
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-moe.sh $OUT
#
# VARIANTS: space-separated "name:NAME=VALUE,NAME=VALUE" (default: passes of 256 tokens instead of
# 2,048; the down projection on CUDA cores; every (token, expert) pair on its own, without grouping
# by expert). The generic kernels ($LLMTS_CUDA_MOE=scalar) are not in the default list: their 16-request run took
# over two minutes. Environment: LAYERS (24), MODEL_DIR (/tmp/llmts-qwen3moe-random), PROFILE=1 (then
# the defaults' decode graph profiled at 1 and 16 rows: bench/cuda-generate.ts --profile-batch); DEVICE=cpu
# with a --tiny model (make_random_models.py) only tests the plumbing off the GPU machine.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-moe}
LAYERS=${LAYERS:-24}
MODEL_DIR=${MODEL_DIR:-/tmp/llmts-qwen3moe-random}
VARIANTS=${VARIANTS:-"pass-256:LLMTS_CUDA_MOE_PASS_ROWS=256 down-cuda-cores:LLMTS_CUDA_MOE_TC_DOWN_MIN_ROWS=0 per-pair:LLMTS_CUDA_MOE_GROUPED_MIN_ROWS=0"}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
source bench/device-out.sh
trap 'out_pack "$OUT"' EXIT
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "== making the model ($LAYERS layers)"
  timeout 400 python3 bench/make_random_models.py --preset qwen3-moe-6l --layers "$LAYERS" --out "$MODEL_DIR" \
    --tokenizer models/demo/tokenizer.json | tail -1
fi
run() { # name, then NAME=VALUE settings
  local name=$1; shift
  echo "== $name"
  env "$@" timeout 120 node --import tsx bench/cuda-generate.ts --device "${DEVICE:-cuda}" --model "$MODEL_DIR" --prompt-tokens 2048 \
    --decode-tokens 128 --repeats 2 --json "$OUT/generate-$name.json" 2>&1 | grep -E '^(model|ready|prefill|decode|rror)|Error'
  env "$@" timeout 120 node --import tsx bench/cuda-throughput.ts --device "${DEVICE:-cuda}" --model "$MODEL_DIR" --requests 16 \
    --max-batch 16 --input-tokens 512 --output-tokens 256 --json "$OUT/throughput16-$name.json" 2>&1 | grep -E '^ +(output|TTFT)|rror' | head -3
}
run default X=1
for v in $VARIANTS; do
  name=${v%%:*}; settings=${v#*:}
  IFS=, read -r -a envs <<< "$settings"
  run "$name" "${envs[@]}"
done
if [ "${PROFILE:-0}" = 1 ]; then # the defaults' decode graph, one layer call by call, at 1 and at 16 rows
  for b in 1 16; do
    echo "== profile, $b rows"
    timeout 120 node --import tsx bench/cuda-generate.ts --device "${DEVICE:-cuda}" --model "$MODEL_DIR" --prompt-tokens 512 \
      --decode-tokens 32 --repeats 1 --profile-graph --profile-batch "$b" --json "$OUT/profile-$b.json" 2>&1 | grep -E '^(graph|layer|  )' | head -24
  done
fi
