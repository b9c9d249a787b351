// Soak: `llmts serve` for --minutes under mixed load, a cancel storm, and kill -9 during SSD cache
// writes followed by a restart on the same --cache-dir (with some of its files corrupted on
// purpose), checking what must hold however long it runs. Not run by CI.
//
//   node --import tsx bench/soak.ts [--model models/demo] [--minutes 2] [--cache-dir DIR]
//        [--clients 6] [--cancellers 4] [--kill-every 30] [--max-tokens 24] [--seed 1]
//
// What runs, all at once:
//  - load: --clients loops of greedy requests (completions, chat, messages; streamed or not) over
//    prompts sharing three long prefixes, each compared with its non-streamed reference, taken one
//    at a time on the first server before the load starts;
//  - a cancel storm: --cancellers loops of long streams on fresh prompts, each dropped at a random
//    point (before its head, after a random number of chunks, or a non-streamed one at a random
//    time), which also gives the SSD tier new prefixes to write;
//  - /health every 200 ms, and /metrics every 5 s (resident memory, rows, KV blocks, SSD files);
//  - every --kill-every seconds: POST /admin/cache/flush, and kill -9 as soon as a temporary
//    prefix file appears in the cache directory (a write in progress); then one prefix file's
//    header is damaged, one is truncated, one has a payload byte flipped and a garbage .kvc file is
//    added, and the server is started again on the same directory.
// Checks (each failure is printed; any makes the exit code 1): no 5xx; no request without an
// answer for 60 s (a hang); SSE framing exact (every frame `data: JSON`, one finish per choice,
// `data: [DONE]` last; Anthropic: `event: T` with data of type T, message_start to message_stop);
// a completed stream has exactly its reference's tokens (a token lost or duplicated is a failure;
// a divergence at a near-tie, both tokens' logprobs within 0.5, is counted apart: batching changes
// float rounding); /health answered whenever the server is up; every restart lists the server's
// stderr about the cache (orphaned temporary files removed, corrupt files removed) and comes up
// with the SSD files that survived; at the end the engine drains to 0 rows and 0 KV blocks, and
// SIGTERM exits 0. Prints resident memory per server lifetime with its trend (MiB/min).

import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync, truncateSync, watch, writeFileSync, writeSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { benchCommit } from './commit.ts';
import { mulberry32 } from '../test/helpers/mulberry32.ts';
import { TextTokenizer } from '../src/artifacts/tokenizer.ts';
import { KV_FILE_PREFIX_BYTES, kvFileHeaderLength } from '../src/state/kv-file.ts';

const BIN = fileURLToPath(new URL('../bin/llmts', import.meta.url));
const HANG_MS = 60_000;
const MODEL_NAME = 'soak';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    minutes: { type: 'string', default: '2' },
    'cache-dir': { type: 'string' },
    clients: { type: 'string', default: '6' },
    cancellers: { type: 'string', default: '4' },
    'kill-every': { type: 'string', default: '30' },
    'max-tokens': { type: 'string', default: '24' },
    seed: { type: 'string', default: '1' },
  },
});
const num = (name: keyof typeof values, min: number): number => {
  const v = Number(values[name]);
  if (!Number.isFinite(v) || v < min) {
    process.stderr.write(`soak: --${name} must be a number >= ${min}, got ${JSON.stringify(values[name])}\n`);
    process.exit(2);
  }
  return v;
};
const MINUTES = num('minutes', 0.1);
const CLIENTS = num('clients', 1);
const CANCELLERS = num('cancellers', 0);
const KILL_EVERY_S = num('kill-every', 5);
const MAX_TOKENS = num('max-tokens', 1);
const SEED = num('seed', 0);
const ownDir = values['cache-dir'] === undefined;
const CACHE_DIR = values['cache-dir'] ?? mkdtempSync(join(os.tmpdir(), 'llmts-soak-'));

// ---------------------------------------------------------------------------------------------
// Findings

const failures: string[] = [];
const fail = (what: string) => {
  failures.push(what);
  if (failures.length <= 40) process.stderr.write(`soak: FAIL ${what}\n`);
};
const counts: Record<string, number> = {};
const count = (k: string, n = 1) => (counts[k] = (counts[k] ?? 0) + n);
const log = (line: string) => process.stderr.write(`soak: ${line}\n`);

