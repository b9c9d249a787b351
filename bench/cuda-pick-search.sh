#!/usr/bin/env bash
# Which GEMM pick is fastest for each decode shape in the B=1 decode graph, not alone: the tuner
# times each candidate alone, where PDL's overlap with the kernel before is missing (a GEMV that
# wins alone by a few percent can lose in the graph behind a latency-bound kernel such as the decode
# attention; the tuner's margins, gemm-tuning.ts, come from such runs). One
# plain run gives the shapes and their lone timings; then, shape by shape, every candidate within
# WITHIN (default 1.15) of the shape's best lone time runs the whole B=1 decode with that one pick
# ($LLMTS_CUDA_GEMV_PICKS), the others as the tuner chose; the table sorts them by tok/s. Each
# candidate runs REPEATS (default 2) times, alternating with the plain run.
#
#   source .device/env.sh && tar -xJf .device/js.tar.xz && bash bench/cuda-pick-search.sh $OUT
#
# Output: OUTDIR/picks.md (the table), picks.json, candidates.txt, run.log and runs.tar.gz (every run's JSON).
# MODEL_DIR (default /tmp/llmts-llama8b-random, made when missing), CTX (prompt tokens, default 512),
# SHAPES (space-separated MxNxK to search, default every tuned one-row shape), DEVICE (cuda; cpu with
# MODEL_DIR=models/demo runs the plumbing: no shape is tuned there).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-pick-search}
source bench/cuda-device-lib.sh
CTX=${CTX:-512}
WITHIN=${WITHIN:-1.15}
REPEATS=${REPEATS:-2}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/run.log") 2>&1
make_model "$OUT/make-model.log" || exit 1
GEN_DIR=$OUT
b1_gen plain "$CTX" X=1
# "shape candidate" lines: the candidates within WITHIN of the shape's best lone time (cublaslt included)
node -e '
const d = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const within = Number(process.argv[2]), only = (process.argv[3] || "").split(" ").filter(Boolean);
for (const t of d.gemmTuning ?? []) {
  if (!t.shape.startsWith("1x") || (only.length && !only.includes(t.shape))) continue;
  const times = { cublaslt: t.cublasLtMs, ...t.gemvMs };
  const best = Math.min(...Object.values(times));
  for (const [pick, ms] of Object.entries(times).sort((a, b) => a[1] - b[1])) if (ms <= best * within) console.log(t.shape, pick);
}' "$OUT/plain-$CTX.json" "$WITHIN" "${SHAPES:-}" > "$OUT/candidates.txt"
echo "== $(wc -l < "$OUT/candidates.txt") candidates within ${WITHIN}x of their shape's best lone time"
i=0
while read -r shape pick; do
  i=$((i + 1))
  for r in $(seq 1 "$REPEATS"); do
    b1_gen "c$i-r$r" "$CTX" "LLMTS_CUDA_GEMV_PICKS=$shape=$pick" > /dev/null
    b1_gen "plain-c$i-r$r" "$CTX" X=1 > /dev/null
  done
  echo "$shape $pick c$i" >> "$OUT/runs.txt"
done < "$OUT/candidates.txt"
# the table: per shape, each pick's mean tok/s against the plain runs beside it, and what the tuner chose
node -e '
const fs = require("fs"), path = require("path");
const [out, ctx, repeats] = [process.argv[1], process.argv[2], Number(process.argv[3])];
const tok = (name) => { try { return JSON.parse(fs.readFileSync(path.join(out, `${name}-${ctx}.json`), "utf8")).decodeTokPerS; } catch { return NaN; } };
const plain = JSON.parse(fs.readFileSync(path.join(out, `plain-${ctx}.json`), "utf8"));
const chosen = Object.fromEntries((plain.gemmTuning ?? []).map((t) => [t.shape, t.chosen]));
const runs = fs.existsSync(path.join(out, "runs.txt")) ? fs.readFileSync(path.join(out, "runs.txt"), "utf8").trim().split("\n").filter(Boolean) : [];
const rows = runs.map((l) => {
  const [shape, pick, id] = l.split(" ");
  let a = 0, b = 0;
  for (let r = 1; r <= repeats; r++) { a += tok(`${id}-r${r}`); b += tok(`plain-${id}-r${r}`); }
  return { shape, pick, tokS: a / repeats, plainTokS: b / repeats, ratio: a / b, tuner: chosen[shape] === pick };
});
rows.sort((x, y) => x.shape.localeCompare(y.shape) || y.ratio - x.ratio);
console.log("| shape | pick | tok/s | plain beside it | ratio | tuner pick |");
console.log("|---|---|---:|---:|---:|---|");
for (const r of rows) console.log(`| ${r.shape} | ${r.pick} | ${r.tokS.toFixed(2)} | ${r.plainTokS.toFixed(2)} | ${r.ratio.toFixed(4)} | ${r.tuner ? "yes" : ""} |`);
fs.writeFileSync(path.join(out, "picks.json"), JSON.stringify(rows, null, 2));
' "$OUT" "$CTX" "$REPEATS" | tee "$OUT/picks.md"
# the runs' JSON files in one archive (the device tool brings back a limited number of files)
(cd "$OUT" && tar -czf runs.tar.gz -- *-"$CTX".json && rm -f -- *-"$CTX".json)
