// Structured output cost and jump-forward gain, engine-direct on one model:
//  1. grammar compile time: loading xgrammar + indexing the vocabulary, a cold compile of several
//     schemas (split into the check on the check worker and the compile on a grammar host, both
//     off the event loop; the longest event-loop stall measured against compiling everything on
//     the event loop, `worker: false`), a cache hit; the same for a 40-field schema against a
//     synthetic vocabulary of --big-vocab tokens (default 128000);
//  2. decode throughput with vs without a JSON schema at B=1 and B=32 (jump-forward off, so both
//     sample every token; and on), with the time rows spend in the grammar (mask + accept) per
//     token measured in the same run;
//  3. jump-forward on vs off on a schema with long constant keys: engine steps and wall time.
//
//   node --import tsx bench/structured-output.ts --model models/demo [--tokens 128] [--batches 1,32] [--big-vocab 128000] [--json out.json]

import { parseArgs } from 'node:util';
import { writeFileSync } from 'node:fs';
import os from 'node:os';
import { performance } from 'node:perf_hooks';
import { createCpuBackend } from '../src/backends/cpu/index.ts';
import { loadModel, type LoadedModel } from '../src/execution/load-model.ts';
import { Engine } from '../src/execution/engine.ts';
import type { EngineRequest } from '../src/execution/sequence.ts';
import { GrammarCompiler, grammarVocabFrom, type CompiledGrammar, type GrammarSpec, type GrammarVocab, type RowGrammar } from '../src/sampling/grammar/index.ts';
import { TOOL_FORMATS } from '../src/generation/tool-calls/index.ts';
import { benchCommit } from './commit.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    tokens: { type: 'string', default: '128' },
    batches: { type: 'string', default: '1,32' },
    repeats: { type: 'string', default: '3' },
    'big-vocab': { type: 'string', default: '128000' },
    json: { type: 'string' },
  },
});
const T = Number(values.tokens);
const batches = values.batches!.split(',').map(Number);
const repeats = Number(values.repeats);

/**
 * Long output, all structure: an array of small records (at least 40, so rows run to max
 * tokens), in what OpenAI's strict mode accepts (no length limits on strings).
 */
const recordsSchema = (name: Record<string, unknown>): GrammarSpec => ({
  type: 'json_schema',
  schema: {
    type: 'array', minItems: 40,
    items: {
      type: 'object',
      properties: { id: { type: 'integer' }, name, score: { type: 'number' }, kind: { enum: ['a', 'b', 'c'] }, ok: { type: 'boolean' } },
      required: ['id', 'name', 'score', 'kind', 'ok'], additionalProperties: false,
    },
  },
});
const RECORDS = recordsSchema({ type: 'string' });
/** The same with a length-limited string: xgrammar 0.1.27 masks such strings slowly (measured below). */
const RECORDS_MAXLEN = recordsSchema({ type: 'string', maxLength: 12 });
/** Long constant keys and values: jump-forward's case. */
const LONG_KEYS: GrammarSpec = {
  type: 'json_schema',
  schema: {
    type: 'object',
    properties: {
      record_format_version_marker: { const: 'customer-record-format-version-2024-11' },
      customer_account_identifier_number: { type: 'integer', minimum: 0, maximum: 9999 },
      customer_preferred_display_name_text: { type: 'string', maxLength: 12 },
      shipping_address_primary_street_line: { type: 'string', maxLength: 12 },
      account_is_currently_active_flag: { type: 'boolean' },
      customer_loyalty_program_membership_tier: { enum: ['bronze-membership-tier', 'silver-membership-tier', 'gold-membership-tier'] },
    },
    required: ['record_format_version_marker', 'customer_account_identifier_number', 'customer_preferred_display_name_text',
      'shipping_address_primary_street_line', 'account_is_currently_active_flag', 'customer_loyalty_program_membership_tier'],
    additionalProperties: false,
  },
};
const PERSON: GrammarSpec = {
  type: 'json_schema',
  schema: { type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' } }, required: ['name', 'age'] },
};
const TOOLS_REQUIRED: GrammarSpec = TOOL_FORMATS.hermes.forcedGrammar([
  { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] } },
  { name: 'search', parameters: { type: 'object', properties: { query: { type: 'string' }, limit: { type: 'integer' } }, required: ['query'] } },
], { parallel: true });

