// The measurements `llmts bench` makes, each a function over a loaded model or a running server:
// a dedicated single-sequence loop (no scheduler), one request through the engine, one streamed
// request through HTTP, a batch of concurrent streams, /health probes during a long prefill.

import type { LoadedModel } from '../execution/load-model.ts';
import { Engine } from '../execution/engine.ts';
import { engineSettingsFrom } from '../execution/engine-settings.ts';
import { KvCache, blocksPerSequence } from '../state/kv-cache.ts';
import { Sampler, TokenHistory } from '../sampling/index.ts';
import { IncrementalDetokenizer } from '../generation/detokenizer.ts';

export const percentile = (xs: readonly number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
};
export const median = (xs: readonly number[]): number => percentile(xs, 50);

/** Deterministic prompt ids (distinct per seed), below min(vocab, 4010). */
export function promptOf(seed: number, n: number, vocab: number): number[] {
  return Array.from({ length: n }, (_, k) => ((seed * 7919 + k * 104729) % Math.min(vocab - 10, 4000)) + 10);
}

/**
 * A dedicated single-sequence path: step, pick the token, detokenize, repeat — the per-token work a
 * user gets (text out) without the scheduler, admission, events or streams. It takes the engine's
 * fastest kernels too: the device's argmax where the backend has one and, on CUDA, the captured
 * decode graphs. Returns decode tok/s after the first token.
 */
export async function dedicatedLoop(m: LoadedModel, prompt: readonly number[], tokens: number): Promise<number> {
  const cfg = m.config, backend = m.model.backend;
  const total = prompt.length + tokens;
  const bs = 16;
  const kv = new KvCache(backend, cfg.layers.map((l) => l.window), { numKvHeads: cfg.numKvHeads, headDim: cfg.headDim, blockSize: bs },
    (s) => blocksPerSequence(s.window, total, bs, 512));
  const seq = kv.newSequence();
  const sampler = new Sampler({ temperature: 0 }, { vocabSize: cfg.vocabSize });
  const history = new TokenHistory(prompt);
  const detok = new IncrementalDetokenizer(m.decode, { contextTokens: prompt });
  // as the engine would: graphs unless $LLMTS_GRAPHS=off (EngineSettings.graphs)
  const graphWidth = engineSettingsFrom(process.env).graphs ? Math.ceil(total / bs) + 1 : undefined;
  const next = async (ids: Int32Array, start: number): Promise<number> => {
    kv.grow(seq, start, start + ids.length);
    const r = await m.model.step({ tokens: ids, rows: [{ seq, start, count: ids.length }], logitTokens: [ids.length - 1], graphWidth }, kv, [false]);
    return r.tokens ? r.tokens[0]! : sampler.sample(r.logits, history);
  };
  try {
    let id = await next(Int32Array.from(prompt), 0);
    const t0 = performance.now();
    for (let k = 0; k < tokens - 1; k++) {
      history.push(id);
      detok.push(id);
      id = await next(Int32Array.of(id), prompt.length + k);
    }
    return (tokens - 1) / ((performance.now() - t0) / 1000);
  } finally {
    kv.release(seq);
    m.model.releaseGraphs(kv);
    kv.dispose();
  }
}

/** One greedy request through a fresh engine: [decode tok/s after the first token, tokens / (submit .. last token)]. */
export async function engineSingle(m: LoadedModel, prompt: readonly number[], tokens: number, maxModelLen: number): Promise<[number, number]> {
  const engine = new Engine(m.model, m, { maxBatch: 1, maxModelLen, prefixCache: { promptCacheBytes: 0 } });
  let tFirst = 0, n = 0;
  const t0 = performance.now();
  try {
    for await (const e of engine.generate({ promptIds: prompt, maxTokens: tokens, sampling: { temperature: 0 }, ignoreEos: true })) {
      if (e.type === 'token' && n++ === 0) tFirst = performance.now();
      if (e.type === 'finish' && e.finishReason === 'error') throw new Error(`engine request failed: ${e.error}`);
    }
  } finally {
    await engine.close(0);
  }
  const t1 = performance.now();
  return [(n - 1) / ((t1 - tFirst) / 1000), n / ((t1 - t0) / 1000)];
}

export interface StreamResult {
  ttftMs: number;
  tokens: number;
  totalMs: number;
}

/**
 * One streamed greedy completion from a server (served model name `model`). Tokens are the final
 * usage chunk's completion_tokens: a token that decodes to no text sends no chunk. TTFT is the first
 * chunk with text, so prefer `totalMs` (request to [DONE]) when few tokens carry text.
 */
export async function streamCompletion(base: string, model: string, promptIds: readonly number[], maxTokens: number): Promise<StreamResult> {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model, prompt: promptIds, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (res.status !== 200) throw new Error(`POST /v1/completions answered ${res.status}: ${await res.text()}`);
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
  return { ttftMs: (tFirst || t1) - t0, tokens, totalMs: t1 - t0 };
}

export interface ConcurrencyResult {
  streams: number;
  outputTokPerS: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
}

/** `n` concurrent streams of `tokens` tokens each, distinct prompts of `promptTokens` ids. */
export async function concurrentStreams(base: string, model: string, n: number, promptTokens: number, tokens: number,
  vocab: number): Promise<ConcurrencyResult> {
  const t0 = performance.now();
  const results = await Promise.all(Array.from({ length: n }, (_, k) => streamCompletion(base, model, promptOf(k + 2, promptTokens, vocab), tokens)));
  const wall = (performance.now() - t0) / 1000;
  const ttfts = results.map((r) => r.ttftMs);
  return {
    streams: n, outputTokPerS: results.reduce((a, r) => a + r.tokens, 0) / wall, ttftP50Ms: median(ttfts), ttftP99Ms: percentile(ttfts, 99),
  };
}

export interface HealthResult {
  samples: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  prefillTokens: number;
  prefillRequestMs: number;
  /** the server's own longest event-loop stall during the request */
  serverLoopLagMaxMs: number;
}

/** prom-client samples the loop delay with a 10 ms timer and records whole intervals: an idle loop reads 10 ms */
const LOOP_SAMPLE_MS = 10;

/**
 * /health probed back to back while one long prompt prefills. The server's own longest stall comes
 * from its loop-delay metric, which prom-client resets at every scrape: a scrape before and one
 * after the request bound it (a slow probe alone cannot tell the server's stall from this one's).
 */
export async function healthDuringPrefill(base: string, model: string, longPrompt: readonly number[]): Promise<HealthResult> {
  const loopLagMaxS = async (): Promise<number> => {
    const text = await fetch(`${base}/metrics`).then((r) => r.text());
    const hit = /^llmts_nodejs_eventloop_lag_max_seconds\s+([0-9.eE+-]+)/m.exec(text);
    return hit ? Number(hit[1]) : NaN;
  };
  await loopLagMaxS();
  const healthMs: number[] = [];
  let done = false;
  const long = streamCompletion(base, model, longPrompt, 4).finally(() => (done = true));
  while (!done) {
    const t = performance.now();
    await fetch(`${base}/health`).then((r) => r.text());
    healthMs.push(performance.now() - t);
    await new Promise((r) => setTimeout(r, 2));
  }
  const r = await long;
  const serverLoopLagMaxMs = Math.max(0, 1000 * (await loopLagMaxS()) - LOOP_SAMPLE_MS);
  return {
    samples: healthMs.length, p50Ms: median(healthMs), p99Ms: percentile(healthMs, 99), maxMs: Math.max(...healthMs),
    prefillTokens: longPrompt.length, prefillRequestMs: r.totalMs, serverLoopLagMaxMs,
  };
}