const rng = mulberry32(SEED);
const randInt = (n: number) => Math.floor(rng() * n);

// ---------------------------------------------------------------------------------------------
// The server

class Server {
  private constructor(
    readonly proc: ChildProcess,
    readonly url: string,
    private readonly err: () => string,
    readonly exited: Promise<number | string>,
  ) {}

  get stderr(): string {
    return this.err();
  }

  get alive(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  static async start(): Promise<Server> {
    const proc = spawn(BIN, ['serve', '--model', values.model!, '--port', '0', '--served-model-name', MODEL_NAME, '--cache-dir', CACHE_DIR], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '', err = '';
    proc.stderr!.on('data', (d) => (err += d));
    const exited = new Promise<number | string>((resolve) => proc.on('exit', (code, signal) => resolve(code ?? signal ?? -1)));
    const url = await new Promise<string>((resolve, reject) => {
      proc.stdout!.on('data', (d) => {
        out += d;
        const m = /^listening on (http:\/\/\S+)\n/m.exec(out);
        if (m) resolve(m[1]!);
      });
      void exited.then((code) => reject(new Error(`llmts serve exited (${code}) before listening; stderr:\n${err}`)));
    });
    return new Server(proc, url, () => err, exited);
  }
}

process.on('exit', () => {
  if (server?.alive) server.proc.kill('SIGKILL');
});

let server: Server;
/** bumped at every kill: a request that spans one was cut by it, not by a fault */
let epoch = 0;
let up = false;
let upChanged: () => void = () => {};
let upPromise = Promise.resolve();
const waitUp = () => (up ? Promise.resolve() : upPromise);
const setUp = (v: boolean) => {
  up = v;
  if (!v) upPromise = new Promise((r) => (upChanged = r));
  else upChanged();
};

// ---------------------------------------------------------------------------------------------
// Prompts and references

const WORDS = ['def', 'return', 'self', 'value', 'import', 'for', 'in', 'range', 'if', 'else', 'print', 'list', 'dict', 'class', 'None', 'True', 'data', 'result', 'index', 'key'];
function codeText(r: () => number, chars: number): string {
  let s = '';
  while (s.length < chars) {
    const indent = ' '.repeat(4 * Math.floor(r() * 3));
    const words = Array.from({ length: 3 + Math.floor(r() * 6) }, () => WORDS[Math.floor(r() * WORDS.length)]);
    s += `${indent}${words.join(' ')}(${Math.floor(r() * 100)})\n`;
  }
  return s;
}

type Route = '/v1/completions' | '/v1/chat/completions' | '/v1/messages';
interface Item {
  route: Route;
  body: Record<string, unknown>;
  /** the reference: tokens (with their logprobs) or, for messages, text */
  tokens?: string[];
  logprobs?: number[];
  text?: string;
}

const prefixRng = mulberry32(SEED + 1000);
const PREFIXES = [0, 1, 2].map(() => codeText(prefixRng, 2400));
const ITEMS: Item[] = [];
for (let i = 0; i < 12; i++) {
  const prefix = PREFIXES[i % 3]!;
  const suffix = codeText(prefixRng, 60);
  const common = { model: MODEL_NAME, max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true };
  ITEMS.push({ route: '/v1/completions', body: { ...common, prompt: prefix + suffix, logprobs: 0 } });
  ITEMS.push({ route: '/v1/chat/completions', body: { ...common, messages: [{ role: 'system', content: prefix }, { role: 'user', content: suffix }], logprobs: true } });
  if (i % 3 === 0) ITEMS.push({ route: '/v1/messages', body: { model: MODEL_NAME, max_tokens: MAX_TOKENS, temperature: 0, system: prefix, messages: [{ role: 'user', content: suffix }] } });
}

const headersOf = (route: string) => ({ 'content-type': 'application/json', ...(route === '/v1/messages' ? { 'anthropic-version': '2023-06-01' } : {}) });

/** the tokens, logprobs and text of a non-streamed answer */
function nonStreamed(route: Route, body: any): { tokens?: string[]; logprobs?: number[]; text: string; outputTokens: number } {
  if (route === '/v1/completions') {
    const c = body.choices[0];
    return { tokens: c.logprobs.tokens, logprobs: c.logprobs.token_logprobs, text: c.text, outputTokens: body.usage.completion_tokens };
  }
  if (route === '/v1/chat/completions') {
    const c = body.choices[0];
    return { tokens: c.logprobs.content.map((e: any) => e.token), logprobs: c.logprobs.content.map((e: any) => e.logprob), text: c.message.content, outputTokens: body.usage.completion_tokens };
  }
  return { text: body.content.map((b: any) => b.text ?? '').join(''), outputTokens: body.usage.output_tokens };
}

// ---------------------------------------------------------------------------------------------
// SSE

/** the frames' problem, or the stream's tokens, logprobs, text and usage */
function parseStream(route: Route, raw: string): { problem?: string; tokens: string[]; logprobs: number[]; text: string; outputTokens?: number } {
  const out = { tokens: [] as string[], logprobs: [] as number[], text: '', outputTokens: undefined as number | undefined };
  if (!raw.endsWith('\n\n')) return { ...out, problem: `stream does not end with a blank line: ${JSON.stringify(raw.slice(-80))}` };
  const frames = raw.slice(0, -2).split('\n\n');
  if (route !== '/v1/messages') {
    if (frames.pop() !== 'data: [DONE]') return { ...out, problem: 'stream does not end with data: [DONE]' };
    let finishes = 0;
    for (const f of frames) {
      if (!f.startsWith('data: ') || f.includes('\n')) return { ...out, problem: `bad frame ${JSON.stringify(f.slice(0, 120))}` };
      let chunk: any;
      try {
        chunk = JSON.parse(f.slice(6));
      } catch {
        return { ...out, problem: `frame is not JSON: ${JSON.stringify(f.slice(0, 120))}` };
      }
      if (chunk.error) return { ...out, problem: `error frame ${f.slice(0, 200)}` };
      if (chunk.usage) out.outputTokens = chunk.usage.completion_tokens;
      for (const c of chunk.choices ?? []) {
        if (route === '/v1/completions') {
          out.text += c.text ?? '';
          if (c.logprobs) {
            out.tokens.push(...c.logprobs.tokens);
            out.logprobs.push(...c.logprobs.token_logprobs);
          }
        } else {
          out.text += c.delta?.content ?? '';
          for (const e of c.logprobs?.content ?? []) {
            out.tokens.push(e.token);
            out.logprobs.push(e.logprob);
          }
        }
        if (c.finish_reason) finishes++;
      }
    }
    if (finishes !== 1) return { ...out, problem: `${finishes} finish_reasons in a one-choice stream` };
    return out;
  }
  const types: string[] = [];
  for (const f of frames) {
    const m = /^event: ([a-z_]+)\ndata: (.*)$/.exec(f);
    if (!m) return { ...out, problem: `bad frame ${JSON.stringify(f.slice(0, 120))}` };
    let data: any;
    try {
      data = JSON.parse(m[2]!);
    } catch {
      return { ...out, problem: `frame data is not JSON: ${JSON.stringify(f.slice(0, 120))}` };
    }
    if (data.type !== m[1]) return { ...out, problem: `event ${m[1]} carries type ${data.type}` };
    if (m[1] === 'error') return { ...out, problem: `error event ${f.slice(0, 200)}` };
    if (m[1] === 'content_block_delta') out.text += data.delta?.text ?? '';
    if (m[1] === 'message_delta') out.outputTokens = data.usage?.output_tokens;
    types.push(m[1]!);
  }
  if (types[0] !== 'message_start' || types[types.length - 1] !== 'message_stop') return { ...out, problem: `events out of order: ${types.join(',')}` };
  return out;
}

/** partial streams (the client left): every complete frame must still be well-formed */
function partialProblem(route: Route, raw: string): string | undefined {
  const complete = raw.slice(0, raw.lastIndexOf('\n\n') + 2);
  if (complete === '') return undefined;
  for (const f of complete.slice(0, -2).split('\n\n')) {
    const data = route === '/v1/messages' ? /^event: [a-z_]+\ndata: (.*)$/.exec(f)?.[1] : f.startsWith('data: ') ? f.slice(6) : undefined;
    if (data === undefined) return `bad frame ${JSON.stringify(f.slice(0, 120))}`;
    if (data === '[DONE]') continue;
    try {
      const v = JSON.parse(data);
      if (v.error) return `error frame ${data.slice(0, 200)}`;
    } catch {
      return `frame is not JSON: ${JSON.stringify(f.slice(0, 120))}`;
    }
  }
  return undefined;
}

/** tokens against the reference: equal, one lost, one duplicated, or diverged (near-tie or not) */
function compare(got: string[], gotLp: number[], want: string[], wantLp: number[]): { kind: 'ok' | 'lost' | 'duplicated' | 'tie' | 'diverged'; at?: number; gap?: number } {
  const n = Math.min(got.length, want.length);
  let i = 0;
  while (i < n && got[i] === want[i]) i++;
  if (i === got.length && i === want.length) return { kind: 'ok' };
  const same = (a: string[], b: string[]) => a.length === b.length && a.every((x, k) => x === b[k]);
  if (got.length === want.length - 1 && same(got.slice(i), want.slice(i + 1))) return { kind: 'lost', at: i };
  if (got.length === want.length + 1 && same(got.slice(i + 1), want.slice(i))) return { kind: 'duplicated', at: i };
  const gap = Math.abs((gotLp[i] ?? NaN) - (wantLp[i] ?? NaN));
  return { kind: gap <= 0.5 && got.length === want.length ? 'tie' : 'diverged', at: i, gap };
}

// ---------------------------------------------------------------------------------------------
// Clients

async function post(route: string, body: unknown, signal?: AbortSignal): Promise<Response> {
  return fetch(server.url + route, { method: 'POST', headers: headersOf(route), body: JSON.stringify(body), signal: signal ?? AbortSignal.timeout(HANG_MS) });
}

const isTimeout = (err: unknown) => (err as Error).name === 'TimeoutError';

/** a request that failed without an answer: cut by a kill, a hang, or a dropped connection */
function noAnswer(what: string, startEpoch: number, err: unknown): void {
  if (epoch !== startEpoch || !up) return void count('cut by a kill');
  if (isTimeout(err)) fail(`${what}: no answer within ${HANG_MS / 1000} s (hang)`);
  else fail(`${what}: the connection dropped without an answer (${(err as Error).message}: ${(err as { cause?: Error }).cause?.message ?? ''})`);
}

async function loadOnce(): Promise<void> {
  const item = ITEMS[randInt(ITEMS.length)]!;
  const stream = rng() < 0.6;
  const body = { ...item.body, ...(stream ? { stream: true, ...(item.route === '/v1/messages' ? {} : { stream_options: { include_usage: true } }) } : {}) };
  const what = `${item.route} ${stream ? 'stream' : 'non-stream'}`;
  const e = epoch;
  let status: number, raw: string;
  try {
    const res = await post(item.route, body);
    status = res.status;
    raw = await res.text();
  } catch (err) {
    return noAnswer(what, e, err);
  }
  if (status >= 500) return fail(`${what}: ${status} ${raw.slice(0, 200)}`);
  if (status !== 200) return fail(`${what}: ${status} ${raw.slice(0, 200)}`);
  let got: { tokens?: string[]; logprobs?: number[]; text: string; outputTokens?: number };
  if (stream) {
    const s = parseStream(item.route, raw);
    if (s.problem) return fail(`${what}: ${s.problem}`);
    got = s;
  } else got = nonStreamed(item.route, JSON.parse(raw));
  if (got.outputTokens !== MAX_TOKENS) return fail(`${what}: usage says ${got.outputTokens} output tokens, expected ${MAX_TOKENS}`);
  if (item.route === '/v1/messages') {
    if (got.text === item.text) count('matched');
    else count('messages text differs (near-tie or numerics)');
    return;
  }
  if (got.tokens!.length !== MAX_TOKENS) return fail(`${what}: ${got.tokens!.length} tokens streamed, usage says ${got.outputTokens}`);
  const c = compare(got.tokens!, got.logprobs!, item.tokens!, item.logprobs!);
  if (c.kind === 'ok') {
    if (got.text !== item.text) return fail(`${what}: the same tokens but text ${JSON.stringify(got.text)} vs ${JSON.stringify(item.text)}`);
    return void count('matched');
  }
  if (c.kind === 'tie') return void count('diverged at a near-tie');
  fail(`${what}: tokens ${c.kind} at ${c.at}${c.gap !== undefined ? ` (logprob gap ${c.gap.toFixed(3)})` : ''}: ${JSON.stringify(got.tokens!.slice(c.at, c.at! + 4))} vs ${JSON.stringify(item.tokens!.slice(c.at, c.at! + 4))}`);
}

const freshRng = mulberry32(SEED + 2000);
async function cancelOnce(): Promise<void> {
  const route: Route = (['/v1/completions', '/v1/chat/completions', '/v1/messages'] as const)[randInt(3)]!;
  const text = codeText(freshRng, 600 + randInt(1800));
  const base = route === '/v1/completions' ? { prompt: text } : { messages: [{ role: 'user', content: text }] };
  const stream = rng() < 0.8;
  const body = { model: MODEL_NAME, max_tokens: 400, temperature: 0, ignore_eos: true, ...base, ...(stream ? { stream: true } : {}) };
  const ac = new AbortController();
  const e = epoch;
  const mode = !stream ? 'timed' : rng() < 0.2 ? 'before-head' : 'chunks';
  if (mode !== 'chunks') setTimeout(() => ac.abort(), randInt(mode === 'timed' ? 600 : 40));
  try {
    const res = await post(route, body, AbortSignal.any([ac.signal, AbortSignal.timeout(HANG_MS)]));
    if (res.status >= 500) return fail(`cancel storm ${route}: ${res.status} ${(await res.text()).slice(0, 200)}`);
    if (res.status !== 200) return fail(`cancel storm ${route}: ${res.status} ${(await res.text()).slice(0, 200)}`);
    const reader = res.body!.getReader();
    const want = randInt(40);
    let raw = '';
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      raw += decoder.decode(value, { stream: true });
      if (mode === 'chunks' && raw.split('\n\n').length - 1 >= want) break;
    }
    ac.abort();
    await reader.cancel().catch(() => {});
    const p = stream ? partialProblem(route, raw) : undefined;
    if (p) fail(`cancel storm ${route}: ${p}`);
    count('cancelled');
  } catch (err) {
    if (ac.signal.aborted) return void count('cancelled');
    noAnswer(`cancel storm ${route}`, e, err);
  }
}

const health: { ms: number[] } = { ms: [] };
async function healthOnce(): Promise<void> {
  const e = epoch;
  const t0 = performance.now();
  try {
    const res = await fetch(`${server.url}/health`, { signal: AbortSignal.timeout(HANG_MS) });
    const body = await res.json() as { status?: string };
    if (res.status !== 200 || body.status !== 'ok') {
      if (epoch === e && up) fail(`/health: ${res.status} ${JSON.stringify(body)}`);
    } else health.ms.push(performance.now() - t0);
  } catch (err) {
    noAnswer('/health', e, err);
  }
}

async function scrape(url = server.url): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(HANG_MS) })).text();
  const m = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line === '') continue;
    const at = line.lastIndexOf(' ');
    m.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return m;
}

