#!/usr/bin/env bash
# Where a B=1 decode step's time goes on the GPU machine, two ways, in one command:
#  1. in the graph: bench/cuda-generate.ts with the defaults, then with each timing-only switch (the
#     decode attention writes zeros, ATT_TC_TIMING_SKIP=1; rope does nothing, ROPE_TIMING_SKIP=1):
#     what each costs the step, with PDL's overlap. Read with care: the outputs are wrong, and the
#     values every later kernel sees change with them (the attention switched off has made the step
#     5% slower, not faster), so a switch-off bounds nothing unless the step's other kernels are
#     value-independent (rope's is: 0.3% of the step);
#  2. each kernel alone: Nsight Compute on WINDOW graph replays (default 60:2, LLMTS_CUDA_PROFILER_GRAPHS)
#     with the GEMM picks pinned to the plain run's ($LLMTS_CUDA_GEMV_PICKS from its JSON: under ncu the
#     tuner's timings differ), tabled by tools/device/ncu-table.ts (per kernel, then one layer in order).
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-step-costs.sh $OUT
#
# MODEL_DIR (default /tmp/llmts-llama8b-random, made by bench/make_random_llama.py when missing), CTX
# (prompt tokens, default 512), WINDOW, NCU (default /usr/local/cuda/bin/ncu; none: part 2 is skipped),
# DEVICE (cuda; cpu with MODEL_DIR=models/demo runs part 1's plumbing off the GPU machine). JSON per run
# in OUTDIR/NAME-CTX.json (bench/cuda-device-lib.sh's b1_gen).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-step-costs}
source bench/cuda-device-lib.sh
CTX=${CTX:-512}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/run.log") 2>&1
source bench/device-out.sh
trap 'out_pack "$OUT"' EXIT
make_model "$OUT/make-model.log" || exit 1
GEN_DIR=$OUT
gen() { b1_gen "$1" "$CTX" "${@:2}"; } # name, then NAME=VALUE settings: JSON in $OUT/NAME-CTX.json
gen default X=1
gen attention-skipped LLMTS_CUDA_ATT_DEFINES=ATT_TC_TIMING_SKIP=1
gen rope-skipped LLMTS_CUDA_FUSED_DEFINES=ROPE_TIMING_SKIP=1
gen default-again X=1
if [ "$DEVICE" != cuda ] || [ ! -x "$NCU" ]; then
  echo "== each kernel alone: skipped (DEVICE=$DEVICE, NCU=$NCU)"
  exit 0
fi
PICKS=$(node -e "const d = JSON.parse(require('fs').readFileSync(process.argv[1], 'utf8'));
  console.log((d.gemmTuning ?? []).map((t) => t.shape + '=' + t.chosen).join(','))" "$OUT/default-$CTX.json")
echo "== each kernel alone (Nsight Compute, graph replays ${WINDOW:-60:2}; picks $PICKS)"
LLMTS_CUDA_GEMV_PICKS="$PICKS" LLMTS_CUDA_PROFILER_GRAPHS=${WINDOW:-60:2} timeout 300 "$NCU" --profile-from-start off \
  --cache-control none --clock-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
  -f -o "$OUT/step" node --import tsx bench/cuda-generate.ts --device cuda --model "$MODEL_DIR" --prompt-tokens "$CTX" \
  --decode-tokens 64 --repeats 1 > "$OUT/ncu-run.log" 2>&1 || { echo "ncu failed (see $OUT/ncu-run.log)"; tail -5 "$OUT/ncu-run.log"; exit 1; }
timeout 60 "$NCU" --import "$OUT/step.ncu-rep" --csv --page raw > "$OUT/step.csv"
node --import tsx tools/device/ncu-table.ts "$OUT/step.csv" --json "$OUT/step-table.json"
rm -f "$OUT/step.ncu-rep"
xz -9f "$OUT/step.csv"
