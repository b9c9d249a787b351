// Batched throughput: N requests submitted at once, each with its own random prompt of
// --input-tokens ids and --output-tokens greedy tokens (EOS ignored), through the engine directly
// (the path users take, as bench/cuda-generate.ts). Reports output tok/s = generated tokens / wall
// time from the first submission to the last token, total tok/s (prompt + generated), TTFT (mean,
// p50, p99), inter-token latency, engine steps and the engine's own stats. The in-run peer is
// bench/peers/transformers_throughput.py on the same prompt ids (--write-prompts).
//
//   node --import tsx bench/cuda-throughput.ts --model DIR [--requests 256] [--input-tokens 1024]
//        [--output-tokens 1024] [--max-batch 256] [--token-budget 8192] [--kv-tokens N]
//        [--max-model-len N] [--warmup buckets|short|none] [--seed 1] [--device cuda|cpu]
//        [--budget-s S] [--progress-s 5] [--write-prompts prompts.json [--prompts-only]] [--json out.json]
//        [--temperature 0] [--top-p 1]
//
// Prompts: request r of n ids, ids < V = min(vocab, 5000), a 32-bit LCG exact in doubles:
//   x = (seed * 1000003 + r * 7919 + 12345) mod 2^32; per id: x = (1664525 x + 1013904223) mod 2^32,
//   id = floor(x / 256) mod V. bench/peers/transformers_throughput.py reproduces it (or reads
//   --write-prompts' file). Every request's first block differs (checked), and the prefix cache is
//   off, so no request reuses another's KV.
// Warm-up (not timed): 'buckets' (default) runs min(requests, max batch) 32-token prompts where
// request i asks for i + 2 tokens, so decode passes through every batch size once and each CUDA
// graph bucket is captured before the timed run; 'short' runs 4 short requests.
// --budget-s: the whole process's time limit in seconds (from process start): at it the timed run
// is cancelled (every sequence ends 'cancelled' at the next step boundary) and the JSON says what
// finished, with complete: false. The JSON is also written after the warm-up.
// --device cpu only tests the plumbing off the GPU machine (use a tiny model).
// --temperature T > 0: seeded sampling (request i seeded --seed * 100003 + i, with --top-p) instead of
// greedy; with the backend's sampleRows the rows sample on the device and their steps pipeline
// (A/B: LLMTS_DEVICE_SAMPLING=off samples on the host; LLMTS_PIPELINE=off unpipelines).
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import type { Backend } from '../src/contracts/backend.ts';
import { Engine } from '../src/execution/engine.ts';
import { loadModel } from '../src/execution/load-model.ts';
import type { Sequence } from '../src/execution/sequence.ts';
import { benchCommit } from './commit.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    requests: { type: 'string', default: '256' },
    'input-tokens': { type: 'string', default: '1024' },
    'output-tokens': { type: 'string', default: '1024' },
    'max-batch': { type: 'string', default: '256' },
    'token-budget': { type: 'string', default: '8192' },
    'kv-tokens': { type: 'string' },
    'max-model-len': { type: 'string' },
    warmup: { type: 'string', default: 'buckets' },
    seed: { type: 'string', default: '1' },
    device: { type: 'string', default: 'cuda' },
    'budget-s': { type: 'string' },
    'progress-s': { type: 'string', default: '5' },
    'write-prompts': { type: 'string' },
    'prompts-only': { type: 'boolean', default: false },
    json: { type: 'string' },
    temperature: { type: 'string', default: '0' },
    'top-p': { type: 'string', default: '1' },
  },
});
const int = (name: keyof typeof values, min = 1): number => {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < min) throw new Error(`--${name}: expected an integer >= ${min}, got ${values[name]}`);
  return n;
};
const nReq = int('requests');
const inTok = int('input-tokens');
const outTok = int('output-tokens');
const maxBatch = int('max-batch');
const tokenBudget = int('token-budget');
const seed = int('seed', 0);
const temperature = Number(values.temperature), topP = Number(values['top-p']);
if (!(temperature >= 0) || !(topP > 0 && topP <= 1)) throw new Error(`--temperature >= 0 and --top-p in (0, 1], got ${values.temperature}, ${values['top-p']}`);
/** request i's sampling (the warm-up's too) */
const samplingOf = (i: number) => (temperature > 0 ? { temperature, topP, seed: seed * 100003 + i } : { temperature: 0 });
const progressMs = Number(values['progress-s']) * 1000;
const budgetMs = values['budget-s'] === undefined ? Infinity : Number(values['budget-s']) * 1000;
if (!['buckets', 'short', 'none'].includes(values.warmup!)) throw new Error(`--warmup: buckets, short or none, got ${values.warmup}`);
const log = (s: string) => console.log(s);
const note = (s: string) => process.stderr.write(s + '\n');