interface Life {
  started: number;
  rss: [number, number][];
  restartNotes: string[];
  /** files rejected when the server came up (the rest of its rejections were found reading them back) */
  rejectedAtStart: number;
  indexed: number;
  /** the SSD tier's counters when it was killed or stopped */
  end?: { hits: number; skipped: number; rejected: number };
}

const ssdCounters = (m: Map<string, number>) => ({
  hits: m.get('llmts_prefix_cache_hits_total{tier="ssd"}') ?? 0,
  skipped: m.get('llmts_prefix_cache_ssd_restores_skipped_total') ?? 0,
  rejected: m.get('llmts_prefix_cache_ssd_rejected_files_total') ?? 0,
});
const lives: Life[] = [];

async function sampleMetrics(): Promise<void> {
  const e = epoch;
  try {
    const m = await scrape();
    if (e !== epoch) return;
    const rss = m.get('llmts_process_resident_memory_bytes');
    if (rss !== undefined) lives[lives.length - 1]!.rss.push([(performance.now() - t0) / 60_000, rss / 2 ** 20]);
    const five = [...m].filter(([k, v]) => k.startsWith('llmts_http_requests_total{') && /status="5\d\d"/.test(k) && v > 0);
    for (const [k, v] of five) fail(`/metrics counts ${v} x ${k}`);
  } catch (err) {
    noAnswer('/metrics', e, err);
  }
}

