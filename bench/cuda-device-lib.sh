# Shared by the GPU-machine scripts (cuda-verify.sh, cuda-decode-ab.sh, cuda-step-costs.sh,
# cuda-llama8b.sh, cuda-throughput.sh) and by one-off GPU-machine scripts kept outside the tree: the
# CUDA test list, the random 8B-shaped model, one B=1 decode run, a time budget with steps inside it,
# the machine's description, and a one-off run's start and finish. Source it from the repository root:
#
#   source bench/cuda-device-lib.sh
#
# A one-off run (device time is scarce: everything it learns goes under $OUT as it goes):
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash .device/NAME.sh $OUT
#   # where NAME.sh is:
#   source bench/cuda-device-lib.sh
#   call_start NAME "$1"            # W=/tmp/NAME; the model and the CPU library build in the background
#   cold_tests "$W/cuda-tests.txt"  # every CUDA test on a cold kernel cache, its summary printed
#   call_wait_model
#   b1_gen default 512 X=1          # B=1 decode, its line printed, JSON in $W/default-512.json
#   b1_gen pdl-off 512 LLMTS_CUDA_PDL=off
#   call_finish                     # the script and $W, tarred into $OUT/NAME.tar.gz
#
# Settings: MODEL_DIR (default /tmp/llmts-llama8b-random), DEVICE (cuda; cpu with MODEL_DIR=models/demo
# runs the plumbing off the GPU machine), GEN_DIR (where b1_gen writes JSON; call_start sets it to $W),
# GEN_GREP / GEN_LINES / GEN_EXTRA / GEN_TIMEOUT (b1_gen's output filter, lines, extra arguments, limit).

MODEL_DIR=${MODEL_DIR:-/tmp/llmts-llama8b-random}
DEVICE=${DEVICE:-cuda}

# Every CUDA test (the native CPU library must be built for the last two: block copies and the prefix
# cache's device tier).
CUDA_TEST_FILES=(
  test/backends/cuda-modules.test.ts test/backends/cuda-ops.test.ts test/backends/cuda-fused.test.ts
  test/backends/cuda-sampling.test.ts test/backends/cuda-engine-sampling.test.ts test/backends/cuda-fixtures.test.ts
  test/backends/block-copy.test.ts test/state/prefix-cuda.test.ts test/backends/cuda-settings.test.ts
  test/models/decode-graphs.test.ts test/backends/cuda-speculative.test.ts
)

# make_model LOG: Llama-3.1-8B shapes with random weights at $MODEL_DIR unless one is there (~26 s)
make_model() {
  [ -f "$MODEL_DIR/config.json" ] && return 0
  timeout 200 python3 bench/make_random_llama.py --out "$MODEL_DIR" --tokenizer models/demo/tokenizer.json > "$1" 2>&1 \
    || { echo "making the model failed (see $1)"; return 1; }
}

# cold_tests LOG [LIMIT_S]: the CUDA tests on a fresh kernel cache (each module's build time shows),
# the log xz-compressed afterwards; prints the exit status and the summary
cold_tests() {
  local log=$1 cache rc
  cache=$(mktemp -d)
  LLMTS_CACHE_DIR=$cache timeout "${2:-220}" node --import tsx --test --test-concurrency=1 "${CUDA_TEST_FILES[@]}" > "$log" 2>&1
  rc=$?
  echo "tests exit $rc"
  grep -E '^# (tests|pass|fail|skipped)|^not ok|^ +not ok' "$log" | head -20
  xz -9f "$log"
  return $rc
}

# b1_gen NAME CTX [NAME=VALUE...]: bench/cuda-generate.ts at batch 1 (CTX prompt tokens, 2 x 128
# decode tokens) with those settings; JSON in $GEN_DIR/NAME-CTX.json
b1_gen() {
  local name=$1 ctx=$2
  shift 2
  echo "== $name, ${ctx}-token context"
  # shellcheck disable=SC2086 # GEN_EXTRA is a list of arguments
  env "$@" timeout "${GEN_TIMEOUT:-90}" node --import tsx bench/cuda-generate.ts --device "$DEVICE" --model "$MODEL_DIR" \
    --prompt-tokens "$ctx" --decode-tokens 128 --repeats 2 ${GEN_EXTRA:-} --json "${GEN_DIR:-.}/$name-$ctx.json" 2>&1 \
    | grep -E "${GEN_GREP:-^decode|rror}" | cut -c1-400 | head -"${GEN_LINES:-3}"
}

# call_start NAME OUT: a one-off run's work folder W=/tmp/NAME (also GEN_DIR), its clock, and in the
# background the model and the native CPU library (call_wait_model waits for both)
call_start() {
  CALL_NAME=$1
  CALL_OUT=$2
  CALL_SCRIPT=$(readlink -f "$0")
  W=/tmp/$CALL_NAME
  GEN_DIR=$W
  CALL_T0=$(date +%s)
  mkdir -p "$W"
  (make_model "$W/make-model.log") &
  CALL_MODEL_PID=$!
  (timeout 60 node scripts/build-native.mjs > "$W/build-native.log" 2>&1 || echo "native build failed (see $W/build-native.log)")
}

call_wait_model() { wait "$CALL_MODEL_PID"; }

# seconds since call_start
call_elapsed() { echo $(($(date +%s) - CALL_T0)); }

call_finish() {
  echo "all done at $(call_elapsed) s"
  cp "$CALL_SCRIPT" "$W/"
  tar -czf "$CALL_OUT/$CALL_NAME.tar.gz" -C /tmp "$CALL_NAME"
}

# ---- a time budget with steps inside it (cuda-llama8b.sh, cuda-throughput.sh, cuda-verify.sh) -------

# budget_start SECONDS: left / cap count against it from now (BUDGET_T0)
budget_start() {
  BUDGET_S=$1
  BUDGET_T0=$(date +%s)
}

# seconds of the budget left
left() { echo $((BUDGET_S - ($(date +%s) - BUDGET_T0))); }

# cap WANT RESERVE: min(WANT, what is left less RESERVE), for a step's limit
cap() { local l; l=$(($(left) - $2)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

# budget_step NAME LIMIT_S cmd...: runs cmd under the limit (skipped when none is left), its name, exit
# status and seconds appended to $OUT/steps.txt
budget_step() {
  local name=$1 limit=$2 t rc
  t=$(date +%s)
  shift 2
  echo "== $name: started $(date +%T), limit ${limit} s, $(left) s of the budget left"
  if [ "$limit" -le 0 ]; then echo "== $name: skipped (no time left)"; echo "$name skipped 0" >> "$OUT/steps.txt"; return 1; fi
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  echo "== $name: rc $rc after $(($(date +%s) - t)) s"
  echo "$name $rc $(($(date +%s) - t))" >> "$OUT/steps.txt"
  return $rc
}

# machine_info: the commit, time, GPU, CPUs, memory, the model's disk, torch/transformers and node
# (extra lines from the caller follow it in the same file)
machine_info() {
  echo "commit $LLMTS_COMMIT"
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv 2>&1
  echo "cpus $(nproc)"; free -g | head -2; df -h "$(dirname "$MODEL_DIR")" | tail -1
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1
}

# node on PATH (.device/env.sh where the machine has none) and LLMTS_COMMIT for the JSON files
device_node_env() {
  if ! command -v node >/dev/null && [ -f .device/env.sh ]; then source .device/env.sh; fi
  export LLMTS_COMMIT=${LLMTS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
}