/** 40 required fields of mixed kinds (the big-vocabulary compile case) */
const FORTY_FIELDS: GrammarSpec = {
  type: 'json_schema',
  schema: {
    type: 'object',
    properties: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`field_${i}`,
      i % 4 === 0 ? { type: 'string', maxLength: 20 } : i % 4 === 1 ? { type: 'integer', minimum: 0, maximum: 1000 }
        : i % 4 === 2 ? { enum: ['a', 'b', 'c'] } : { type: 'array', items: { type: 'object', properties: { x: { type: 'number' }, y: { type: 'string' } }, required: ['x', 'y'] } }])),
    required: Array.from({ length: 40 }, (_, i) => `field_${i}`),
    additionalProperties: false,
  },
};
const INVALID: GrammarSpec = { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'strang' } } } };

/** `model`'s tokens, then distinct concatenations of two of them, up to `size` (a byte-level vocabulary) */
function syntheticVocab(base: GrammarVocab, size: number): GrammarVocab {
  const words = base.tokens.filter((t) => t !== '');
  const tokens = base.tokens.slice(0, Math.min(size, base.tokens.length));
  const seen = new Set(tokens);
  let x = 12345;
  const next = () => {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    return x;
  };
  while (tokens.length < size) {
    const t = words[next() % words.length]! + words[next() % words.length]!;
    if (!seen.has(t)) {
      seen.add(t);
      tokens.push(t);
    }
  }
  return { ...base, tokens, vocabSize: size };
}

/** Runs `fn`, spinning the event loop meanwhile: the longest time it could not turn. */
async function stall<T>(fn: () => Promise<T>): Promise<{ value?: T; stallMs: number; totalMs: number }> {
  let last = performance.now(), worst = 0, done = false;
  const spin = () => {
    const now = performance.now();
    worst = Math.max(worst, now - last);
    last = now;
    if (!done) setImmediate(spin);
  };
  setImmediate(spin);
  const t0 = performance.now();
  let value: T | undefined;
  try {
    value = await fn();
  } catch {
    // an invalid spec: what it cost is the point
  }
  done = true;
  const end = performance.now();
  return { value, stallMs: Math.max(worst, end - last), totalMs: end - t0 };
}

interface CompileRow {
  spec: string;
  vocab: number;
  /** the check on the check worker (event loop free) */
  checkMs: number;
  /** the compile on its grammar host (event loop free) */
  compileMs: number;
  /** longest event-loop stall while it compiled, with worker threads */
  stallMs: number;
  totalMs: number;
  /** longest stall compiling it all on the event loop (worker: false) */
  inThreadStallMs: number;
}

/** The compile rows, and the compiled grammars (usable until `close()`). */
async function compileRows(v: GrammarVocab, specs: Record<string, GrammarSpec>): Promise<{ rows: CompileRow[]; compiled: Record<string, CompiledGrammar>; loadMs: number; cacheHitMs: number; close(): Promise<void> }> {
  const t0 = performance.now();
  const worker = new GrammarCompiler(v);
  await worker.warm();
  const loadMs = performance.now() - t0;
  const inThread = new GrammarCompiler(v, { worker: false });
  await inThread.warm();
  const rows: CompileRow[] = [];
  const compiled: Record<string, CompiledGrammar> = {};
  for (const [name, spec] of Object.entries(specs)) {
    const w = await stall(() => worker.compile(spec));
    const invalid = w.value === undefined;
    const i = await stall(() => inThread.compile(spec));
    i.value?.release();
    rows.push({
      spec: name, vocab: v.vocabSize, checkMs: worker.stats.lastCheckMs, compileMs: invalid ? 0 : w.value!.compileMs,
      stallMs: w.stallMs, totalMs: w.totalMs, inThreadStallMs: i.stallMs,
    });
    if (w.value) compiled[name] = w.value;
  }
  const tHit = performance.now();
  const first = Object.values(specs)[0]!;
  (await worker.compile(first)).release();
  const cacheHitMs = performance.now() - tHit;
  await inThread.close();
  return { rows, compiled, loadMs, cacheHitMs, close: () => worker.close() };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Wraps a row's grammar to time what the engine spends in it. */
function timed(g: RowGrammar, acc: { ms: number }): RowGrammar {
  return new Proxy(g, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver);
      if (typeof v !== 'function') return v;
      if (prop === 'mask' || prop === 'accept' || prop === 'onlyStopAllowed' || prop === 'jumpForward') {
        return (...args: unknown[]) => {
          const t = performance.now();
          try {
            return (v as (...a: unknown[]) => unknown).apply(target, args);
          } finally {
            acc.ms += performance.now() - t;
          }
        };
      }
      return v.bind(target);
    },
  });
}

