#!/usr/bin/env bash
# Mixture-of-experts decode on the GPU machine (issue 4's stretch): a random-weight model with
# Qwen3-30B-A3B's layers (hidden 2048, 32 heads of 128 on 4 kv heads, 128 experts of 768, top-8,
# vocab 151936; LAYERS of its 48, default 24: 30 GB of bf16, which the 64 GB disk holds with room),
# then B=1 decode (bench/cuda-generate.ts: tok/s and the bytes a token reads, router and its 8
# experts, against copy bandwidth) and a 16-request batch (bench/cuda-throughput.ts), each with the
# scalar MoE kernels ($LLMTS_CUDA_MOE=scalar) and the vectorized ones (the default). One command, in the repository root:
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-moe.sh $OUT
#
# Environment: LAYERS (24), MODEL_DIR (/tmp/llmts-qwen3moe-random), KERNELS ("scalar vec"); DEVICE=cpu with a
# --tiny model (make_random_models.py) only tests the plumbing off the GPU machine.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-moe}
LAYERS=${LAYERS:-24}
MODEL_DIR=${MODEL_DIR:-/tmp/llmts-qwen3moe-random}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "== making the model ($LAYERS layers)"
  timeout 400 python3 bench/make_random_models.py --preset qwen3-moe-6l --layers "$LAYERS" --out "$MODEL_DIR" \
    --tokenizer models/demo/tokenizer.json | tail -1
fi
for k in ${KERNELS:-scalar vec}; do
  echo "== MoE kernels: $k"
  LLMTS_CUDA_MOE=$k timeout 120 node --import tsx bench/cuda-generate.ts --device "${DEVICE:-cuda}" --model "$MODEL_DIR" --prompt-tokens 512 \
    --decode-tokens 128 --repeats 2 --json "$OUT/generate-$k.json" 2>&1 | grep -E '^(model|ready|decode|rror)|Error'
  LLMTS_CUDA_MOE=$k timeout 120 node --import tsx bench/cuda-throughput.ts --device "${DEVICE:-cuda}" --model "$MODEL_DIR" --requests 16 \
    --max-batch 16 --input-tokens 512 --output-tokens 256 --json "$OUT/throughput16-$k.json" 2>&1 | grep -E 'output|steps|rror' | head -3
done
