// Serving benchmark (issue 3): in one run, on one model,
//   1. a lone request through the engine vs a dedicated single-sequence loop (model.forward
//      directly, no scheduler) — the cost of "batch even a lone request";
//   2. single-stream decode tok/s through HTTP (SSE) vs engine-direct;
//   3. aggregate output tok/s and TTFT p50/p99 at 1/4/16/64 concurrent streams;
//   4. /health latency while a long prefill runs (is the event loop ever blocked?).
//
//   node --import tsx bench/serve.ts [--model models/demo] [--tokens 128] [--device cpu|cuda]
//        [--prompt-tokens 64] [--long-prompt 1900] [--max-model-len N] [--warmup] [--json out.json]
// --warmup starts the server with `serve --warmup` (every decode batch size run once before it
// listens), so the concurrency levels' TTFT no longer include first-use graph captures.

import { parseArgs } from 'node:util';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { execSync } from 'node:child_process';
import os from 'node:os';
import { resolve } from 'node:path';
import { openBackend, parseDevice } from '../src/execution/devices.ts';
import { loadModel } from '../src/execution/load-model.ts';
import { Engine } from '../src/execution/engine.ts';
import { KvCache, blocksPerSequence } from '../src/state/kv-cache.ts';
import { Sampler, TokenHistory } from '../src/sampling/index.ts';
import { IncrementalDetokenizer } from '../src/generation/detokenizer.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    tokens: { type: 'string', default: '128' },
    device: { type: 'string', default: 'cpu' },
    'prompt-tokens': { type: 'string', default: '64' },
    'long-prompt': { type: 'string', default: '1900' },
    warmup: { type: 'boolean', default: false },
    'max-model-len': { type: 'string', default: '4096' },
    json: { type: 'string' },
  },
});
const MODEL = resolve(values.model!);
const TOKENS = Number(values.tokens);
const DEVICE = parseDevice(values.device);
const PROMPT_TOKENS = Number(values['prompt-tokens']);
const MAX_MODEL_LEN = Number(values['max-model-len']);
const ROOT = resolve(import.meta.dirname, '..');

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const median = (xs: number[]) => pct(xs, 50);
const promptOf = (seed: number, n: number, vocab: number) => Array.from({ length: n }, (_, k) => (seed * 7919 + k * 104729) % Math.min(vocab, 4000) + 10);

// ---- 1 and 2 (engine side), in process ------------------------------------------------------
const backend = await openBackend(DEVICE);
const m = await loadModel(backend, MODEL, { maxModelLen: MAX_MODEL_LEN });
const V = m.config.vocabSize;
const prompt = promptOf(1, PROMPT_TOKENS, V);

/**
 * A dedicated single-sequence path: step, pick the token, detokenize, repeat — the same per-token
 * work a user gets (text out), without the scheduler, admission, events or streams. It takes the
 * engine's fastest kernels too: the device's argmax where the backend has one (the logits then
 * stay on the device) and, on CUDA, the captured decode graphs.
 */
async function dedicatedLoop(): Promise<number> {
  const cfg = m.config;
  const total = prompt.length + TOKENS;
  const bs = 16;
  const kv = new KvCache(backend, cfg.layers.map((l) => l.window), { numKvHeads: cfg.numKvHeads, headDim: cfg.headDim, blockSize: bs },
    (s) => blocksPerSequence(s.window, total, bs, 512));
  const seq = kv.newSequence();
  const sampler = new Sampler({ temperature: 0 }, { vocabSize: V });
  const history = new TokenHistory(prompt);
  const detok = new IncrementalDetokenizer(m.decode, { contextTokens: prompt });
  const graphWidth = Math.ceil(total / bs) + 1;
  const next = async (tokens: Int32Array, start: number): Promise<number> => {
    kv.grow(seq, start, start + tokens.length);
    const r = await m.model.step({ tokens, rows: [{ seq, start, count: tokens.length }], logitTokens: [tokens.length - 1], graphWidth }, kv, [false]);
    return r.tokens ? r.tokens[0]! : sampler.sample(r.logits, history);
  };
  let id = await next(Int32Array.from(prompt), 0);
  let text = '';
  const t0 = performance.now();
  for (let k = 0; k < TOKENS - 1; k++) {
    history.push(id);
    text += detok.push(id);
    id = await next(Int32Array.of(id), prompt.length + k);
  }
  const tps = (TOKENS - 1) / ((performance.now() - t0) / 1000);
  if (text.length === 0 && TOKENS > 8) throw new Error('dedicated loop produced no text');
  kv.release(seq);
  m.model.releaseGraphs(kv);
  kv.dispose();
  return tps;
}

