// Speculative decoding of grammar-constrained rows (src/execution/methods/speculative.ts): the
// target's token at every draft position is taken under the grammar's mask of that position, so
// the output is plain constrained decoding's, bit for bit on the CPU backend: jump-forward on and
// off, a grammar that ends (only a stop token allowed) inside a run of drafts, max_tokens inside
// one, greedy and seeded sampling, every proposer (scripted drafts of the plain output, right and
// wrong; n-gram; the demo's draft model and EAGLE-3 head), alone and batched beside plain rows.
// Every case also checks that drafts were verified and accepted, so none passes with speculation
// silently off. Mutations that fail it: not ending the run where the grammar forces text (the
// target then spells the forced text its own way: tokens differ), and not ending the row where
// the grammar allows only a stop token (an EOS is then emitted and counted).
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';

import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadEagle3Dir } from '../../src/artifacts/eagle3.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import type { SpeculativeOptions } from '../../src/execution/methods/speculative.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import { Eagle3Head } from '../../src/models/eagle3.ts';
import { GrammarCompiler, grammarVocabFrom, type CompiledGrammar, type GrammarSpec } from '../../src/sampling/grammar/index.ts';
import { runOf, sameRun, scripted, type Run } from '../helpers/speculation.ts';

const ROOT = resolve(import.meta.dirname, '../..');

const ITEMS = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 12 }, items: { type: 'array', items: { type: 'string', maxLength: 10 }, maxItems: 3 } },
  required: ['name', 'items'],
  additionalProperties: false,
};
const SPECS: { spec: GrammarSpec; prompt: string }[] = [
  { spec: { type: 'json_schema', schema: ITEMS }, prompt: '{"name": "stack", "items": ["push", "pop"]}\n{"name": "queue", "items": ["push", "pop"]}\n' },
  { spec: { type: 'regex', pattern: '(def [a-z_]{1,12}\\(self\\):\\n    return [a-z_.]{1,16}\\n){2}' }, prompt: 'class Stack:\n    def top(self):\n        return self.items\n\n' },
  { spec: { type: 'choice', choices: ['def add(a, b):\n    return a + b\n', 'def sub(a, b):\n    return a - b\n'] }, prompt: 'def add(a, b):\n    return a + b\n\n\n' },
];

let backend: CpuBackend, demo: LoadedModel, draft: LoadedModel, head: Eagle3Head, compiler: GrammarCompiler;
const grammars: CompiledGrammar[] = [];
before(async () => {
  backend = await createCpuBackend();
  demo = await loadModel(backend, join(ROOT, 'models/demo'), { maxModelLen: 1024 });
  draft = await loadModel(backend, join(ROOT, 'models/demo-draft'), { maxModelLen: 1024 });
  head = await Eagle3Head.load(backend, loadEagle3Dir(join(ROOT, 'models/demo-eagle3'), demo.config), demo.model.weights.embed);
  compiler = new GrammarCompiler(grammarVocabFrom(demo.tokenizer, demo.config.vocabSize, demo.eosIds));
  for (const { spec } of SPECS) grammars.push(await compiler.compile(spec));
});
after(async () => {
  for (const g of grammars) g.release();
  await compiler?.close();
  head?.dispose();
  await backend?.close();
});

/**
 * Every grammar with jump-forward on and off (off with logprobs, which turn it off anyway), greedy
 * or seeded sampling, and one request cut by max_tokens mid-way.
 */
function requests(sampled: boolean): EngineRequest[] {
  const reqs: EngineRequest[] = [];
  SPECS.forEach(({ prompt }, g) => {
    for (const jumpForward of [true, false]) {
      reqs.push({
        promptIds: demo.encode(prompt),
        maxTokens: g === 0 && jumpForward ? 13 : 64,
        sampling: sampled ? { temperature: 0.9, seed: 11 + reqs.length } : { temperature: 0 },
        ...(jumpForward ? {} : { topLogprobs: 2 }),
        grammar: { createMatcher: () => grammars[g]!.createMatcher({ jumpForward }) },
      });
    }
  });
  return reqs;
}

async function runEngine(opts: EngineOptions, reqs: EngineRequest[], together: boolean) {
  const e = new Engine(demo.model, demo, { maxBatch: 8, maxModelLen: 1024, prefixCache: { promptCacheBytes: 0 }, draftModel: draft, draftHead: head, ...opts });
  const runs: Run[] = [];
  if (together) runs.push(...await Promise.all(reqs.map((r) => runOf(e, r))));
  else for (const r of reqs) runs.push(await runOf(e, r));
  const stats = e.stats.speculation;
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close(0);
  return { runs, stats };
}