// ---- prompts (bench/peers/transformers_throughput.py mirrors this exactly) ----
const TWO32 = 4294967296;
function promptIds(r: number, n: number, vocab: number, s: number): number[] {
  let x = (s * 1000003 + r * 7919 + 12345) % TWO32; // every product below stays < 2^53: exact
  const ids = new Array<number>(n);
  for (let k = 0; k < n; k++) {
    x = (x * 1664525 + 1013904223) % TWO32;
    ids[k] = Math.floor(x / 256) % vocab;
  }
  return ids;
}
function makePrompts(count: number, n: number, vocab: number, s: number): number[][] {
  const prompts = Array.from({ length: count }, (_, r) => promptIds(r, n, vocab, s));
  const heads = new Set(prompts.map((p) => p.slice(0, 16).join(',')));
  if (heads.size !== prompts.length) throw new Error('two prompts share their first 16 ids; pick another --seed');
  return prompts;
}
function writePrompts(path: string, vocab: number, prompts: number[][]): void {
  writeFileSync(path, JSON.stringify({
    generator: 'bench/cuda-throughput.ts promptIds', seed, vocabForPrompts: vocab, requests: prompts.length,
    inputTokens: inTok, outputTokens: outTok, prompts,
  }));
}
/** vocab_size from config.json (or its text_config), without loading anything */
function configVocab(dir: string): number {
  const c = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as { vocab_size?: number; text_config?: { vocab_size?: number } };
  const v = c.vocab_size ?? c.text_config?.vocab_size;
  if (!Number.isInteger(v)) throw new Error(`${dir}/config.json has no vocab_size`);
  return v!;
}

if (values['prompts-only']) {
  if (!values['write-prompts']) throw new Error('--prompts-only needs --write-prompts FILE');
  const vocab = Math.min(configVocab(values.model!), 5000);
  writePrompts(values['write-prompts'], vocab, makePrompts(nReq, inTok, vocab, seed));
  log(`wrote ${nReq} prompts of ${inTok} ids (< ${vocab}, seed ${seed}) to ${values['write-prompts']}`);
  process.exit(0);
}

// ---- statistics ----
const sorted = (xs: ArrayLike<number>) => Float64Array.from(xs).sort();
const pct = (s: Float64Array, p: number) => (s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!);
const mean = (xs: ArrayLike<number>) => { let a = 0; for (let i = 0; i < xs.length; i++) a += xs[i]!; return xs.length ? a / xs.length : NaN; };
const dist = (xs: ArrayLike<number>) => { const s = sorted(xs); return { n: s.length, mean: mean(s), p50: pct(s, 50), p90: pct(s, 90), p99: pct(s, 99), max: s.length ? s[s.length - 1]! : NaN }; };
const r1 = (x: number) => Math.round(x * 10) / 10;

/** Everything one batch of requests produced, timed from the moment the first was submitted. */
interface Batch {
  t0: number;
  tEnd: number;
  first: Float64Array;
  last: Float64Array;
  end: Float64Array;
  count: Int32Array;
  finish: string[];
  errors: string[];
  /** gaps between consecutive tokens of one request (ms), all requests pooled */
  gaps: Float64Array;
  gapN: number;
  tokens: number;
  finished: number;
  firstTokens: number;
  /** when the last request got its first token, and how many tokens existed then */
  tAllFirst: number;
  tokensAtAllFirst: number;
  stepsAtStart: number;
  launchesAtStart: number;
  cancelledAt?: number;
  timeline: { s: number; tokens: number; finished: number; running: number; waiting: number; steps: number }[];
}