// ---------------------------------------------------------------------------------------------
// Kill -9 during a write, damage, restart

function namespaceDirs(): string[] {
  return existsSync(CACHE_DIR) ? readdirSync(CACHE_DIR).map((n) => join(CACHE_DIR, n)).filter((p) => statSync(p).isDirectory()) : [];
}

/** POST /admin/cache/flush, and kill -9 as soon as a temporary prefix file appears (or after 3 s) */
async function killDuringWrite(): Promise<string> {
  const dirs = namespaceDirs();
  let resolveSeen!: (how: string) => void;
  const seen = new Promise<string>((r) => (resolveSeen = r));
  const watchers = dirs.map((d) => watch(d, (_event, name) => {
    if (name?.startsWith('.tmp-')) resolveSeen(`while writing ${name}`);
  }));
  const timer = setTimeout(() => resolveSeen('with no write seen in 3 s'), 3000);
  void fetch(`${server.url}/admin/cache/flush`, { method: 'POST' }).then((r) => r.text()).catch(() => {});
  const how = await seen;
  server.proc.kill('SIGKILL');
  epoch++;
  setUp(false);
  clearTimeout(timer);
  for (const w of watchers) w.close();
  await server.exited;
  return how;
}

/** files whose payload was damaged once (a second flip of the same byte would repair it) */
const flipped = new Set<string>();