/**
 * Bit for bit where every row samples on the host; with device sampling a grammar row's steps
 * with drafts take host logits, whose logprobs are computed in float64 where the device's are
 * float32: the same tokens, logprobs within 1e-5.
 */
function sameRuns(got: Run[], want: Run[], what: string, exact: boolean): void {
  got.forEach((r, k) => {
    if (exact) return sameRun(r, want[k]!, `${what} #${k}`);
    const strip = (x: Run) => ({ ...x, logprobs: [], top: x.top.map((t) => t.filter((_, i) => i % 2 === 0)) });
    sameRun(strip(r), strip(want[k]!), `${what} #${k}`);
    r.logprobs.forEach((l, i) => assert.ok(Math.abs(l - want[k]!.logprobs[i]!) <= 1e-5, `${what} #${k} token ${i}: logprob ${l} vs ${want[k]!.logprobs[i]}`));
    r.top.forEach((t, i) => t.forEach((v, j) => assert.ok(Math.abs(v - want[k]!.top[i]![j]!) <= 1e-5, `${what} #${k} token ${i}: top logprobs`)));
  });
}

test('grammar rows with scripted drafts (the plain output, right and wrong): plain constrained decoding, greedy and seeded', async () => {
  for (const sampled of [false, true]) {
    const reqs = requests(sampled);
    const host = { deviceSampling: false };
    const plain = await runEngine(host, reqs, false);
    plain.runs.forEach((r, k) => assert.ok(r.error === undefined && r.tokens.length > 0, `plain #${k}: ${r.error}`));
    assert.ok(plain.runs.some((r) => r.finish === 'stop') && plain.runs.some((r) => r.finish === 'length'), 'grammars that end and a request cut by max_tokens');
    const V = demo.config.vocabSize;
    for (const [how, wrong] of [['right', () => false], ['every third wrong', (i: number) => i % 3 === 2]] as const) {
      const withDrafts = (together: boolean) => runEngine(host, reqs.map((r, k) => ({ ...r, speculative: { proposer: scripted(plain.runs[k]!.tokens, V, wrong), numDraftTokens: 4 } })), together);
      for (const together of [false, true]) {
        const got = await withDrafts(together);
        const what = `${sampled ? 'sampled' : 'greedy'}, ${how}, ${together ? 'batched' : 'alone'}`;
        sameRuns(got.runs, plain.runs, what, true);
        assert.ok(got.stats.acceptedTokens > 0, `${what}: drafts accepted`);
        if (how !== 'right') assert.ok(got.stats.acceptedTokens < got.stats.draftTokens, `${what}: drafts rejected`);
      }
    }
  }
});

test('grammar rows with n-gram drafts, the draft model and the EAGLE-3 head, batched beside plain rows: plain constrained decoding', async () => {
  const reqs = requests(false);
  const plainRows: EngineRequest[] = [demo.encode('def fibonacci(n):'), demo.encode('import os\n')].map((promptIds) =>
    ({ promptIds, maxTokens: 40, sampling: { temperature: 0 }, ignoreEos: true }));
  const plain = await runEngine({}, [...reqs, ...plainRows], true);
  const proposers: [string, SpeculativeOptions][] = [
    ['n-gram', { proposer: 'ngram', numDraftTokens: 4, ngramMin: 1 }],
    ['draft model', { proposer: 'draft', numDraftTokens: 3 }],
    ['EAGLE-3 head', { proposer: 'eagle3', numDraftTokens: 3 }],
  ];
  for (const [what, speculative] of proposers) {
    const got = await runEngine({}, [...reqs.map((r) => ({ ...r, speculative })), ...plainRows], true);
    sameRuns(got.runs, plain.runs, what, false);
    const drafted = got.runs.slice(0, reqs.length).reduce((n, r) => n + (r.speculation?.draftTokens ?? 0), 0);
    const accepted = got.runs.slice(0, reqs.length).reduce((n, r) => n + (r.speculation?.acceptedTokens ?? 0), 0);
    assert.ok(drafted > 0 && accepted > 0, `${what}: the grammar rows' drafts were verified and accepted (${accepted} of ${drafted})`);
  }
});
