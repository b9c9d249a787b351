#!/usr/bin/env bash
# The checks a change to the CUDA backend needs on the GPU machine, in one command with a time budget
# (device time is scarce: one call, everything under OUTDIR as it goes). In the repository root:
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-verify.sh $OUT
#
# 1. every CUDA test (ops, fused, modules with the real NVRTC, sampling, engine sampling, fixtures,
#    block copy, prefix cache), on a cold kernel cache: the time to build every module is printed
# 2. bench/cuda-generate.ts on Llama-3.1-8B shapes (made by bench/make_random_llama.py while the
#    tests run): launch to ready with the kernels cached, B=1 decode, the GEMM tuning table
# 3. bench/serve.ts with the server's default warm-up and with --no-warmup: lone/dedicated,
#    HTTP/engine, concurrency TTFT, /health and the server's own longest event-loop stall during an
#    8k-token prefill (every driver / cuBLASLt call that held the thread 8 ms or more is listed)
# 4. bench/cuda-attention.ts: decode attention alone at 256 rows (1k and 2k context)
# 5. bench/cuda-throughput.ts: 256 requests x 1k/1k greedy (llmts only; bench/cuda-throughput.sh
#    runs the peer), then, when SAMPLING=1, 64 x 512/256 with seeded temperature sampling
# Environment: BUDGET_S (default 540), MODEL_DIR (default /tmp/llmts-llama8b-random),
# SERVE_WARMUP ("default no": the serve runs), SAMPLING (1: step 5's sampling run),
# LLMTS_COMMIT (recorded by the benches when the tree has no .git); DEVICE=cpu with
# MODEL_DIR=models/demo only tests the plumbing off the GPU machine (the CUDA tests skip there).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-verify}
source bench/cuda-device-lib.sh
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
source bench/device-out.sh
trap 'out_pack "$OUT"' EXIT
budget_start "$BUDGET_S"
step() { echo; echo "== $1 ($(left) s of the budget left)"; }
# timeout that skips a step the budget left no time for (a smaller BUDGET_S than the reserves assume)
run_for() { local t=$1; shift; if [ "$t" -le 0 ]; then echo "skipped: no time left in BUDGET_S"; return 125; fi; timeout "$t" "$@"; }

# the model, in the background (a file marks it done: waiting on a process name would match this
# script's own command line)
rm -f "$OUT/model.done"
(make_model "$OUT/make-model.log"; touch "$OUT/model.done") &

step "CUDA tests, cold kernel cache"
CACHE=$(mktemp -d)
LLMTS_CACHE_DIR=$CACHE run_for "$(cap 200 130)" node --import tsx --test --test-concurrency=1 "${CUDA_TEST_FILES[@]}" \
  > "$OUT/cuda-tests.txt" 2>&1
echo "exit $?"
grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok|NVRTC .*: attention|ms/step|agree' "$OUT/cuda-tests.txt" | head -30

for _ in $(seq 1 180); do [ -f "$OUT/model.done" ] && break; sleep 1; done
[ -f "$MODEL_DIR/config.json" ] || { echo "no model at $MODEL_DIR (see $OUT/make-model.log)"; exit 1; }

step "B=1 decode and the GEMM tuning table"
run_for "$(cap 90 100)" node --import tsx bench/cuda-generate.ts --device "$DEVICE" --model "$MODEL_DIR" --prompt-tokens 512 \
  --decode-tokens 128 --repeats 2 --json "$OUT/generate.json" 2>&1 | grep -E '^(device|ready|prefill|decode|host|gemm)'

for warm in ${SERVE_WARMUP:-default no}; do
  step "serve bench, warm-up $warm"
  flag=(); [ "$warm" = no ] && flag=(--no-warmup)
  LLMTS_CUDA_SLOW_CALL_MS=8 run_for "$(cap 150 60)" node --import tsx bench/serve.ts --device "$DEVICE" --model "$MODEL_DIR" \
    --tokens 128 --prompt-tokens 512 --long-prompt 8000 --max-model-len 16384 "${flag[@]}" --json "$OUT/serve-warmup-$warm.json" \
    > "$OUT/serve-warmup-$warm.txt" 2>&1
  grep -E 'warm-up|lone/dedicated|HTTP/engine|streams:|/health|slow CUDA call' "$OUT/serve-warmup-$warm.txt" | sort | uniq -c | sort -rn | head -20
done

step "decode attention alone, 256 rows"
run_for "$(cap 60 50)" node --import tsx bench/cuda-attention.ts --decode 1024,2048 --prefill 1024 --batch 256 \
  --json "$OUT/attention-b256.json" 2>&1 | tail -8

step "throughput, 256 x 1k/1k greedy"
run_for "$(cap 150 5)" node --import tsx bench/cuda-throughput.ts --device "$DEVICE" --model "$MODEL_DIR" --requests 256 \
  --input-tokens 1024 --output-tokens 1024 --max-batch 256 --token-budget 8192 --budget-s "$(cap 140 15)" \
  --json "$OUT/throughput-256.json" 2>&1 | grep -vE '^\[llmts\] [0-9.]+ s:' | tail -12

if [ "${SAMPLING:-0}" = 1 ]; then
  step "throughput, seeded temperature sampling on the device"
  run_for "$(cap 90 5)" node --import tsx bench/cuda-throughput.ts --device "$DEVICE" --model "$MODEL_DIR" \
    --temperature 0.8 --top-p 0.95 --requests 64 --max-batch 64 --input-tokens 512 --output-tokens 256 \
    --json "$OUT/throughput-sampling.json" 2>&1 | grep -iE 'output|steps' | head -4
fi
echo; echo "done in $(($(date +%s) - BUDGET_T0)) s"
