// Event-loop stalls a request can cause: /health latency (p50, p99, max) while each pathological
// input runs against `llmts serve` on the demo model, against the 50 ms target.
//
//   node --import tsx bench/server-stall.ts [--model models/demo] [--chars N] [--over-chars 4000000]
//        [--interval-ms 5] [--big-vocab 128000] [--only name,name] [--json out.json]
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
//    and a logit_bias of every token of the vocabulary with n 16;
//  - hostile but valid constraints, each new to the server (its grammar compiler loaded first): a
//    JSON schema enum of 5000 strings, an object of 500 properties, a guided_regex `.{0,65535}`
//    and a 40-field schema; the 40-field schema and the enum on a server of a random tiny model
//    with a synthetic byte-level vocabulary of --big-vocab tokens (default 128000; 0: not run),
//    where compiling costs seconds. Each runs alone, then again (new again) beside structured
//    streams (a cached schema) run back to back until its answer arrives: how many finished,
//    whether all did, and the longest gap between two chunks of one stream; and those streams
//    alone for 1.5 s on each server, for comparison.
// Each line prints the input, its status and wall time, and /health p50 / p99 / max; then the
// load average before and after, and the worst p99 against the target.
//
// bench/server-stall.figures.csv holds the figures; its a34934b rows are this script run in a copy
// of the tree at that commit (`git archive a34934b`, node_modules linked, native library built
// there), where every tokenization and template rendering ran on the event loop; its b1c63a5 rows
// the same way (this script and test/helpers/heavy-bodies.ts copied in), where every request body
// was parsed and prepared on the event loop, and every new grammar compiled on it (after a trial
// compile on the compile worker).

import { spawn } from 'node:child_process';
import http from 'node:http';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';
import { maxCharsPerToken } from '../src/artifacts/token-bound.ts';
import { DEFAULT_MAX_BODY_BYTES } from '../src/server/server.ts';
import { heavyBodies } from '../test/helpers/heavy-bodies.ts';
import { byteLevelTokenizerJson, writeSafetensors } from '../test/helpers/tiny-model.ts';
import { mulberry32 } from '../test/helpers/mulberry32.ts';
import { benchCommit } from './commit.ts';

const TARGET_MS = 50;
const BIN = fileURLToPath(new URL('../bin/llmts', import.meta.url));

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    chars: { type: 'string' },
    'over-chars': { type: 'string', default: '4000000' },
    'interval-ms': { type: 'string', default: '5' },
    'big-vocab': { type: 'string', default: '128000' },
    only: { type: 'string' },
    json: { type: 'string' },
  },
});
const intervalMs = Number(values['interval-ms']);
const overChars = Number(values['over-chars']);