/** the first tokens of the load's first shared prefix, as /v1/completions tokenizes it */
let sharedHead: number[] = [];

/** whether a prefix file holds the load's first shared prefix (so the load reads it back) */
function holdsSharedPrefix(path: string): boolean {
  try {
    const fd = openSync(path, 'r');
    try {
      const prefix = Buffer.alloc(KV_FILE_PREFIX_BYTES);
      readSync(fd, prefix, 0, prefix.length, 0);
      const json = Buffer.alloc(kvFileHeaderLength(prefix));
      readSync(fd, json, 0, json.length, KV_FILE_PREFIX_BYTES);
      const tokens = (JSON.parse(json.toString('utf8')) as { tokens: number[] }).tokens;
      return sharedHead.every((t, i) => tokens[i] === t);
    } finally {
      closeSync(fd);
    }
  } catch {
    return false;
  }
}

/** damages up to three prefix files (header, length, payload) and adds a garbage one; what it did */
function damage(): { notes: string[]; headerOrLength: number } {
  const notes: string[] = [];
  let headerOrLength = 0;
  for (const d of namespaceDirs()) {
    const files = readdirSync(d).filter((n) => n.endsWith('.kvc')).map((n) => join(d, n)).filter((f) => !flipped.has(f));
    const tmps = readdirSync(d).filter((n) => n.startsWith('.tmp-'));
    notes.push(`${files.length} prefix files and ${tmps.length} temporary files left in ${d}`);
    const pick = () => files.splice(randInt(files.length), 1)[0];
    const header = pick();
    if (header) {
      const fd = openSync(header, 'r+');
      writeSync(fd, Buffer.from('XXXXXXXX'), 0, 8, 24);
      closeSync(fd);
      headerOrLength++;
      notes.push(`header damaged: ${header}`);
    }
    const cut = pick();
    if (cut) {
      truncateSync(cut, Math.floor(statSync(cut).size * 0.6));
      headerOrLength++;
      notes.push(`truncated: ${cut}`);
    }
    // the payload damage goes where the load will read it back (its CRC is checked then)
    const shared = files.filter(holdsSharedPrefix);
    const flip = shared.length > 0 ? (files.splice(files.indexOf(shared[randInt(shared.length)]!), 1)[0]) : pick();
    if (flip) {
      // in the first block, which every restore from the file reads
      const fd = openSync(flip, 'r+');
      const prefix = Buffer.alloc(KV_FILE_PREFIX_BYTES);
      readSync(fd, prefix, 0, prefix.length, 0);
      const at = KV_FILE_PREFIX_BYTES + kvFileHeaderLength(prefix) + 16;
      const b = Buffer.alloc(1);
      readSync(fd, b, 0, 1, at);
      b[0] = b[0]! ^ 0xff;
      writeSync(fd, b, 0, 1, at);
      closeSync(fd);
      flipped.add(flip);
      notes.push(`payload byte flipped (found when read back): ${flip}${shared.length > 0 ? ' (holds a shared prefix the load asks for)' : ''}`);
    }
    writeFileSync(join(d, 'garbage.kvc'), Buffer.from(Array.from({ length: 4096 }, () => randInt(256))));
    headerOrLength++;
  }
  return { notes, headerOrLength };
}