// ---- backend, model, engine ----
const tStart = performance.now();
const deadline = budgetMs; // performance.now() counts from process start
let backend: Backend & { launches?: number; describe?: () => string; sync(): Promise<void>; close?: () => Promise<void> | void };
if (values.device === 'cpu') {
  const { createCpuBackend } = await import('../src/backends/cpu/cpu-backend.ts');
  backend = await createCpuBackend() as typeof backend;
} else {
  const { createCudaBackend } = await import('../src/backends/cuda/index.ts');
  backend = await createCudaBackend() as typeof backend;
}
const tBackend = performance.now();
const maxModelLen = values['max-model-len'] !== undefined ? int('max-model-len') : inTok + outTok;
const m = await loadModel(backend, values.model!, { maxModelLen, onWarning: note });
await backend.sync();
const tLoaded = performance.now();
const cfg = m.config;
const BLOCK = 16; // the engine's default block size
const concurrency = Math.min(nReq, maxBatch);
const kvTokens = values['kv-tokens'] !== undefined ? int('kv-tokens') : concurrency * Math.ceil(maxModelLen / BLOCK) * BLOCK;
const kvBytesPerToken = 2 * cfg.numLayers * cfg.numKvHeads * cfg.headDim * 2; // K and V, bf16 activations on CUDA
const warmN = values.warmup === 'buckets' ? concurrency : values.warmup === 'short' ? Math.min(4, concurrency) : 0;
const engine = new Engine(m.model, m, {
  maxBatch, tokenBudget, maxModelLen, kvTokens, maxQueued: nReq + warmN + 16, idleTimeoutMs: 0,
  prefixCache: { promptCacheBytes: 0 },
});
const tReady = performance.now();
const launches = () => backend.launches ?? 0;

const vocabForPrompts = Math.min(cfg.vocabSize, 5000);
const prompts = makePrompts(nReq, inTok, vocabForPrompts, seed);
if (values['write-prompts']) writePrompts(values['write-prompts'], vocabForPrompts, prompts);

const commit = benchCommit();

const result: Record<string, unknown> = {
  engine: 'llmts', device: backend.describe?.() ?? backend.name, commit, model: values.model, modelType: cfg.modelType,
  workload: {
    requests: nReq, inputTokens: inTok, outputTokens: outTok, ignoreEos: true,
    sampling: temperature > 0 ? { temperature, topP } : 'greedy', seed, vocabForPrompts,
  },
  engineConfig: {
    maxBatch, tokenBudget, maxModelLen, kvTokens, kvGiB: (kvTokens * kvBytesPerToken) / 2 ** 30, blockSize: BLOCK,
    prefixCache: 'off', warmup: values.warmup, warmupRequests: warmN, pipeline: engine.pipeline, deviceSampling: engine.deviceSampling,
  },
  // ms since process start
  backendInitMs: tBackend - tStart, loadMs: tLoaded - tBackend, readyMs: tReady,
  budgetS: Number.isFinite(budgetMs) ? budgetMs / 1000 : null,
};
const save = () => { if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2)); };
save();
log(`device   ${result.device}   commit ${commit}`);
log(`model    ${values.model} (${cfg.modelType}, ${cfg.numLayers} layers, vocab ${cfg.vocabSize}); ready ${tReady.toFixed(0)} ms after launch ` +
  `(weights ${(tLoaded - tBackend).toFixed(0)} ms)`);
log(`engine   max batch ${maxBatch}, token budget ${tokenBudget}, max model len ${maxModelLen}, KV ${kvTokens} tokens ` +
  `(${((kvTokens * kvBytesPerToken) / 2 ** 30).toFixed(1)} GiB), prefix cache off, ` +
  `${temperature > 0 ? `temperature ${temperature} top-p ${topP}` : 'greedy'}, pipeline ${engine.pipeline ? 'on' : 'off'}, ` +
  `device sampling ${engine.deviceSampling ? 'on' : 'off'}`);