async function startServer(model: string): Promise<{ port: number; stop(): Promise<void> }> {
  const proc = spawn(BIN, ['serve', '--model', model, '--port', '0', '--served-model-name', 'm'], { stdio: ['ignore', 'pipe', 'pipe'] });
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
const { intervalMs } = workerData;
let pending = [];
let timer;
let port;
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
  if (m.start !== undefined) {
    port = m.start;
    pending = [];
    timer = setInterval(() => pending.push(one()), intervalMs);
    parentPort.postMessage('started');
  } else {
    clearInterval(timer);
    parentPort.postMessage(await Promise.all(pending));
  }
});
`;

/** /health of the server on `port` every intervalMs (on the sampler thread) until stop(); the latencies of every answer. */
async function sampleHealth(port: number): Promise<{ stop(): Promise<number[]> }> {
  sampler.postMessage({ start: port });
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

/**
 * `big`: sent to the big-vocabulary server; `beside`: structured streams run alongside; `grammar`:
 * the server's grammar compiler is loaded first (its one-time start is not the case's)
 */
interface Case { name: string; route: string; body: () => string; big?: boolean; beside?: boolean; grammar?: boolean; streamsOnlyMs?: number }

/**
 * A random 2-layer model (hidden 32) whose byte-level vocabulary has `size` tokens: the 256 bytes,
 * the specials, and distinct 2-5 character ASCII strings (never produced by its tokenizer, which
 * has no merges, but each one a token the grammar compiler walks for every grammar position).
 */
function writeBigVocabModel(size: number): string {
  const dir = mkdtempSync(join(os.tmpdir(), 'llmts-bigvocab-'));
  const tok = byteLevelTokenizerJson() as { added_tokens: { id: number }[]; model: { vocab: Record<string, number> } };
  const vocab = tok.model.vocab;
  let id = 256 + tok.added_tokens.length;
  const rand = mulberry32(7);
  while (id < size) {
    let t = '';
    for (let k = 0, n = 2 + Math.floor(rand() * 4); k < n; k++) t += String.fromCharCode(0x21 + Math.floor(rand() * 94));
    if (!(t in vocab)) vocab[t] = id++;
  }
  const D = 32, I = 64, L = 2;
  const rnd = (n: number, scale: number) => Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
  const ones = (n: number) => ({ shape: [n], data: new Float32Array(n).fill(1) });
  const tensors: Record<string, { shape: number[]; data: Float32Array }> = { 'model.embed_tokens.weight': { shape: [size, D], data: rnd(size * D, 1) } };
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    Object.assign(tensors, {
      [`${p}input_layernorm.weight`]: ones(D), [`${p}post_attention_layernorm.weight`]: ones(D),
      [`${p}self_attn.q_proj.weight`]: { shape: [D, D], data: rnd(D * D, 0.2) }, [`${p}self_attn.k_proj.weight`]: { shape: [D / 2, D], data: rnd(D * D / 2, 0.2) },
      [`${p}self_attn.v_proj.weight`]: { shape: [D / 2, D], data: rnd(D * D / 2, 0.2) }, [`${p}self_attn.o_proj.weight`]: { shape: [D, D], data: rnd(D * D, 0.2) },
      [`${p}mlp.gate_proj.weight`]: { shape: [I, D], data: rnd(I * D, 0.2) }, [`${p}mlp.up_proj.weight`]: { shape: [I, D], data: rnd(I * D, 0.2) },
      [`${p}mlp.down_proj.weight`]: { shape: [D, I], data: rnd(D * I, 0.2) },
    });
  }
  tensors['model.norm.weight'] = ones(D);
  tensors['lm_head.weight'] = { shape: [size, D], data: rnd(size * D, 0.2) };
  writeSafetensors(join(dir, 'model.safetensors'), tensors);
  writeFileSync(join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: size, hidden_size: D, intermediate_size: I, num_hidden_layers: L,
    num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 2048, rms_norm_eps: 1e-6, rope_theta: 10000, hidden_act: 'silu',
    tie_word_embeddings: false, bos_token_id: 256, eos_token_id: 256,
  }));
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tok));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({
    eos_token: '<|endoftext|>', pad_token: '<|endoftext|>', clean_up_tokenization_spaces: false,
    chat_template: "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
  }));
  writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [256, 258] }));
  return dir;
}

/** a small schema every server compiles first (cached): what the structured streams beside a case use */
const PERSON = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } }, required: ['name', 'age'] };
const structured = (schema: unknown, maxTokens: number, extra: Record<string, unknown> = {}) => JSON.stringify({
  model: 'm', messages: [{ role: 'user', content: 'Reply in JSON.' }], max_tokens: maxTokens, temperature: 1,
  response_format: { type: 'json_schema', json_schema: { name: 'x', schema } }, ...extra,
});

/**
 * Structured streams (the cached PERSON schema), one after another until `until` settles: how
 * many finished with a 200 and a finish_reason, how many did not, and the longest gap between
 * two chunks of one stream.
 */
async function streamsBeside(port: number, until: Promise<unknown>): Promise<{ ok: number; failed: number; maxGapMs: number }> {
  let done = false;
  void until.finally(() => (done = true));
  let ok = 0, failed = 0, maxGapMs = 0;
  while (!done) {
    const r = await new Promise<{ good: boolean; gap: number }>((resolve) => {
      const body = structured(PERSON, 48, { stream: true });
      const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
        let last = performance.now(), gap = 0, text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => {
          const now = performance.now();
          gap = Math.max(gap, now - last);
          last = now;
          text += d;
        });
        res.on('end', () => resolve({ good: res.statusCode === 200 && /"finish_reason":"(stop|length)"/.test(text) && text.includes('data: [DONE]'), gap }));
      });
      req.on('error', () => resolve({ good: false, gap: 0 }));
      req.end(body);
    });
    if (r.good) ok++;
    else failed++;
    maxGapMs = Math.max(maxGapMs, r.gap);
  }
  return { ok, failed, maxGapMs };
}

const loadBefore = os.loadavg()[0];
const server = await startServer(values.model!);
const port = server.port;
const sampler = new Worker(SAMPLER, { eval: true, workerData: { intervalMs } });
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
// hostile but valid constraints, each new to its server (the tag): compiled, not refused unless too slow
const tag = Math.random().toString(36).slice(2, 8);
const hugeEnum = (t: string) => ({ enum: Array.from({ length: 5000 }, (_, i) => `value-${t}-${i}-${'x'.repeat(i % 17)}`) });
const manyProperties = (t: string) => ({ type: 'object', properties: Object.fromEntries(Array.from({ length: 500 }, (_, i) => [`${t}_${i}`, { type: 'integer' }])), required: [`${t}_0`, `${t}_499`] });
const fortyFields = (t: string) => ({
  type: 'object',
  properties: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`${t}_field_${i}`,
    i % 4 === 0 ? { type: 'string', maxLength: 20 } : i % 4 === 1 ? { type: 'integer', minimum: 0, maximum: 1000 }
      : i % 4 === 2 ? { enum: ['a', 'b', 'c'] } : { type: 'array', items: { type: 'object', properties: { x: { type: 'number' }, y: { type: 'string' } }, required: ['x', 'y'] } }])),
  required: Array.from({ length: 40 }, (_, i) => `${t}_field_${i}`),
  additionalProperties: false,
});
const bigVocab = Number(values['big-vocab']);
const regex = (beside: boolean) => `.{0,${beside ? 65534 : 65535}}`; // a pattern carries no tag: one bound each, both new
const hostile: [(beside: boolean) => string, (t: string, beside: boolean) => string, string?][] = [
  [() => 'schema: enum of 5000 strings', (t) => structured(hugeEnum(t), 8)],
  [() => 'schema: object of 500 properties', (t) => structured(manyProperties(t), 8)],
  [(b) => `guided_regex ${regex(b)}`, (t, b) => JSON.stringify({ model: 'm', prompt: `${t}:`, max_tokens: 8, guided_regex: regex(b) }), '/v1/completions'],
  [() => 'schema: 40 fields', (t) => structured(fortyFields(t), 8)],
];
// each alone, then again (new to the server again) beside structured streams; and the streams
// alone, for comparison
cases.push({ name: 'structured streams alone', route: '', body: () => '', beside: true, grammar: true, streamsOnlyMs: 1500 });
if (bigVocab > 0) cases.push({ name: `structured streams alone, ${bigVocab}-token vocabulary`, route: '', body: () => '', big: true, beside: true, grammar: true, streamsOnlyMs: 1500 });
for (const beside of [false, true]) {
  for (const [name, body, route] of hostile) {
    const t = `${tag}${beside ? 's' : ''}`;
    cases.push({ name: `${name(beside)}${beside ? ', beside streams' : ''}`, route: route ?? '/v1/chat/completions', body: () => body(t, beside), beside, grammar: true });
  }
  if (bigVocab > 0) {
    for (const [name, body] of [hostile[3]!, hostile[0]!]) {
      const t = `${tag}b${beside ? 's' : ''}`;
      cases.push({ name: `${name(beside)}, ${bigVocab}-token vocabulary${beside ? ', beside streams' : ''}`, route: '/v1/chat/completions', body: () => body(t, beside), big: true, beside, grammar: true });
    }
  }
}
const only = values.only?.split(',').map((s) => s.trim());
const selected = only ? cases.filter((c) => only.some((o) => c.name.includes(o))) : cases;

interface Row { name: string; status: number; requestMs: number; samples: number; p50: number; p99: number; max: number }
const rows: Row[] = [];
const besides: { name: string; ok: number; failed: number; maxGapMs: number }[] = [];
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
  const h = await sampleHealth(port);
  await new Promise((r) => setTimeout(r, 1000));
  report('quiet (no other request)', 200, 1000, await h.stop());
}
/** the big-vocabulary server, started for the first case that needs it */
let big: { port: number; stop(): Promise<void>; dir: string } | undefined;
/** servers whose grammar compiler is loaded and PERSON cached */
const warmed = new Set<number>();
for (const c of selected) {
  if (c.big && !big) {
    const dir = writeBigVocabModel(bigVocab);
    big = { ...(await startServer(dir)), dir };
  }
  const p = c.big ? big!.port : port;
  if (c.grammar && !warmed.has(p)) {
    const w = await request(p, 'POST', '/v1/chat/completions', structured(PERSON, 8));
    if (w.status !== 200) throw new Error(`warming the grammar compiler: ${w.status} ${w.text}`);
    warmed.add(p);
  }
  const body = c.body();
  const h = await sampleHealth(p);
  const answer = c.streamsOnlyMs !== undefined
    ? new Promise<{ status: number; ms: number; text: string }>((r) => setTimeout(() => r({ status: 200, ms: c.streamsOnlyMs!, text: '' }), c.streamsOnlyMs))
    : request(p, 'POST', c.route, body);
  const beside = c.beside ? streamsBeside(p, answer) : undefined;
  const r = await answer;
  report(c.name, r.status, r.ms, await h.stop());
  if (beside) {
    const b = await beside;
    besides.push({ name: c.name, ...b });
    console.log(`${''.padEnd(52)}     beside it: ${b.ok} structured streams finished, ${b.failed} did not; longest gap between chunks ${b.maxGapMs.toFixed(1)} ms`);
  }
}
await sampler.terminate();
await server.stop();
if (big) {
  await big.stop();
  rmSync(big.dir, { recursive: true, force: true });
}

const loadAfter = os.loadavg()[0];
const worst = rows.reduce((a, b) => (b.p99 > a.p99 ? b : a));
console.log(`load ${loadBefore.toFixed(1)} -> ${loadAfter.toFixed(1)}`);
console.log(`worst /health p99 ${worst.p99.toFixed(1)} ms (${worst.name}); target ${TARGET_MS} ms: ${(worst.p99 / TARGET_MS).toFixed(2)}x the target`);
if (values.json) {
  writeFileSync(values.json, JSON.stringify({
    commit: benchCommit(), date: new Date().toISOString().slice(0, 10), host: os.cpus()[0]?.model, model: values.model, context,
    maxCharsPerToken: per, chars: N, intervalMs, targetMs: TARGET_MS, bigVocab, load: [loadBefore, loadAfter], rows, besides,
  }, null, 2));
}
