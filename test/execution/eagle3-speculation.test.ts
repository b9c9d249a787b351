// Speculative decoding with an EAGLE-3 head (src/execution/methods/eagle3.ts): the demo model and
// its head (models/demo-eagle3), on the CPU backend, where a verify chunk's rows are computed as
// decode rows, so the output is plain decoding's bit for bit whatever the head drafts: greedy and
// seeded sampling, alone and batched beside plain and n-gram rows, fixed and adaptive depth,
// prompts served from the prefix cache. Drafts are checked to be made, accepted and rejected, the
// head's KV to be freed when its sequences end, its rows never to be pipelined (but an adaptive
// row that stopped drafting for good), and a head made for another model to be refused.
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
import { runOf, sameRun, type Run } from '../helpers/speculation.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const EAGLE4: SpeculativeOptions = { proposer: 'eagle3', numDraftTokens: 4 };
const ADAPTIVE: SpeculativeOptions = { proposer: 'eagle3', numDraftTokens: 'adaptive' };

let backend: CpuBackend, demo: LoadedModel, head: Eagle3Head;
before(async () => {
  backend = await createCpuBackend();
  demo = await loadModel(backend, join(ROOT, 'models/demo'), { maxModelLen: 1024 });
  head = await Eagle3Head.load(backend, loadEagle3Dir(join(ROOT, 'models/demo-eagle3'), demo.config), demo.model.weights.embed);
});
after(async () => {
  head?.dispose();
  await backend?.close();
});

const HEADERS = ['def fibonacci(n):', 'class Stack:\n    def __init__(self):', 'import os\nimport sys\n\n\ndef main(argv):', 'def parse_args(argv=None):'];
const greedy = (promptIds: number[]): EngineRequest => ({ promptIds, maxTokens: 48, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 2 });
const sampled = (promptIds: number[], k: number): EngineRequest => ({ promptIds, maxTokens: 48, sampling: { temperature: 0.8, seed: 7 + k }, ignoreEos: true, topLogprobs: 2 });

async function runEngine(opts: EngineOptions, reqs: EngineRequest[], together: boolean) {
  const e = new Engine(demo.model, demo, { maxBatch: 8, maxModelLen: 1024, draftHead: head, ...opts });
  const runs: Run[] = [];
  if (together) runs.push(...await Promise.all(reqs.map((r) => runOf(e, r))));
  else for (const r of reqs) runs.push(await runOf(e, r));
  const out = { runs, stats: e.stats, headSteps: e.draftHead!.steps, headBlocks: e.draftHead!.usedBlocks };
  await e.close(0);
  return out;
}

test('greedy and seeded sampling: plain decoding\'s tokens and logprobs, alone and batched, fixed and adaptive depth', async () => {
  const prompts = HEADERS.map((h) => demo.encode(h));
  let drafted = 0, accepted = 0;
  for (const [what, reqs] of [['greedy', prompts.map(greedy)], ['sampled', prompts.map(sampled)]] as const) {
    const plain = await runEngine({ prefixCache: { promptCacheBytes: 0 } }, reqs, false);
    for (const [how, spec, together] of [['depth 4 alone', EAGLE4, false], ['depth 4 batched', EAGLE4, true], ['adaptive batched', ADAPTIVE, true]] as const) {
      const got = await runEngine({ speculative: spec, prefixCache: { promptCacheBytes: 0 } }, reqs, together);
      got.runs.forEach((r, k) => sameRun(r, plain.runs[k]!, `${what} ${how} #${k}`));
      assert.ok(got.headSteps > 0, `${what} ${how}: the head ran`);
      assert.equal(got.headBlocks, 0, `${what} ${how}: the head's KV is freed`);
      // rows the head reads are never pipelined; an adaptive row that stops drafting for good is plain, and may be
      if (spec === EAGLE4) assert.equal(got.stats.pipelinedSteps, 0, `${what} ${how}: rows the head reads are never pipelined`);
      drafted += got.stats.speculation.draftTokens;
      accepted += got.stats.speculation.acceptedTokens;
    }
  }
  assert.ok(accepted > 0 && accepted < drafted, `drafts accepted and rejected (${accepted} of ${drafted})`);
});

test('beside plain and n-gram rows in one batch, and from the prefix cache', async () => {
  // prompts of a few KV blocks, so the second wave finds them cached
  const p = HEADERS.map((h) => demo.encode(`${h}\n    """Does what its name says; the tests of this module call it with every kind of input."""\n`));
  const reqs: EngineRequest[] = [
    { ...greedy(p[0]!), speculative: EAGLE4 },
    { ...greedy(p[1]!), speculative: false },
    { ...greedy(p[2]!), speculative: { proposer: 'ngram', numDraftTokens: 3, ngramMin: 1 } },
    { ...greedy(p[3]!), speculative: ADAPTIVE },
  ];
  const plain = await runEngine({ prefixCache: { promptCacheBytes: 0 } }, reqs.map((r) => ({ ...r, speculative: undefined })), false);
  const e = new Engine(demo.model, demo, { maxBatch: 8, maxModelLen: 1024, draftHead: head });
  for (const wave of [0, 1]) {
    const runs = await Promise.all(reqs.map((r) => runOf(e, r)));
    runs.forEach((r, k) => sameRun(r, plain.runs[k]!, `wave ${wave} request ${k}`));
    // (the adaptive row drafts what the measured step costs say pays, which depends on the machine)
    assert.ok(runs[0]!.speculation!.draftTokens > 0, `wave ${wave}: the head drafted`);
    assert.equal(runs[1]!.speculation, undefined);
    if (wave === 1) assert.ok(runs[0]!.cachedTokens > 0 && runs[3]!.cachedTokens > 0, 'the second wave\'s prompts came from the prefix cache');
  }
  assert.equal(e.draftHead!.usedBlocks, 0);
  await e.close(0);
});

test('a cancelled request frees the head\'s KV; the others finish', async () => {
  const e = new Engine(demo.model, demo, { maxBatch: 4, maxModelLen: 1024, draftHead: head, speculative: EAGLE4 });
  const ac = new AbortController();
  const c = runOf(e, { ...greedy(demo.encode(HEADERS[0]!)), maxTokens: 300 }, ac.signal, (n) => { if (n >= 10) ac.abort(); });
  const o = runOf(e, greedy(demo.encode(HEADERS[1]!)));
  const [cr, or] = await Promise.all([c, o]);
  assert.equal(cr.finish, 'cancelled');
  assert.equal(or.finish, 'length');
  assert.equal(e.draftHead!.usedBlocks, 0);
  await e.close(0);
});

test('a head made for another model is refused, and eagle3 without a head', async () => {
  const llama = await loadModel(backend, join(ROOT, 'test/fixtures/llama'), { maxModelLen: 256 });
  assert.throws(() => new Engine(llama.model, llama, { draftHead: head }), /was not made for this model \(vocabulary 512/);
  assert.throws(() => new Engine(demo.model, demo, { speculative: EAGLE4 }), /proposer 'eagle3' needs an EAGLE-3 head/);
  llama.model.dispose();
});
