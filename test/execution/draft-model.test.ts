// Speculative decoding with a draft model (src/execution/methods/draft-model.ts): the target's
// output is plain decoding's bit for bit (the CPU backend computes a verify chunk's rows as decode
// rows), whatever the draft proposes; a target drafting for itself has every draft accepted; the
// draft's KV is freed when its sequence ends; a draft model that cannot propose for the target is
// refused with a clear error.
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';

import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import type { SpeculativeOptions } from '../../src/execution/methods/speculative.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import { runOf, sameRun, type Run } from '../helpers/speculation.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');
const DRAFT4: SpeculativeOptions = { proposer: 'draft', numDraftTokens: 4 };
const ADAPTIVE: SpeculativeOptions = { proposer: 'draft', numDraftTokens: 'adaptive' };

async function withModels<T>(target: string, draft: string, body: (t: LoadedModel, d: LoadedModel) => Promise<T>): Promise<T> {
  const backend = await createCpuBackend();
  try {
    const t = await loadModel(backend, join(FIXTURES, target), { maxModelLen: 512 });
    const d = draft === target ? t : await loadModel(backend, join(FIXTURES, draft), { maxModelLen: 512 });
    return await body(t, d);
  } finally {
    await backend.close();
  }
}

const prompts = (m: LoadedModel) => [
  'def fibonacci(n):\n    if n < 2:\n        return n\n',
  'The quick brown fox jumps over the lazy dog. The quick brown',
  'for i in range(10):\n    print(i)\nfor j in range(10):\n',
  'a b c d e f g a b c d e f g a b',
].map((t) => m.encode(t));

const greedy = (promptIds: number[]): EngineRequest => ({ promptIds, maxTokens: 40, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 2 });
const sampled = (promptIds: number[], k: number): EngineRequest => ({ promptIds, maxTokens: 40, sampling: { temperature: 0.9, topP: 0.95, seed: 40 + k }, ignoreEos: true, topLogprobs: 2 });

async function runEngine(t: LoadedModel, opts: EngineOptions, reqs: EngineRequest[], together: boolean) {
  const e = new Engine(t.model, t, { maxBatch: 8, maxModelLen: 512, prefixCache: { promptCacheBytes: 0 }, ...opts });
  const runs: Run[] = [];
  if (together) runs.push(...await Promise.all(reqs.map((r) => runOf(e, r))));
  else for (const r of reqs) runs.push(await runOf(e, r));
  const stats = { ...e.stats.speculation, draftSteps: e.draftModel?.steps ?? 0, draftBlocks: e.draftModel?.usedBlocks ?? 0 };
  await e.close(0);
  return { runs, stats };
}

test('a target drafting for itself: plain decoding\'s tokens and logprobs, every draft accepted', () => withModels('llama', 'llama', async (t, d) => {
  const reqs = prompts(t).map(greedy);
  const plain = await runEngine(t, {}, reqs, false);
  const spec = await runEngine(t, { speculative: DRAFT4, draftModel: d }, reqs, false);
  spec.runs.forEach((r, k) => sameRun(r, plain.runs[k]!, `request ${k}`));
  assert.ok(spec.stats.draftTokens > 100, `drafted ${spec.stats.draftTokens}`);
  assert.equal(spec.stats.acceptedTokens, spec.stats.draftTokens, 'the target agrees with itself');
  assert.equal(spec.stats.draftBlocks, 0, 'the draft KV is freed');
}));

test('another model as the draft: lossless alone and batched, greedy and seeded sampling, fixed and adaptive depth', () => withModels('llama', 'qwen3', async (t, d) => {
  const ps = prompts(t);
  for (const [what, reqs] of [['greedy', ps.map(greedy)], ['sampled', ps.map(sampled)]] as const) {
    const plain = await runEngine(t, {}, reqs, false);
    for (const [how, spec, together] of [['depth 4 alone', DRAFT4, false], ['depth 4 batched', DRAFT4, true], ['adaptive batched', ADAPTIVE, true]] as const) {
      const got = await runEngine(t, { speculative: spec, draftModel: d }, reqs, together);
      got.runs.forEach((r, k) => sameRun(r, plain.runs[k]!, `${what} ${how} #${k}`));
      // an adaptive depth drafts what the measured step costs say pays, which depends on the machine
      if (spec !== ADAPTIVE) assert.ok(got.stats.draftTokens > 0 && got.stats.draftSteps > 0, `${what} ${how}: drafts were made and verified`);
      assert.equal(got.stats.draftBlocks, 0, `${what} ${how}: the draft KV is freed`);
    }
  }
}));

test('per request: a request may ask for the draft model, another for n-grams or none, in one batch', () => withModels('llama', 'llama', async (t, d) => {
  const ps = prompts(t);
  const reqs: EngineRequest[] = [
    { ...greedy(ps[0]!), speculative: DRAFT4 },
    { ...greedy(ps[1]!), speculative: { proposer: 'ngram', numDraftTokens: 3, ngramMin: 1 } },
    { ...greedy(ps[2]!), speculative: false },
    greedy(ps[3]!),
  ];
  const plain = await runEngine(t, {}, reqs.map((r) => ({ ...r, speculative: undefined })), false);
  const got = await runEngine(t, { draftModel: d }, reqs, true);
  got.runs.forEach((r, k) => sameRun(r, plain.runs[k]!, `request ${k}`));
  assert.ok(got.runs[0]!.speculation!.draftTokens > 0, 'the draft-model request drafted');
  assert.equal(got.runs[2]!.speculation, undefined, 'speculative: false decodes plainly');
}));