interface RunResult {
  tokens: number;
  seconds: number;
  tokPerS: number;
  steps: number;
  grammarMsPerToken: number;
  finished: Record<string, number>;
}

async function run(m: LoadedModel, prompt: number[], B: number, maxTokens: number, grammar?: CompiledGrammar, jumpForward = false): Promise<RunResult> {
  const e = new Engine(m.model, m, { maxBatch: B, tokenBudget: Math.max(512, B * 64) });
  const acc = { ms: 0 };
  const finished: Record<string, number> = {};
  const t0 = performance.now();
  let tokens = 0;
  await Promise.all(Array.from({ length: B }, (_, i) => {
    const req: EngineRequest = {
      promptIds: prompt, maxTokens, sampling: { temperature: 0.8, seed: 1000 + i }, ignoreEos: grammar === undefined,
      ...(grammar ? { grammar: { createMatcher: () => timed(grammar.createMatcher({ jumpForward }), acc) } } : {}),
    };
    return e.complete(req).then((r) => {
      tokens += r.completionTokens;
      finished[r.finishReason] = (finished[r.finishReason] ?? 0) + 1;
    });
  }));
  const seconds = (performance.now() - t0) / 1000;
  const steps = e.stats.steps;
  await e.close();
  return { tokens, seconds, tokPerS: tokens / seconds, steps, grammarMsPerToken: acc.ms / Math.max(1, tokens), finished };
}

/**
 * Runs the configurations interleaved (a, b, c, a, b, c, ...) after one warm-up each, so load
 * from elsewhere on the machine hits them alike; returns each one's median run by tok/s.
 */
async function interleaved(fns: (() => Promise<RunResult>)[]): Promise<RunResult[]> {
  for (const fn of fns) await fn(); // warm-up
  const runs: RunResult[][] = fns.map(() => []);
  for (let r = 0; r < repeats; r++) for (let k = 0; k < fns.length; k++) runs[k]!.push(await fns[k]!());
  return runs.map((rs) => [...rs].sort((a, b) => a.tokPerS - b.tokPerS)[Math.floor(rs.length / 2)]!);
}

const backend = await createCpuBackend();
const m = await loadModel(backend, values.model!);
const prompt = m.applyChatTemplate([{ role: 'user', content: 'List customer records as JSON.' }]);

// 1. compile time
const vocab = grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds);
const own = await compileRows(vocab, {
  records: RECORDS, person: PERSON, recordsMaxLength: RECORDS_MAXLEN, longKeys: LONG_KEYS, toolsRequired: TOOLS_REQUIRED, fortyFields: FORTY_FIELDS, invalid: INVALID,
});
const { loadMs, cacheHitMs, compiled } = own;
const compileTable = [...own.rows];
const bigVocab = Number(values['big-vocab']);
if (bigVocab > 0) {
  const big = await compileRows(syntheticVocab(vocab, bigVocab), { fortyFields: FORTY_FIELDS, person: PERSON, invalid: INVALID });
  for (const c of Object.values(big.compiled)) c.release();
  await big.close();
  compileTable.push(...big.rows);
}

