// Structured output cost and jump-forward gain, engine-direct on one model:
//  1. grammar compile time: loading xgrammar + indexing the vocabulary, a cold compile of several
//     schemas, a cache hit;
//  2. decode throughput with vs without a JSON schema at B=1 and B=32 (jump-forward off, so both
//     sample every token; and on), with the time rows spend in the grammar (mask + accept) per
//     token measured in the same run;
//  3. jump-forward on vs off on a schema with long constant keys: engine steps and wall time.
//
//   node --import tsx bench/structured-output.ts --model models/demo [--tokens 128] [--batches 1,32] [--json out.json]

import { parseArgs } from 'node:util';
import { writeFileSync } from 'node:fs';
import { execSync } from 'node:child_process';
import os from 'node:os';
import { performance } from 'node:perf_hooks';
import { createCpuBackend } from '../src/backends/cpu/index.ts';
import { loadModel, type LoadedModel } from '../src/execution/load-model.ts';
import { Engine } from '../src/execution/engine.ts';
import type { EngineRequest } from '../src/execution/sequence.ts';
import { GrammarCompiler, grammarVocabFrom, type CompiledGrammar, type GrammarSpec, type RowGrammar } from '../src/sampling/grammar/index.ts';
import { TOOL_FORMATS } from '../src/generation/tool-calls/index.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    tokens: { type: 'string', default: '128' },
    batches: { type: 'string', default: '1,32' },
    repeats: { type: 'string', default: '3' },
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
const tLoad = performance.now();
const vocab = grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds);
const compiler = new GrammarCompiler(vocab);
await compiler.warm();
const loadMs = performance.now() - tLoad;
const compile: Record<string, number> = {};
const compiled: Record<string, CompiledGrammar> = {};
for (const [name, spec] of Object.entries({ person: PERSON, records: RECORDS, recordsMaxLength: RECORDS_MAXLEN, longKeys: LONG_KEYS, toolsRequired: TOOLS_REQUIRED })) {
  const c = await compiler.compile(spec);
  compile[name] = c.compileMs;
  compiled[name] = c;
}
const tHit = performance.now();
(await compiler.compile(RECORDS)).release();
const cacheHitMs = performance.now() - tHit;

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
await backend.close();

let commit = 'unknown';
try { commit = execSync('git rev-parse --short HEAD', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch {}
const result = {
  machine: `${os.cpus()[0]?.model ?? 'cpu'}, ${os.cpus().length} cores`, commit, backend: 'cpu', model: values.model,
  vocabSize: m.config.vocabSize, loadMs, compileMs: compile, cacheHitMs, throughput, jumpForward,
};

const f = (x: number, d = 1) => x.toFixed(d);
console.log(`structured output on ${values.model} (vocab ${m.config.vocabSize}), ${result.machine}, commit ${commit}`);
console.log(`\ngrammar engine load + vocabulary index: ${f(loadMs)} ms; cache hit: ${f(cacheHitMs, 2)} ms`);
console.log('cold compile (ms):', Object.entries(compile).map(([k, v]) => `${k} ${f(v)}`).join(', '));
console.log(`\n| schema | batch | no schema tok/s | schema tok/s (ratio) | schema + jump-forward tok/s (ratio) | grammar CPU ms/token |`);
console.log('|---|---|---|---|---|---|');
for (const r of throughput as any[])
  console.log(`| ${r.schema} | ${r.batch} | ${f(r.noneTokPerS)} | ${f(r.schemaTokPerS)} (${f(r.ratio, 2)}x) | ${f(r.schemaJumpForwardTokPerS)} (${f(r.ratioJumpForward, 2)}x) | ${f(r.grammarMsPerToken, 3)} |`);
console.log(`\njump-forward, long constant keys:`);
console.log('| batch | steps off -> on | seconds off -> on | speedup |');
console.log('|---|---|---|---|');
for (const r of jumpForward as any[]) console.log(`| ${r.batch} | ${r.steps.off} -> ${r.steps.on} | ${f(r.seconds.off, 2)} -> ${f(r.seconds.on, 2)} | ${f(r.speedup, 2)}x |`);
if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2));
