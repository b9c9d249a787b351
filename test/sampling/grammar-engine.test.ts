// Constrained decoding through the engine: rows with different grammars batched together, many
// seeds at temperature 1 on random-weight models (the grammar alone makes the output valid),
// jump-forward on and off, and a row whose grammar fails leaving its siblings untouched.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { createCpuBackend } from '../../src/backends/cpu/index.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import { GrammarCompiler, GrammarRowError, grammarVocabFrom, type CompiledGrammar, type GrammarSpec, type RowGrammar } from '../../src/sampling/grammar/index.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const DEMO = new URL('../../models/demo/', import.meta.url).pathname;

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    age: { type: 'integer', minimum: 0, maximum: 99 },
    ok: { type: 'boolean' },
    tags: { type: 'array', items: { enum: ['x', 'y z'] }, maxItems: 2 },
    kind: { const: 'person-record-v1' },
  },
  required: ['name', 'age', 'ok', 'tags', 'kind'],
  additionalProperties: false,
};

/** The schema above, checked by hand (no validator dependency). */
function validPerson(text: string): boolean {
  let v: any;
  try {
    v = JSON.parse(text);
  } catch {
    return false;
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return false;
  if (Object.keys(v).join(',') !== 'name,age,ok,tags,kind') return false;
  return typeof v.name === 'string' && [...v.name].length <= 6 &&
    Number.isInteger(v.age) && v.age >= 0 && v.age <= 99 && typeof v.ok === 'boolean' &&
    Array.isArray(v.tags) && v.tags.length <= 2 && v.tags.every((t: unknown) => t === 'x' || t === 'y z') &&
    v.kind === 'person-record-v1';
}

interface Case {
  spec: GrammarSpec;
  valid: (text: string) => boolean;
}

const CASES: Case[] = [
  { spec: { type: 'json_schema', schema: PERSON }, valid: validPerson },
  { spec: { type: 'regex', pattern: '[a-c]{2,4}-[0-9]{1,3}' }, valid: (t) => /^[a-c]{2,4}-[0-9]{1,3}$/.test(t) },
  { spec: { type: 'choice', choices: ['red', 'green', 'blue sky'] }, valid: (t) => ['red', 'green', 'blue sky'].includes(t) },
  { spec: { type: 'ebnf', grammar: 'root ::= "<" item ("," item)? ">"\nitem ::= [0-9] [0-9]?' }, valid: (t) => /^<\d\d?(,\d\d?)?>$/.test(t) },
];

async function compileAll(m: LoadedModel): Promise<CompiledGrammar[]> {
  const compiler = new GrammarCompiler(grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds));
  return Promise.all(CASES.map((c) => compiler.compile(c.spec)));
}

async function runBatch(m: LoadedModel, compiled: CompiledGrammar[], prompt: number[], seeds: number, jumpForward: boolean) {
  const e = new Engine(m.model, m, { maxBatch: 16 });
  const jobs: Promise<void>[] = [];
  let steps = 0;
  for (let seed = 0; seed < seeds; seed++) {
    CASES.forEach((c, k) => {
      const req: EngineRequest = {
        promptIds: prompt, maxTokens: 120, sampling: { temperature: 1, seed: seed * 10 + k },
        grammar: { createMatcher: () => compiled[k]!.createMatcher({ jumpForward }) },
      };
      jobs.push(e.complete(req).then((r) => {
        assert.equal(r.finishReason, 'stop', `${c.spec.type} seed ${seed}: ${r.finishReason} ${r.error ?? ''} ${JSON.stringify(r.text)}`);
        assert.ok(c.valid(r.text), `${c.spec.type} seed ${seed} (jump-forward ${jumpForward}): ${JSON.stringify(r.text)}`);
      }));
    });
  }
  await Promise.all(jobs);
  steps = e.stats.steps;
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
  return steps;
}

test('tiny random model: batched rows with different grammars always validate (many seeds)', async () => {
  const m = await loadModel(new ReferenceBackend(), writeTinyLlama({ maxPositions: 512 }));
  const compiled = await compileAll(m);
  const prompt = m.tokenizer.encode('Reply:', { addSpecialTokens: false });
  await runBatch(m, compiled, prompt, 12, true);
  await runBatch(m, compiled, prompt, 3, false);
});

test('demo model (BPE): constrained rows validate with and without jump-forward; jump-forward saves steps', async () => {
  const backend = await createCpuBackend();
  try {
    const m = await loadModel(backend, DEMO);
    const compiled = await compileAll(m);
    const prompt = m.applyChatTemplate([{ role: 'user', content: 'Describe a person as JSON.' }]);
    const withJump = await runBatch(m, compiled, prompt, 4, true);
    const without = await runBatch(m, compiled, prompt, 4, false);
    assert.ok(withJump < without, `jump-forward took ${withJump} steps, sampling everything ${without}`);
  } finally {
    await backend.close();
  }
});

test('a row whose grammar fails ends with an error; its siblings produce what they produce alone', async () => {
  const m = await loadModel(new ReferenceBackend(), writeTinyLlama());
  const [json] = await compileAll(m);
  const prompt = m.tokenizer.encode('go', { addSpecialTokens: false });
  const sibling = (seed: number): EngineRequest => ({
    promptIds: prompt, maxTokens: 150, sampling: { temperature: 1, seed },
    grammar: { createMatcher: () => json!.createMatcher() },
  });
  const solo = new Engine(m.model, m, { maxBatch: 4 });
  const alone = await Promise.all([1, 2].map((s) => solo.complete(sibling(s))));
  await solo.close();

  let disposed = 0;
  const failing = (): RowGrammar => {
    const real = json!.createMatcher();
    let masks = 0;
    return new Proxy(real, {
      get(target, prop, receiver) {
        if (prop === 'mask') return () => {
          if (++masks > 3) throw new GrammarRowError('the grammar allows no token at this point');
          return target.mask();
        };
        if (prop === 'dispose') return () => {
          disposed++;
          target.dispose();
        };
        const v = Reflect.get(target, prop, receiver);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    });
  };
  const e = new Engine(m.model, m, { maxBatch: 4 });
  const results = await Promise.all([
    e.complete(sibling(1)),
    e.complete({ promptIds: prompt, maxTokens: 60, sampling: { temperature: 1, seed: 9 }, grammar: { createMatcher: failing } }),
    e.complete(sibling(2)),
  ]);
  assert.equal(results[1]!.finishReason, 'error');
  assert.match(results[1]!.error!, /allows no token/);
  assert.equal(disposed, 1);
  assert.deepEqual([results[0]!.tokenIds, results[2]!.tokenIds], alone.map((r) => r.tokenIds));
  assert.ok(alone.every((r) => validPerson(r.text)));
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
});
