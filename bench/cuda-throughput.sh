#!/usr/bin/env bash
# Batched throughput: 256 requests, 1,024 random input / 1,024 output tokens each, EOS
# ignored, greedy, all submitted at once, on the random-weight Llama-3.1-8B-shaped bf16 model;
# llmts beside transformers' own continuous batching in the same run. One command on the GPU
# machine, in the repository root (with .device/ carried along when the machine has no Node.js):
#
#   bash bench/cuda-throughput.sh [OUTDIR]        # OUTDIR default bench-out/cuda-throughput
#
# 1. (CEILINGS=1) bench/gpu_ceilings.py: same-run copy GB/s and bf16 GEMM TFLOP/s
# 2. bench/make_random_llama.py: the model directory on local disk (16 GB; skipped when present)
# 3. bench/cuda-throughput.ts --prompts-only: OUTDIR/prompts.json, the prompt ids both sides run
# 4. bench/cuda-throughput.ts: llmts engine-direct (max batch 256, token budget 8192, KV for every
#    request at once, prefix cache off), after an untimed warm-up that captures every decode graph
# 5. bench/peers/transformers_throughput.py: the same prompts through transformers' continuous
#    batching (PEER_MODE=cb), or its batched generate fallback (generate), or both (cb,generate)
# 6. OUTDIR/summary.md: the table, llmts / transformers, and TensorRT-LLM's published figure
#
# Each step has its own time limit inside BUDGET_S; a benchmark that reaches its limit cancels what
# is left, and its JSON says complete: false with what finished (output tok/s then covers the part
# that ran, prefill included). Everything lands in OUTDIR (*.json, *.log, summary.md) as it goes.
# Environment: MODEL_DIR (default /tmp/llmts-llama8b-random; keep it out of OUTDIR), BUDGET_S (540),
# LLMTS_S (most seconds for llmts, 260), PEER_MIN_S (kept for the peer when llmts starts, 200),
# REQUESTS (256), INPUT_TOKENS (1024), OUTPUT_TOKENS (1024), MAX_BATCH (256), TOKEN_BUDGET (8192),
# PEER_MODE (cb), CEILINGS (0), LLMTS_COMMIT (recorded when the tree has no .git), LLMTS_ARGS and
# PEER_ARGS (extra flags). MAKE_MODEL_ARGS=--tiny, LLMTS_ARGS='--device cpu' and PEER_DEVICE=cpu
# (with a stand-in torch/transformers) only test the plumbing off the GPU machine.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/cuda-throughput}
source bench/cuda-device-lib.sh
BUDGET_S=${BUDGET_S:-540}
LLMTS_S=${LLMTS_S:-260}
PEER_MIN_S=${PEER_MIN_S:-200}
REQUESTS=${REQUESTS:-256}
INPUT_TOKENS=${INPUT_TOKENS:-1024}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-1024}
MAX_BATCH=${MAX_BATCH:-256}
TOKEN_BUDGET=${TOKEN_BUDGET:-8192}
PEER_MODE=${PEER_MODE:-cb}
CEILINGS=${CEILINGS:-0}
read -r -a MAKE_MODEL_ARGS <<< "${MAKE_MODEL_ARGS:-}"
read -r -a LLMTS_ARGS <<< "${LLMTS_ARGS:-}"
read -r -a PEER_ARGS <<< "${PEER_ARGS:-}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
budget_start "$BUDGET_S"
device_node_env
step() { budget_step "$@"; }