/** One request engine-direct: [decode tok/s after the first token, tokens / (submit .. last token)]. */
async function engineSingle(): Promise<[number, number]> {
  const engine = new Engine(m.model, m, { maxBatch: 1, maxModelLen: MAX_MODEL_LEN, prefixCache: { promptCacheBytes: 0 } });
  let tFirst = 0, n = 0;
  const t0 = performance.now();
  for await (const e of engine.generate({ promptIds: prompt, maxTokens: TOKENS, sampling: { temperature: 0 }, ignoreEos: true }))
    if (e.type === 'token' && n++ === 0) tFirst = performance.now();
  const t1 = performance.now();
  await engine.close(0);
  return [(n - 1) / ((t1 - tFirst) / 1000), n / ((t1 - t0) / 1000)];
}

const dedicated: number[] = [], engineDirect: number[] = [], engineEndToEnd: number[] = [];
await dedicatedLoop(); // warm-up
for (let r = 0; r < 5; r++) {
  dedicated.push(await dedicatedLoop());
  const [decode, endToEnd] = await engineSingle();
  engineDirect.push(decode);
  engineEndToEnd.push(endToEnd);
}
m.model.dispose();
await backend.close();

// ---- 2, 3, 4 through HTTP ------------------------------------------------------------------
const server = spawn(resolve(ROOT, 'bin/llmts'), ['serve', '--model', MODEL, '--port', '0', '--max-batch', '64', '--served-model-name', 'bench',
  '--prompt-cache', '0', '--device', DEVICE, '--max-model-len', String(MAX_MODEL_LEN), ...(values.warmup ? ['--warmup'] : [])],
  { stdio: ['ignore', 'pipe', 'inherit'] });
const base: string = await new Promise((ok, fail) => {
  let buf = '';
  server.stdout!.on('data', (d) => {
    buf += d;
    const hit = /listening on (http:\/\/\S+)/.exec(buf);
    if (hit) ok(hit[1]);
  });
  server.on('exit', (code) => fail(new Error(`server exited with ${code}`)));
});

interface StreamResult { ttftMs: number; tokens: number; decodeMs: number; totalMs: number }

/**
 * One streamed completion. Tokens are the final usage chunk's completion_tokens: a token that
 * decodes to no text (random weights over a smaller tokenizer) sends no chunk. TTFT is the first
 * chunk with text, so prefer `totalMs` (request to [DONE]) when few tokens carry text.
 */
async function stream(promptIds: number[], maxTokens: number): Promise<StreamResult> {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'bench', prompt: promptIds, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true },
    }),
  });
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let buf = '', tokens = 0, tFirst = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const chunk = JSON.parse(ev.slice(6));
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      if (chunk.choices?.[0]?.text && tFirst === 0) tFirst = performance.now();
    }
  }
  const t1 = performance.now();
  return { ttftMs: tFirst - t0, tokens, decodeMs: t1 - tFirst, totalMs: t1 - t0 };
}

await stream(prompt, 8); // warm-up
const httpSingle: number[] = [];
for (let r = 0; r < 5; r++) {
  const s = await stream(prompt, TOKENS);
  if (s.tokens !== TOKENS) throw new Error(`HTTP stream reported ${s.tokens} tokens, wanted ${TOKENS}`);
  httpSingle.push(s.tokens / (s.totalMs / 1000)); // end to end, as engineEndToEnd
}

const concurrency: { streams: number; outputTokPerS: number; ttftP50Ms: number; ttftP99Ms: number }[] = [];
for (const n of [1, 4, 16, 64]) {
  const perStream = 64;
  const t0 = performance.now();
  const results = await Promise.all(Array.from({ length: n }, (_, k) => stream(promptOf(k + 2, PROMPT_TOKENS, V), perStream)));
  const wall = (performance.now() - t0) / 1000;
  const ttfts = results.map((r) => r.ttftMs);
  concurrency.push({
    streams: n,
    outputTokPerS: results.reduce((a, r) => a + r.tokens, 0) / wall,
    ttftP50Ms: median(ttfts),
    ttftP99Ms: pct(ttfts, 99),
  });
}