test('a cancelled request frees its draft KV; the others finish', () => withModels('llama', 'llama', async (t, d) => {
  const e = new Engine(t.model, t, { maxBatch: 4, maxModelLen: 512, speculative: DRAFT4, draftModel: d });
  const ac = new AbortController();
  const ps = prompts(t);
  let seen = 0;
  const cancelled = runOf(e, { ...greedy(ps[0]!), maxTokens: 200 }, ac.signal, (n) => { seen = n; if (n >= 8) ac.abort(); });
  const other = runOf(e, greedy(ps[1]!));
  const [c, o] = await Promise.all([cancelled, other]);
  assert.equal(c.finish, 'cancelled');
  assert.ok(seen >= 8 && c.tokens.length < 200);
  assert.equal(o.finish, 'length');
  assert.equal(e.draftModel!.usedBlocks, 0);
  await e.close(0);
}));

test('a draft model that cannot propose for the target is refused', async () => {
  const backend = await createCpuBackend();
  try {
    const t = await loadModel(backend, join(FIXTURES, 'llama'), { maxModelLen: 512 });
    const other = await loadModel(backend, writeTinyLlama(), { maxModelLen: 512 }); // its own vocabulary
    assert.throws(() => new Engine(t.model, t, { draftModel: other }), /vocabulary of \d+ tokens, the target 512/);
    assert.throws(() => new Engine(t.model, t, { speculative: DRAFT4 }), /proposer 'draft' needs a draft model/);
    const e = new Engine(t.model, t, { maxModelLen: 512 });
    assert.throws(() => e.submit({ ...greedy([1, 2, 3]), speculative: DRAFT4 }, () => {}), /proposer 'draft' needs a draft model/);
    await e.close(0);
    // same vocabulary size, different tokenizer
    const renamed = { ...t, dir: 'renamed', encode: (text: string) => t.encode(text).map((id) => (id + 1) % 512) };
    assert.throws(() => new Engine(t.model, t, { draftModel: renamed }), /tokenizes text differently/);
  } finally {
    await backend.close();
  }
});

const FAMILIES = readdirSync(FIXTURES).filter((d) => existsSync(join(FIXTURES, d, 'config.json')) && existsSync(join(FIXTURES, d, 'reference.json')));

test('every fixture family as the target, the qwen3 fixture drafting: 16 staggered requests mixing plain, n-gram and draft-model rows of different depths equal their plain runs alone', async () => {
  const backend = await createCpuBackend();
  try {
    const draft = await loadModel(backend, join(FIXTURES, 'qwen3'), { maxModelLen: 512 });
    let drafted = 0;
    for (const name of FAMILIES) {
      const m = await loadModel(backend, join(FIXTURES, name), { maxModelLen: 512 });
      const cases = (JSON.parse(readFileSync(join(FIXTURES, name, 'reference.json'), 'utf8')) as { cases: { prompt_token_ids: number[] }[] }).cases;
      const reqs: EngineRequest[] = Array.from({ length: 16 }, (_, k) => ({
        promptIds: cases[k % cases.length]!.prompt_token_ids, maxTokens: 10 + ((k * 7) % 23), sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 2,
      }));
      const solo: Run[] = [];
      const plainEngine = new Engine(m.model, m, { maxBatch: 8, maxModelLen: 512 });
      for (const r of reqs) solo.push(await runOf(plainEngine, r));
      await plainEngine.close(0);
      const kinds: (SpeculativeOptions | false)[] = [false, DRAFT4, ADAPTIVE, { proposer: 'draft', numDraftTokens: 2 }, { proposer: 'ngram', ngramMin: 1 }];
      const e = new Engine(m.model, m, { maxBatch: 8, tokenBudget: 24, maxModelLen: 512, draftModel: draft });
      let produced = 0;
      const jobs: Promise<Run>[] = [];
      for (const [k, r] of reqs.entries()) {
        jobs.push(runOf(e, { ...r, speculative: kinds[k % kinds.length]! }, undefined, () => produced++));
        const target = produced + 3;
        while (produced < target && e.stats.running + e.stats.waiting > 0) await new Promise((res) => setTimeout(res, 1));
      }
      const runs = await Promise.all(jobs);
      runs.forEach((r, k) => sameRun(r, solo[k]!, `${name} request ${k}`));
      assert.equal(e.draftModel!.usedBlocks, 0, `${name}: the draft KV is freed`);
      if (!e.speculationOff) {
        assert.ok(e.stats.speculation.draftTokens > 0, `${name}: drafts verified`);
        drafted++;
      }
      await e.close(0);
      m.model.dispose();
    }
    assert.ok(drafted >= FAMILIES.length - 3, `${drafted} of ${FAMILIES.length} families speculated`);
  } finally {
    await backend.close();
  }
});