{
  machine_info
  python3 -c 'import importlib.util as u; print("flash_attn", u.find_spec("flash_attn") is not None, "kernels", u.find_spec("kernels") is not None)' 2>&1
  echo "node $(node --version 2>&1)"
  echo "workload $REQUESTS requests x ($INPUT_TOKENS in, $OUTPUT_TOKENS out); llmts max batch $MAX_BATCH, token budget $TOKEN_BUDGET; peer mode $PEER_MODE"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if [ "$CEILINGS" = 1 ]; then step ceilings "$(cap 60 400)" python3 bench/gpu_ceilings.py --json "$OUT/ceilings.json"; fi

if [ -f "$MODEL_DIR/model.safetensors.index.json" ] && [ -f "$MODEL_DIR/config.json" ]; then
  echo "== model: $MODEL_DIR already there"
else
  step model "$(cap 150 300)" python3 bench/make_random_llama.py --out "$MODEL_DIR" --tokenizer models/demo/tokenizer.json "${MAKE_MODEL_ARGS[@]}" || exit 1
fi
du -sh "$MODEL_DIR"

W=(--requests "$REQUESTS" --input-tokens "$INPUT_TOKENS" --output-tokens "$OUTPUT_TOKENS")
step prompts "$(cap 60 30)" node --import tsx bench/cuda-throughput.ts --model "$MODEL_DIR" "${W[@]}" \
  --write-prompts "$OUT/prompts.json" --prompts-only

# llmts: its own --budget-s (counted from its start) ends the run 20 s before the hard limit
L=$(cap "$LLMTS_S" "$PEER_MIN_S")
step llmts "$L" node --import tsx bench/cuda-throughput.ts --model "$MODEL_DIR" "${W[@]}" \
  --max-batch "$MAX_BATCH" --token-budget "$TOKEN_BUDGET" --budget-s $((L - 20)) "${LLMTS_ARGS[@]}" --json "$OUT/llmts.json"

# the peer: whatever is left, less a few seconds for the summary; 30 s of it kept for stopping
P=$(cap 600 8)
PROMPTS=()
[ -f "$OUT/prompts.json" ] && PROMPTS=(--prompts "$OUT/prompts.json")
step transformers "$P" python3 bench/peers/transformers_throughput.py --model "$MODEL_DIR" "${W[@]}" "${PROMPTS[@]}" \
  --mode "$PEER_MODE" --budget-s $((P - 30)) --launch-time "$(date +%s.%N)" "${PEER_ARGS[@]}" --json "$OUT/transformers.json"

python3 - "$OUT" > "$OUT/summary.md" <<'EOF'
import json, os, sys
d = sys.argv[1]
def load(name):
    p = os.path.join(d, name)
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
l, t = load('llmts.json'), load('transformers.json')
TRT = 17744  # TensorRT-LLM, FP8, H200, 1k in / 1k out, output tok/s: its published figure for this shape
def g(o, *path):
    for k in path:
        if not isinstance(o, dict) or o.get(k) is None:
            return None
        o = o[k]
    return o
def f(x, spec=',.0f'):
    return '—' if x is None else format(x, spec)
def ratio(a, b):
    return '—' if a is None or b in (None, 0) else f'{a / b:.2f}'
out = ['# Batched throughput: Llama-3.1-8B shapes (random bf16)', '']
w = g(l, 'workload') or g(t, 'workload') or {}
out.append(f"Workload: {w.get('requests')} requests x ({w.get('inputTokens')} random input ids, {w.get('outputTokens')} output tokens), "
           'EOS ignored, greedy, all submitted at once; same prompt ids on both sides.')
if l:
    ec = l.get('engineConfig', {})
    out.append(f"llmts: {l.get('device')}, commit {l.get('commit')}; max batch {ec.get('maxBatch')}, token budget {ec.get('tokenBudget')}, "
               f"KV {ec.get('kvTokens')} tokens ({f(ec.get('kvGiB'), '.1f')} GiB), prefix cache off, warm-up {ec.get('warmup')}"
               + (f" ({f(g(l, 'warmup', 's'), '.1f')} s, untimed)" if g(l, 'warmup') else '') + '.')
    if l.get('error'):
        out.append(f"llmts error: {l['error'].splitlines()[0]}")
if t:
    out.append(f"transformers {t.get('transformers')}, torch {t.get('torch')}: {t.get('label') or t.get('headlineMode')}, "
               f"attention {t.get('attnImplementation')}; flash_attn installed: {t.get('flashAttnInstalled')}.")
    cbr = g(t, 'runs', 'cb', 'cbConfigResolved')
    if cbr:
        keys = ('num_blocks', 'page_size', 'block_size', 'max_batch_tokens', 'max_requests_per_batch', 'use_cuda_graph', 'use_async_batching')
        out.append('transformers continuous batching config (resolved): ' + ', '.join(f'{k} {cbr[k]}' for k in keys if k in cbr) + '.')
    for m, r in (t.get('runs') or {}).items():
        if r.get('error'):
            out.append(f"transformers {m} error: {r['error']}")
    if t.get('fallbackReason'):
        out.append(f"Fallback used: {t['fallbackReason']}")
out.append('')
out.append('| | llmts | transformers | llmts / transformers |')
out.append('|---|---|---|---|')
def row(name, path, spec=',.0f', with_ratio=True):
    a, b = g(l, *path), g(t, *path)
    out.append(f'| {name} | {f(a, spec)} | {f(b, spec)} | {ratio(a, b) if with_ratio else "—"} |')
row('**output tok/s**', ('outputTokPerS',))
row('total tok/s (input + output)', ('totalTokPerS',))
row('output tok/s after the last first token', ('decodePhase', 'tokPerS'))
row('wall time, s', ('wallS',), ',.1f')
row('requests completed', ('requestsCompleted',), 'd', False)
row('output tokens', ('outputTokens',), 'd', False)
row('TTFT mean, ms', ('ttftMs', 'mean'))
row('TTFT p50, ms', ('ttftMs', 'p50'))
row('TTFT p99, ms', ('ttftMs', 'p99'))
row('inter-token latency mean, ms', ('itlMs', 'meanOfRequests'), ',.2f')
row('inter-token latency p99 (pooled), ms', ('itlMs', 'pooled', 'p99'), ',.2f')
row('end-to-end latency p50, ms', ('e2eLatencyMs', 'p50'))
row('engine steps', ('steps',), 'd', False)
row('ms per step', ('msPerStep',), ',.2f')
out.append('')
for name, o in (('llmts', l), ('transformers', t)):
    if o and o.get('complete') is False:
        out.append(f"**{name} did not finish** ({o.get('stoppedBy')}): {o.get('requestsCompleted')}/{o.get('requestsSubmitted')} requests, "
                   f"{o.get('outputTokens')} output tokens in {f(o.get('wallS'), '.1f')} s; its tok/s covers that part only.")
lo = g(l, 'outputTokPerS')
out.append(f"For context only (not measured here; FP8, another engine): TensorRT-LLM's published H200 figure for 1k/1k is "
           f"{TRT:,} output tok/s; llmts here reaches {ratio(lo, TRT)} of it.")
print('\n'.join(out))
EOF
cat "$OUT/summary.md"
echo "== done in $(($(date +%s) - BUDGET_T0)) s"