/** Submits every prompt at once and resolves when each has finished (or was cancelled). */
function runBatch(name: string, ps: number[][], maxTokens: (i: number) => number, stop: Stopper, progress: boolean): Promise<Batch> {
  const n = ps.length;
  const maxGaps = ps.reduce((a, _, i) => a + Math.max(0, maxTokens(i) - 1), 0);
  const b: Batch = {
    t0: 0, tEnd: 0, first: new Float64Array(n).fill(NaN), last: new Float64Array(n).fill(NaN), end: new Float64Array(n).fill(NaN),
    count: new Int32Array(n), finish: new Array<string>(n).fill(''), errors: [], gaps: new Float64Array(maxGaps), gapN: 0,
    tokens: 0, finished: 0, firstTokens: 0, tAllFirst: NaN, tokensAtAllFirst: 0, stepsAtStart: engine.stats.steps,
    launchesAtStart: launches(), timeline: [],
  };
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout | undefined;
    const sample = () => {
      const st = engine.stats;
      b.timeline.push({ s: (performance.now() - b.t0) / 1000, tokens: b.tokens, finished: b.finished, running: st.running, waiting: st.waiting, steps: st.steps - b.stepsAtStart });
    };
    const done = () => {
      if (b.finished < n) return;
      b.tEnd = performance.now();
      if (timer) clearInterval(timer);
      if (progress) sample();
      resolve(b);
    };
    b.t0 = performance.now();
    if (progress) {
      timer = setInterval(() => {
        sample();
        const s = (performance.now() - b.t0) / 1000, st = engine.stats;
        note(`[${name}] ${s.toFixed(1)} s: ${b.tokens} output tokens (${(b.tokens / s).toFixed(1)} tok/s so far), ` +
          `${b.firstTokens}/${n} started, ${b.finished}/${n} done, running ${st.running}, waiting ${st.waiting}, steps ${st.steps - b.stepsAtStart}`);
      }, progressMs);
      timer.unref();
    }
    for (let i = 0; i < n; i++) {
      try {
        const seq = engine.submit({ promptIds: ps[i]!, maxTokens: maxTokens(i), sampling: samplingOf(i), ignoreEos: true }, (e) => {
          const now = performance.now();
          if (e.type === 'token') {
            if (b.count[i] === 0) {
              b.first[i] = now;
              if (++b.firstTokens === n) { b.tAllFirst = now; b.tokensAtAllFirst = b.tokens; }
            } else if (b.gapN < b.gaps.length) {
              b.gaps[b.gapN++] = now - b.last[i]!;
            }
            b.last[i] = now;
            b.count[i]!++;
            b.tokens++;
            return;
          }
          b.end[i] = now;
          b.finish[i] = e.finishReason;
          if (e.error) b.errors.push(`request ${i}: ${e.error}`);
          b.finished++;
          done();
        });
        stop.seqs.push(seq);
      } catch (err) {
        b.finish[i] = 'refused';
        b.errors.push(`request ${i}: ${(err as Error).message}`);
        b.end[i] = performance.now();
        b.finished++;
      }
    }
    done();
  });
}

/** The sequences of one batch, cancelled together when the process deadline passes. */
interface Stopper { seqs: Sequence[]; firedAt?: number; disarm: () => void }
function armDeadline(onFire: () => void): Stopper {
  const stop: Stopper = { seqs: [], disarm: () => {} };
  if (!Number.isFinite(deadline)) return stop;
  const t = setTimeout(() => {
    stop.firedAt = performance.now();
    onFire();
    for (const seq of stop.seqs) engine.cancel(seq, 'time budget'); // each ends at the next step boundary
  }, Math.max(0, deadline - performance.now()));
  stop.disarm = () => clearTimeout(t);
  return stop;
}