async function restart(): Promise<void> {
  const life = lives[lives.length - 1]!;
  try {
    life.end = ssdCounters(await scrape());
  } catch {
    // the counters stay unknown
  }
  const how = await killDuringWrite();
  count('kills');
  const { notes, headerOrLength } = damage();
  const t = performance.now();
  server = await Server.start();
  const downMs = performance.now() - t;
  const err = server.stderr;
  const removed = (err.match(/prefix cache: removed \/\S+: .*/g) ?? []);
  const orphans = /removed (\d+) orphaned temporary file/.exec(err)?.[1] ?? '0';
  const tier = /SSD tier \S+ \((\d+) prefixes/.exec(err);
  const m = await scrape();
  const rejected = m.get('llmts_prefix_cache_ssd_rejected_files_total') ?? 0;
  if (rejected < headerOrLength) fail(`restart ${lives.length}: ${rejected} files rejected at startup, expected at least ${headerOrLength} (damaged header or length, garbage)`);
  if (!tier) fail(`restart ${lives.length}: the startup line does not describe the SSD tier:\n${err}`);
  lives.push({
    started: (performance.now() - t0) / 60_000, rss: [], rejectedAtStart: rejected, indexed: Number(tier?.[1] ?? 0),
    restartNotes: [
      `killed ${how}`, ...notes, `restarted in ${(downMs / 1000).toFixed(1)} s: ${tier?.[1] ?? '?'} prefixes indexed, ${orphans} orphaned temporary files removed, ` +
      `${removed.length} corrupt files removed at startup (${rejected} rejected by the metric)`,
      ...removed.map((r) => `  ${r}`),
    ],
  });
  count('restarts');
  setUp(true);
}

// ---------------------------------------------------------------------------------------------
// Run

const t0 = performance.now();

function trend(points: [number, number][]): string {
  if (points.length < 2) return 'n/a';
  const n = points.length;
  const mx = points.reduce((a, p) => a + p[0], 0) / n, my = points.reduce((a, p) => a + p[1], 0) / n;
  const sxy = points.reduce((a, p) => a + (p[0] - mx) * (p[1] - my), 0), sxx = points.reduce((a, p) => a + (p[0] - mx) ** 2, 0);
  return `${(sxy / sxx).toFixed(1)} MiB/min`;
}

async function main(): Promise<void> {
  log(`model ${values.model}, ${MINUTES} min, ${CLIENTS} clients, ${CANCELLERS} cancellers, kill -9 every ${KILL_EVERY_S} s, cache dir ${CACHE_DIR}, seed ${SEED}; commit ${benchCommit()}, ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), ${new Date().toISOString()}`);
  const tokenizer = new TextTokenizer(
    JSON.parse(readFileSync(join(values.model!, 'tokenizer.json'), 'utf8')),
    existsSync(join(values.model!, 'tokenizer_config.json')) ? JSON.parse(readFileSync(join(values.model!, 'tokenizer_config.json'), 'utf8')) : {},
  );
  sharedHead = tokenizer.encode(PREFIXES[0]!).slice(0, 32);
  server = await Server.start();
  lives.push({ started: 0, rss: [], restartNotes: ['first start'], rejectedAtStart: 0, indexed: 0 });
  setUp(true);
  // references, one at a time: no batching around them
  for (const item of ITEMS) {
    const res = await post(item.route, item.body);
    const raw = await res.text();
    if (res.status !== 200) throw new Error(`reference ${item.route}: ${res.status} ${raw}`);
    const r = nonStreamed(item.route, JSON.parse(raw));
    Object.assign(item, { tokens: r.tokens, logprobs: r.logprobs, text: r.text });
  }
  log(`${ITEMS.length} references taken in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

  const end = t0 + MINUTES * 60_000;
  const running = () => performance.now() < end;
  const loop = async (fn: () => Promise<void>, pauseMs = 0) => {
    while (running()) {
      await waitUp();
      if (!running()) break;
      await fn();
      if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs));
    }
  };
  const killer = (async () => {
    for (let k = 1; ; k++) {
      const at = t0 + k * KILL_EVERY_S * 1000;
      if (at > end - 10_000) break;
      await new Promise((r) => setTimeout(r, at - performance.now()));
      await restart();
    }
  })();
  await Promise.all([
    ...Array.from({ length: CLIENTS }, () => loop(loadOnce)),
    ...Array.from({ length: CANCELLERS }, () => loop(cancelOnce)),
    loop(healthOnce, 200),
    loop(sampleMetrics, 5000),
    killer,
  ]);

  // drained: no rows, no blocks, nothing queued
  const deadline = performance.now() + 30_000;
  let m = await scrape();
  while (!(m.get('llmts_running_rows') === 0 && m.get('llmts_kv_blocks_used') === 0 && m.get('llmts_queue_depth') === 0)) {
    if (performance.now() > deadline) {
      fail(`the engine did not drain: ${m.get('llmts_running_rows')} rows, ${m.get('llmts_kv_blocks_used')} KV blocks, ${m.get('llmts_queue_depth')} queued`);
      break;
    }
    await new Promise((r) => setTimeout(r, 100));
    m = await scrape();
  }
  lives[lives.length - 1]!.end = ssdCounters(m);
  const ssdFiles = m.get('llmts_prefix_cache_ssd_files');
  server.proc.kill('SIGTERM');
  const code = await server.exited;
  if (code !== 0) fail(`SIGTERM: exit ${code}`);

  console.log(`\nsoak: ${MINUTES} min on ${values.model}, seed ${SEED}, commit ${benchCommit()}`);
  for (const [i, life] of lives.entries()) {
    console.log(`server ${i + 1} (from ${life.started.toFixed(2)} min):`);
    for (const n of life.restartNotes) console.log(`  ${n}`);
    const e = life.end;
    if (e) {
      console.log(`  SSD tier: ${e.hits} requests restored from it, ${e.skipped} restores skipped as slower than computing, ` +
        `${e.rejected - life.rejectedAtStart} damaged files found when read back`);
      // a server that came up with files must have looked them up (restored, or predicted computing faster)
      if (i > 0 && life.indexed > 0 && e.hits + e.skipped === 0) fail(`server ${i + 1} indexed ${life.indexed} SSD files and never restored one`);
    }
    // the first sample is taken while the server warms up: the trend is from the second on
    console.log(`  RSS MiB every 5 s: ${life.rss.map(([, v]) => v.toFixed(0)).join(' ')}; trend after the first ${trend(life.rss.slice(1))}`);
  }
  const sorted = [...health.ms].sort((a, b) => a - b);
  const q = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]?.toFixed(1) ?? 'n/a';
  console.log(`at the end: ${ssdFiles} SSD files`);
  console.log(`/health: ${sorted.length} answers, p50 ${q(0.5)} ms, p99 ${q(0.99)} ms, max ${sorted[sorted.length - 1]?.toFixed(1) ?? 'n/a'} ms`);
  console.log(`requests: ${Object.entries(counts).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  console.log(failures.length === 0 ? 'checks: all passed' : `checks: ${failures.length} failures:\n  ${failures.slice(0, 40).join('\n  ')}`);
  if (ownDir) rmSync(CACHE_DIR, { recursive: true, force: true });
  process.exitCode = failures.length === 0 ? 0 : 1;
}

await main();