// 2. throughput with vs without a schema
const throughput: Record<string, unknown>[] = [];
for (const [schemaName, grammar] of [['records', compiled.records!], ['recordsMaxLength', compiled.recordsMaxLength!]] as const) {
  for (const B of batches) {
    if (schemaName === 'recordsMaxLength' && B !== batches[batches.length - 1]) continue; // one point shows the cost
    const [none, schema, schemaJf] = await interleaved([
      () => run(m, prompt, B, T),
      () => run(m, prompt, B, T, grammar, false),
      () => run(m, prompt, B, T, grammar, true),
    ]);
    throughput.push({
      schema: schemaName, batch: B, maxTokens: T,
      noneTokPerS: none.tokPerS, schemaTokPerS: schema.tokPerS, schemaJumpForwardTokPerS: schemaJf.tokPerS,
      ratio: schema.tokPerS / none.tokPerS, ratioJumpForward: schemaJf.tokPerS / none.tokPerS,
      grammarMsPerToken: schema.grammarMsPerToken, steps: { none: none.steps, schema: schema.steps, schemaJumpForward: schemaJf.steps },
      finished: schema.finished,
    });
  }
}

// 3. jump-forward on long constant keys
const jumpForward: Record<string, unknown>[] = [];
for (const B of [1, 8]) {
  const [off, on] = await interleaved([
    () => run(m, prompt, B, 400, compiled.longKeys, false),
    () => run(m, prompt, B, 400, compiled.longKeys, true),
  ]);
  jumpForward.push({
    batch: B, tokens: { off: off.tokens, on: on.tokens }, steps: { off: off.steps, on: on.steps },
    seconds: { off: off.seconds, on: on.seconds }, speedup: off.seconds / on.seconds, stepRatio: off.steps / on.steps,
  });
}
for (const c of Object.values(compiled)) c.release();
await own.close();
await backend.close();

const commit = benchCommit();
const result = {
  machine: `${os.cpus()[0]?.model ?? 'cpu'}, ${os.cpus().length} cores`, commit, backend: 'cpu', model: values.model,
  vocabSize: m.config.vocabSize, loadMs, compile: compileTable, cacheHitMs, throughput, jumpForward,
  loadAverage: os.loadavg(),
};

const f = (x: number, d = 1) => x.toFixed(d);
console.log(`structured output on ${values.model} (vocab ${m.config.vocabSize}), ${result.machine}, commit ${commit}`);
console.log(`load average at the end: ${os.loadavg().map((x) => f(x, 2)).join(' / ')}`);
console.log(`\ngrammar engine load + vocabulary index (the check worker and a grammar host): ${f(loadMs)} ms; cache hit: ${f(cacheHitMs, 2)} ms`);
console.log('\n| spec | vocab | check ms (check worker) | compile ms (grammar host) | longest loop stall, worker threads | longest loop stall, all on the loop |');
console.log('|---|---|---|---|---|---|');
for (const r of compileTable)
  console.log(`| ${r.spec} | ${r.vocab} | ${f(r.checkMs)} | ${f(r.compileMs)} | ${f(r.stallMs)} | ${f(r.inThreadStallMs)} |`);
console.log(`\n| schema | batch | no schema tok/s | schema tok/s (ratio) | schema + jump-forward tok/s (ratio) | grammar CPU ms/token |`);
console.log('|---|---|---|---|---|---|');
for (const r of throughput as any[])
  console.log(`| ${r.schema} | ${r.batch} | ${f(r.noneTokPerS)} | ${f(r.schemaTokPerS)} (${f(r.ratio, 2)}x) | ${f(r.schemaJumpForwardTokPerS)} (${f(r.ratioJumpForward, 2)}x) | ${f(r.grammarMsPerToken, 3)} |`);
console.log(`\njump-forward, long constant keys:`);
console.log('| batch | steps off -> on | seconds off -> on | speedup |');
console.log('|---|---|---|---|');
for (const r of jumpForward as any[]) console.log(`| ${r.batch} | ${r.steps.off} -> ${r.steps.on} | ${f(r.seconds.off, 2)} -> ${f(r.seconds.on, 2)} | ${f(r.speedup, 2)}x |`);
if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2));
