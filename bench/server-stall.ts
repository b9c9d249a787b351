// Event-loop stalls a request can cause: /health latency (p50, p99, max) while each pathological
// input runs against `llmts serve` on the demo model, against the 50 ms target.
//
//   node --import tsx bench/server-stall.ts [--model models/demo] [--chars N] [--over-chars 4000000]
//        [--interval-ms 5] [--only name,name] [--json out.json]
//
// A /health request is sent every --interval-ms from a thread of its own (open loop: a new one
// goes out whether or not the last was answered, each on a fresh connection, so a stalled server
// shows as many slow answers, not one), from the moment the pathological request is sent until
// its answer arrives, and for a quiet baseline before the first. The inputs (one request each):
//  - count_tokens, /v1/completions and /v1/chat/completions with one run of N spaces and one of
//    N "a"s (N = --chars, default the most characters the model's context admits: its context x
//    the tokenizer's longest token, token-bound.ts, the longest text that is tokenized at all;
//    N - 512 in a chat message, room for the template);
//  - the same routes with N characters of ordinary English text, for comparison;
//  - count_tokens with --over-chars spaces (past the bound: refused before tokenizing);
//  - bodies as large as --max-body allows of many small values (test/helpers/heavy-bodies.ts): a
//    chat of two-letter messages, an array nested in `metadata`, a logit_bias map, stop strings,
//    tools, guided_choice strings, a schema's enum, chat_template_kwargs keys, a completions
//    prompt of token ids and one of strings, Anthropic text blocks (messages and count_tokens);
//    and a logit_bias of every token of the vocabulary with n 16.
// Each line prints the input, its status and wall time, and /health p50 / p99 / max; then the
// load average before and after, and the worst p99 against the target.
//
// bench/server-stall.figures.csv holds the figures; its a34934b rows are this script run in a copy
// of the tree at that commit (`git archive a34934b`, node_modules linked, native library built
// there), where every tokenization and template rendering ran on the event loop; its b1c63a5 rows
// the same way (this script and test/helpers/heavy-bodies.ts copied in), where every request body
// was parsed and prepared on the event loop.

import { spawn } from 'node:child_process';
import http from 'node:http';
import { readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';
import { maxCharsPerToken } from '../src/artifacts/token-bound.ts';
import { DEFAULT_MAX_BODY_BYTES } from '../src/server/server.ts';
import { heavyBodies } from '../test/helpers/heavy-bodies.ts';
import { benchCommit } from './commit.ts';

const TARGET_MS = 50;
const BIN = fileURLToPath(new URL('../bin/llmts', import.meta.url));

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    chars: { type: 'string' },
    'over-chars': { type: 'string', default: '4000000' },
    'interval-ms': { type: 'string', default: '5' },
    only: { type: 'string' },
    json: { type: 'string' },
  },
});
const intervalMs = Number(values['interval-ms']);
const overChars = Number(values['over-chars']);

async function startServer(): Promise<{ port: number; stop(): Promise<void> }> {
  const proc = spawn(BIN, ['serve', '--model', values.model!, '--port', '0', '--served-model-name', 'm'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  proc.stderr.on('data', (d) => (err += d));
  const exited = new Promise<void>((resolve) => proc.on('exit', () => resolve()));
  const port = await new Promise<number>((resolve, reject) => {
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /^listening on http:\/\/[^:]+:(\d+)/m.exec(out);
      if (m) resolve(Number(m[1]));
    });
    void exited.then(() => reject(new Error(`llmts serve exited before listening: ${err}`)));
  });
  return {
    port,
    async stop() {
      proc.kill('SIGTERM');
      await exited;
    },
  };
}

/** One request on its own connection; resolves with the status and the milliseconds to the whole answer. */
function request(port: number, method: string, path: string, body?: string): Promise<{ status: number; ms: number; text: string }> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, agent: false, headers: body === undefined ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, ms: performance.now() - t0, text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

// The /health sampler runs on its own thread, so the time this thread spends building and sending
// a 4 MiB body never shows as server latency.
const SAMPLER = `
const { parentPort, workerData } = require('node:worker_threads');
const http = require('node:http');
const { port, intervalMs } = workerData;
let pending = [];
let timer;
const one = () => new Promise((resolve) => {
  const t0 = performance.now();
  const req = http.request({ host: '127.0.0.1', port, path: '/health', agent: false }, (res) => {
    res.resume();
    res.on('end', () => resolve(performance.now() - t0));
  });
  req.on('error', () => resolve(NaN));
  req.end();
});
parentPort.on('message', async (m) => {
  if (m === 'start') {
    pending = [];
    timer = setInterval(() => pending.push(one()), intervalMs);
    parentPort.postMessage('started');
  } else {
    clearInterval(timer);
    parentPort.postMessage(await Promise.all(pending));
  }
});
`;

/** /health every intervalMs (on the sampler thread) until stop(); the latencies of every answer. */
async function sampleHealth(): Promise<{ stop(): Promise<number[]> }> {
  sampler.postMessage('start');
  await fromSampler();
  return {
    async stop() {
      sampler.postMessage('stop');
      return (await fromSampler()) as number[];
    },
  };
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
}