// /health while a long prefill runs
const longPrompt = promptOf(99, Math.min(Number(values['long-prompt']), m.maxContext - 16), V);
const healthMs: number[] = [];
let prefillDone = false;
// The server's own longest event-loop stall during the prefill: prom-client's default metrics
// reset their loop-delay histogram at every scrape, so a scrape now and one after the request
// bound it (a slow /health probe alone cannot tell the server's stall from this process's).
const loopLagMaxS = async (): Promise<number> => {
  const text = await fetch(`${base}/metrics`).then((r) => r.text());
  const m = /^llmts_nodejs_eventloop_lag_max_seconds\s+([0-9.eE+-]+)/m.exec(text);
  return m ? Number(m[1]) : NaN;
};
await loopLagMaxS();
const long = stream(longPrompt, 4).then((r) => ((prefillDone = true), r));
while (!prefillDone) {
  const t = performance.now();
  await fetch(`${base}/health`).then((r) => r.text());
  healthMs.push(performance.now() - t);
  await new Promise((r) => setTimeout(r, 2));
}
const longResult = await long;
// the histogram samples with a 10 ms timer (prom-client's default precision) and records whole
// intervals: an idle loop reads 10 ms, so the stall is what lies beyond it
const LOOP_SAMPLE_MS = 10;
const serverLoopLagMaxMs = Math.max(0, 1000 * (await loopLagMaxS()) - LOOP_SAMPLE_MS);
server.kill('SIGTERM');

let commit = 'unknown';
try { commit = execSync('git rev-parse --short HEAD', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch {}
const result = {
  machine: `${os.cpus()[0]?.model ?? 'cpu'}, ${os.cpus().length} cores`, device: (backend as { describe?: () => string }).describe?.() ?? backend.name,
  loadavg: os.loadavg(), commit, model: values.model, tokens: TOKENS, promptTokens: PROMPT_TOKENS,
  dedicatedTokPerS: median(dedicated), engineDirectTokPerS: median(engineDirect), httpTokPerS: median(httpSingle),
  // request rates end to end (prompt + TOKENS tokens, submit to last token) on both sides
  engineEndToEndTokPerS: median(engineEndToEnd),
  loneVsDedicated: median(engineDirect) / median(dedicated), httpVsEngine: median(httpSingle) / median(engineEndToEnd),
  concurrency,
  health: { samples: healthMs.length, p50Ms: median(healthMs), p99Ms: pct(healthMs, 99), maxMs: Math.max(...healthMs), prefillTokens: longPrompt.length, prefillRequestMs: longResult.totalMs, serverLoopLagMaxMs },
};
console.log(`machine ${result.machine}  commit ${commit}  model ${values.model}`);
console.log(`single stream decode (median of 5, ${TOKENS} tokens):`);
console.log(`  decode: dedicated loop ${result.dedicatedTokPerS.toFixed(1)} tok/s | engine ${result.engineDirectTokPerS.toFixed(1)} tok/s (lone/dedicated ${result.loneVsDedicated.toFixed(3)})`);
console.log(`  request end to end: engine ${result.engineEndToEndTokPerS.toFixed(1)} tok/s | HTTP ${result.httpTokPerS.toFixed(1)} tok/s (HTTP/engine ${result.httpVsEngine.toFixed(3)})`);
console.log('concurrent streams (64 tokens each, 64-token prompts):');
for (const c of concurrency) console.log(`  ${String(c.streams).padStart(3)} streams: ${c.outputTokPerS.toFixed(1).padStart(8)} output tok/s   TTFT p50 ${c.ttftP50Ms.toFixed(1)} ms  p99 ${c.ttftP99Ms.toFixed(1)} ms`);
console.log(`/health during a ${longPrompt.length}-token prefill (request ${longResult.totalMs.toFixed(0)} ms): ${healthMs.length} probes, p50 ${result.health.p50Ms.toFixed(2)} ms, p99 ${result.health.p99Ms.toFixed(2)} ms, max ${result.health.maxMs.toFixed(2)} ms; the server's longest event-loop stall ${serverLoopLagMaxMs.toFixed(1)} ms`);
if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2));
