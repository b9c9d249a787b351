#!/usr/bin/env bash
# Llama-3.1-8B (random bf16 weights at the real shapes) on the CUDA backend, beside same-run
# ceilings and the transformers peer. One command on the GPU machine, in the repository root
# (with .device/ carried along when the machine has no Node.js; README.md's "Benchmarks" says how):
#
#   bash bench/cuda-llama8b.sh [OUTDIR]        # OUTDIR default bench-out/cuda-llama8b
#
# 1. bench/gpu_ceilings.py: device-to-device copy GB/s and bf16 GEMM TFLOP/s (PyTorch)
# 2. bench/make_random_llama.py: the model directory, on local disk (16 GB; skipped when present)
# 3. bench/cuda-generate.ts: launch to ready, B=1 decode tok/s and GB/s / copy GB/s (512-token
#    prompt, 128 greedy tokens, median of 3 after a warm-up), TTFT and prefill MFU at 1k and 8k
# 4. bench/peers/transformers_gpu.py: transformers eager (sdpa, dynamic cache) on the same model,
#    same prompts; with PEER_COMPILE=1 also static cache + torch.compile, started only when at
#    least PEER_COMPILE_MIN_S seconds of the budget remain
# 5. bench/cuda_llama8b_report.py: OUTDIR/summary.md from the JSON files
#
# Everything it measures lands in OUTDIR (*.json, *.log, summary.md) as it goes; each step has a
# time limit inside BUDGET_S so a slow step cannot starve the rest.
# Environment: MODEL_DIR (default /tmp/llmts-llama8b-random; keep it out of OUTDIR),
# BUDGET_S (default 450), PEER_COMPILE (default 0), PEER_COMPILE_MIN_S (default 180),
# LLMTS_COMMIT (recorded when the tree has no .git), PROMPT_TOKENS (512), DECODE_TOKENS (128),
# PREFILL_PROMPTS (1024,8192); MAKE_MODEL_ARGS=--tiny and LLMTS_ARGS='--device cpu' (with
# PEER_DEVICE=cpu and a stand-in transformers) only test the plumbing off the GPU machine.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-llama8b}
source bench/cuda-device-lib.sh
BUDGET_S=${BUDGET_S:-450}
PEER_COMPILE=${PEER_COMPILE:-0}
PEER_COMPILE_MIN_S=${PEER_COMPILE_MIN_S:-180}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
DECODE_TOKENS=${DECODE_TOKENS:-128}
PREFILL_PROMPTS=${PREFILL_PROMPTS:-1024,8192}
read -r -a MAKE_MODEL_ARGS <<< "${MAKE_MODEL_ARGS:-}"  # e.g. --tiny, to test this script off the GPU
read -r -a LLMTS_ARGS <<< "${LLMTS_ARGS:-}"            # e.g. --device cpu, likewise
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
budget_start "$BUDGET_S"
device_node_env
step() { budget_step "$@"; }

{
  machine_info
  echo "node $(node --version 2>&1)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

step ceilings "$(cap 60 300)" python3 bench/gpu_ceilings.py --json "$OUT/ceilings.json"
CEIL=()
[ -f "$OUT/ceilings.json" ] && CEIL=(--ceilings "$OUT/ceilings.json")

if [ -f "$MODEL_DIR/model.safetensors.index.json" ] && [ -f "$MODEL_DIR/config.json" ]; then
  echo "== model: $MODEL_DIR already there"
else
  step model "$(cap 150 250)" python3 bench/make_random_llama.py --out "$MODEL_DIR" --tokenizer models/demo/tokenizer.json "${MAKE_MODEL_ARGS[@]}" || exit 1
fi
du -sh "$MODEL_DIR"

step llmts "$(cap 300 90)" node --import tsx bench/cuda-generate.ts --model "$MODEL_DIR" \
  --prompt-tokens "$PROMPT_TOKENS" --decode-tokens "$DECODE_TOKENS" --repeats 3 --prefill-prompts "$PREFILL_PROMPTS" --prefill-repeats 2 \
  "${CEIL[@]}" "${LLMTS_ARGS[@]}" --json "$OUT/llmts.json"

COMPILE=()
if [ "$PEER_COMPILE" = 1 ]; then COMPILE=(--compile --compile-until $((BUDGET_T0 + BUDGET_S - PEER_COMPILE_MIN_S))); fi
step transformers "$(cap 600 5)" python3 bench/peers/transformers_gpu.py --model "$MODEL_DIR" \
  --prompt-tokens "$PROMPT_TOKENS" --decode-tokens "$DECODE_TOKENS" --repeats 3 --prefill-prompts "$PREFILL_PROMPTS" --prefill-repeats 2 \
  "${CEIL[@]}" --launch-time "$(date +%s.%N)" "${COMPILE[@]}" --json "$OUT/transformers.json"

python3 bench/cuda_llama8b_report.py "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
echo "== done in $(($(date +%s) - BUDGET_T0)) s"