interface Case { name: string; route: string; body: () => string }

const loadBefore = os.loadavg()[0];
const server = await startServer();
const port = server.port;
const sampler = new Worker(SAMPLER, { eval: true, workerData: { port, intervalMs } });
const fromSampler = () => new Promise<unknown>((resolve) => sampler.once('message', resolve));
const info = JSON.parse((await request(port, 'GET', '/v1/models')).text) as { data: { max_model_len: number }[] };
const context = info.data[0].max_model_len;
const per = maxCharsPerToken(JSON.parse(readFileSync(join(values.model!, 'tokenizer.json'), 'utf8')));
const N = values.chars !== undefined ? Number(values.chars) : context * (per ?? 64);

const ENGLISH = 'The committee met on Tuesday to review the budget. Several members asked whether the new library ' +
  'would open before winter, and the chair promised an answer by the end of the month. ';
const text = (n: number) => ENGLISH.repeat(Math.ceil(n / ENGLISH.length)).slice(0, n);
const messages = (content: string) => [{ role: 'user', content }];
const cases: Case[] = [];
// a message's content leaves room for what the template adds around it, so the rendered chat is
// still under the bound and gets tokenized
const M = N - 512;
for (const [label, make] of [['spaces', (n: number) => ' '.repeat(n)], ['"a"s', (n: number) => 'a'.repeat(n)], ['English text', text]] as const) {
  cases.push({ name: `count_tokens, ${M} ${label}`, route: '/v1/messages/count_tokens', body: () => JSON.stringify({ model: 'm', messages: messages(make(M)) }) });
  cases.push({ name: `completions, ${N} ${label}`, route: '/v1/completions', body: () => JSON.stringify({ model: 'm', prompt: make(N), max_tokens: 1 }) });
  cases.push({ name: `chat, ${M} ${label}`, route: '/v1/chat/completions', body: () => JSON.stringify({ model: 'm', messages: messages(make(M)), max_tokens: 1 }) });
}
cases.push({ name: `count_tokens, ${overChars} spaces (over the bound)`, route: '/v1/messages/count_tokens', body: () => JSON.stringify({ model: 'm', messages: messages(' '.repeat(overChars)) }) });
const vocabSize = (JSON.parse(readFileSync(join(values.model!, 'config.json'), 'utf8')) as { vocab_size: number }).vocab_size;
for (const b of heavyBodies(DEFAULT_MAX_BODY_BYTES - 200, 'm', vocabSize)) cases.push({ name: b.name, route: b.route, body: () => b.body });
const only = values.only?.split(',').map((s) => s.trim());
const selected = only ? cases.filter((c) => only.some((o) => c.name.includes(o))) : cases;

interface Row { name: string; status: number; requestMs: number; samples: number; p50: number; p99: number; max: number }
const rows: Row[] = [];
const report = (name: string, status: number, requestMs: number, lat: number[]) => {
  const s = [...lat].sort((a, b) => a - b);
  const row = { name, status, requestMs, samples: s.length, p50: quantile(s, 0.5), p99: quantile(s, 0.99), max: s[s.length - 1] ?? NaN };
  rows.push(row);
  console.log(`${name.padEnd(52)} ${String(status).padStart(3)} ${requestMs.toFixed(0).padStart(7)} ms | /health n=${String(row.samples).padStart(4)} ` +
    `p50 ${row.p50.toFixed(1).padStart(6)}  p99 ${row.p99.toFixed(1).padStart(7)}  max ${row.max.toFixed(1).padStart(7)} ms`);
};

console.log(`model ${values.model}: context ${context} tokens, longest token ${per ?? 'unbounded'} characters -> ${N}-character inputs; /health every ${intervalMs} ms`);
await request(port, 'POST', '/v1/completions', JSON.stringify({ model: 'm', prompt: 'warm up', max_tokens: 1 }));
{
  const h = await sampleHealth();
  await new Promise((r) => setTimeout(r, 1000));
  report('quiet (no other request)', 200, 1000, await h.stop());
}
for (const c of selected) {
  const body = c.body();
  const h = await sampleHealth();
  const r = await request(port, 'POST', c.route, body);
  report(c.name, r.status, r.ms, await h.stop());
}
await sampler.terminate();
await server.stop();

const loadAfter = os.loadavg()[0];
const worst = rows.reduce((a, b) => (b.p99 > a.p99 ? b : a));
console.log(`load ${loadBefore.toFixed(1)} -> ${loadAfter.toFixed(1)}`);
console.log(`worst /health p99 ${worst.p99.toFixed(1)} ms (${worst.name}); target ${TARGET_MS} ms: ${(worst.p99 / TARGET_MS).toFixed(2)}x the target`);
if (values.json) {
  writeFileSync(values.json, JSON.stringify({
    commit: benchCommit(), date: new Date().toISOString().slice(0, 10), host: os.cpus()[0]?.model, model: values.model, context,
    maxCharsPerToken: per, chars: N, intervalMs, targetMs: TARGET_MS, load: [loadBefore, loadAfter], rows,
  }, null, 2));
}