let exitCode = 0;
try {
  // ---- warm-up: kernels, cuBLASLt plans and every decode-graph bucket (not timed) ----
  if (warmN > 0) {
    const wl = Math.max(1, Math.min(32, Math.floor(tokenBudget / warmN), maxModelLen - 2 - warmN));
    const wps = makePrompts(warmN, wl, vocabForPrompts, seed + 7777);
    const wTokens = values.warmup === 'buckets' ? (i: number) => Math.min(i + 2, outTok, maxModelLen - wl) : () => Math.min(8, outTok);
    const stop = armDeadline(() => note('[warm-up] time budget reached'));
    const tw = performance.now();
    const w = await runBatch('warm-up', wps, wTokens, stop, false);
    stop.disarm();
    result.warmup = {
      s: (performance.now() - tw) / 1000, requests: warmN, promptTokens: wl, tokens: w.tokens, steps: engine.stats.steps - w.stepsAtStart,
      launches: launches() - w.launchesAtStart, errors: w.errors.slice(0, 5),
    };
    save();
    log(`warm-up  ${warmN} requests (${wl}-token prompts, ${values.warmup}): ${w.tokens} tokens in ${((performance.now() - tw) / 1000).toFixed(1)} s, ` +
      `${engine.stats.steps - w.stepsAtStart} steps`);
    if (stop.firedAt !== undefined) throw new Error('the time budget ran out during the warm-up');
    if (w.errors.length) throw new Error(`warm-up failed: ${w.errors[0]}`);
  }

  // ---- the timed run ----
  const stop = armDeadline(() => note(`[llmts] time budget reached: cancelling the remaining work of ${nReq} requests`));
  log(`run      ${nReq} requests x (${inTok} in, ${outTok} out), all submitted at once`);
  const b = await runBatch('llmts', prompts, () => outTok, stop, true);
  stop.disarm();
  const cancelledAt = stop.firedAt;
  b.cancelledAt = cancelledAt;

  const wallS = (b.tEnd - b.t0) / 1000;
  const completed = Array.from(b.finish).filter((f) => f === 'length' || f === 'stop').length;
  const started = b.firstTokens;
  const promptTokensDone = started * inTok; // a request with a token has its whole prompt computed
  const ttft: number[] = [], itl: number[] = [], e2e: number[] = [];
  for (let i = 0; i < nReq; i++) {
    if (b.count[i]! > 0) ttft.push(b.first[i]! - b.t0);
    if (b.count[i]! > 1) itl.push((b.last[i]! - b.first[i]!) / (b.count[i]! - 1));
    if (b.finish[i] === 'length' || b.finish[i] === 'stop') e2e.push(b.end[i]! - b.t0);
  }
  const steps = engine.stats.steps - b.stepsAtStart;
  const decodePhase = Number.isFinite(b.tAllFirst) && b.tEnd > b.tAllFirst
    ? { s: (b.tEnd - b.tAllFirst) / 1000, tokens: b.tokens - b.tokensAtAllFirst, tokPerS: (b.tokens - b.tokensAtAllFirst) / ((b.tEnd - b.tAllFirst) / 1000) }
    : null;
  const stats = engine.stats;
  Object.assign(result, {
    complete: completed === nReq,
    stoppedBy: cancelledAt !== undefined ? 'budget' : null,
    // when the budget cancelled the run (the step in flight then still finished)
    budgetFiredS: cancelledAt !== undefined ? (cancelledAt - b.t0) / 1000 : null,
    requestsSubmitted: nReq, requestsCompleted: completed, requestsStarted: started,
    wallS, outputTokens: b.tokens, inputTokens: promptTokensDone,
    outputTokPerS: b.tokens / wallS, totalTokPerS: (b.tokens + promptTokensDone) / wallS,
    // output tokens after every request had its first token, over the time since then
    decodePhase,
    ttftMs: dist(ttft), itlMs: { meanOfRequests: mean(itl), pooled: dist(b.gaps.subarray(0, b.gapN)) },
    e2eLatencyMs: dist(e2e),
    steps, msPerStep: (wallS * 1000) / Math.max(1, steps), launchesPerStep: (launches() - b.launchesAtStart) / Math.max(1, steps),
    finishReasons: Array.from(b.finish).reduce<Record<string, number>>((a, f) => ((a[f || 'unfinished'] = (a[f || 'unfinished'] ?? 0) + 1), a), {}),
    errors: b.errors.slice(0, 10),
    engineStats: stats,
    timeline: b.timeline.map((t) => ({ ...t, s: r1(t.s) })),
    ttftMsAll: ttft.map(Math.round),
  });
  save();
  const tt = result.ttftMs as ReturnType<typeof dist>, it = result.itlMs as { meanOfRequests: number; pooled: ReturnType<typeof dist> };
  log(`result   ${completed}/${nReq} requests completed${cancelledAt !== undefined ? ' (stopped by the time budget)' : ''} in ${wallS.toFixed(2)} s`);
  log(`         output ${(b.tokens / wallS).toFixed(1)} tok/s (${b.tokens} tokens), total ${((b.tokens + promptTokensDone) / wallS).toFixed(1)} tok/s ` +
    `(+${promptTokensDone} prompt tokens)` + (decodePhase ? `; after the last first token ${decodePhase.tokPerS.toFixed(1)} tok/s` : ''));
  log(`         TTFT mean ${tt.mean.toFixed(0)} ms, p50 ${tt.p50.toFixed(0)}, p99 ${tt.p99.toFixed(0)}; inter-token mean ${it.meanOfRequests.toFixed(2)} ms ` +
    `(pooled p50 ${it.pooled.p50.toFixed(2)}, p99 ${it.pooled.p99.toFixed(2)})`);
  log(`         ${steps} engine steps, ${(result.msPerStep as number).toFixed(2)} ms/step, ${(result.launchesPerStep as number).toFixed(0)} launches/step`);
  if (b.errors.length) { log(`errors   ${b.errors.length}, first: ${b.errors[0]}`); exitCode = 1; }
} catch (err) {
  result.error = (err as Error).stack ?? String(err);
  save();
  note(`error: ${(err as Error).message}`);
  exitCode = 1;
}
await engine.close(0);
await backend.close?.();
process.exitCode = exitCode;
