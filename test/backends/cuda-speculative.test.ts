// Speculative decoding on CUDA: verify steps (a row's token and its drafts in one chunk, several
// logit rows a row, run op by op beside graph-replayed decode steps) give what plain decoding gives.
// In batch-invariant mode (CudaSettings.batchInvariant) a verify chunk's rows are computed as
// decode rows are, so the comparison is bit for bit: tokens and logprobs (Object.is), alone and
// four requests at once, greedy and seeded sampling, on the demo model (bf16: tensor-core
// attention, decode graphs) and the llama fixture (f32 weights). Every case checks that drafts
// were verified, accepted and rejected, so none passes with speculation silently off. Then the
// demo's draft model and EAGLE-3 head (models/demo-draft, models/demo-eagle3) on the GPU, likewise
// bit for bit. Skipped
// with the reason where CUDA is not usable (CI).
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { type CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import type { SpeculativeOptions } from '../../src/execution/methods/speculative.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import { loadEagle3Dir } from '../../src/artifacts/eagle3.ts';
import { Eagle3Head } from '../../src/models/eagle3.ts';
import { runOf, sameRun, type Run } from '../helpers/speculation.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
if (SKIP) console.log(`# cuda-speculative: skipping every test: ${SKIP}`);

const ROOT = resolve(import.meta.dirname, '../..');
const NGRAM: SpeculativeOptions = { proposer: 'ngram', numDraftTokens: 4, ngramMin: 1, ngramMax: 3 };
const ADAPTIVE: SpeculativeOptions = { proposer: 'ngram', numDraftTokens: 'adaptive', ngramMin: 1, ngramMax: 3 };

let backend: CudaBackend;
before(async () => {
  if (SKIP) return;
  backend = await createCudaBackend({ settings: { batchInvariant: true } });
  console.log(`# ${backend.describe()}`);
});
after(async () => {
  if (SKIP) return;
  await backend.close();
});

/** `reqs` on a fresh engine of `opts`: all at once, or one after another. */
async function runAll(m: LoadedModel, opts: EngineOptions, reqs: EngineRequest[], together: boolean): Promise<{ runs: Run[]; drafted: number; accepted: number }> {
  const e = new Engine(m.model, m, { maxModelLen: 512, maxBatch: 8, prefixCache: { promptCacheBytes: 0 }, ...opts });
  const runs: Run[] = [];
  if (together) runs.push(...await Promise.all(reqs.map((r) => runOf(e, r))));
  else for (const r of reqs) runs.push(await runOf(e, r));
  await e.close(0);
  assert.equal(e.stats.kvBlocksUsed, 0, 'every KV block returned');
  const drafted = runs.reduce((n, r) => n + (r.speculation?.draftTokens ?? 0), 0);
  const accepted = runs.reduce((n, r) => n + (r.speculation?.acceptedTokens ?? 0), 0);
  return { runs, drafted, accepted };
}

/** Prompts n-gram drafts hit: a text, the text again, then its start (the model tends to go on copying). */
function repetitivePrompts(m: LoadedModel): number[][] {
  const texts = [
    'def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n',
    'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n',
    'import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n        print(os.path.basename(name))\n',
    'for i in range(10):\n    for j in range(10):\n        print(i, j, i * j)\n',
  ];
  return texts.map((t) => {
    const ids = m.encode(t);
    return [...ids, ...ids, ...ids.slice(0, 6)];
  });
}

const requests = (prompts: number[][], sampled: boolean): EngineRequest[] => prompts.map((promptIds, k) => ({
  promptIds, maxTokens: 48, ignoreEos: true, topLogprobs: 2,
  sampling: sampled ? { temperature: 0.8, seed: 100 + k } : { temperature: 0 },
}));

describe('speculative decoding on CUDA (batch-invariant mode)', { skip: SKIP }, () => {
  for (const [name, dir] of [['demo', 'models/demo'], ['llama fixture', 'test/fixtures/llama']] as const) {
    it(`${name}: n-gram drafts give plain decoding's tokens and logprobs, alone and four at once, greedy and sampled`, async (t) => {
      const m = await loadModel(backend, join(ROOT, dir), { maxModelLen: 512 });
      try {
        const prompts = repetitivePrompts(m);
        let drafted = 0, accepted = 0;
        for (const sampled of [false, true]) {
          const reqs = requests(prompts, sampled);
          const plain = await runAll(m, {}, reqs, false);
          assert.equal(plain.drafted, 0);
          for (const [what, spec, together] of [['fixed 4, alone', NGRAM, false], ['fixed 4, together', NGRAM, true], ['adaptive, together', ADAPTIVE, true]] as const) {
            const got = await runAll(m, { speculative: spec }, reqs, together);
            got.runs.forEach((r, k) => sameRun(r, plain.runs[k]!, `${name} ${sampled ? 'sampled' : 'greedy'} ${what} #${k}`));
            drafted += got.drafted;
            accepted += got.accepted;
          }
        }
        t.diagnostic(`${name}: ${accepted} of ${drafted} drafted tokens accepted`);
        assert.ok(drafted > 0 && accepted > 0, 'drafts were verified and some accepted');
        assert.ok(accepted < drafted, 'some drafts were rejected');
      } finally {
        m.model.dispose?.();
      }
    });
  }
});

describe('draft models and EAGLE-3 heads on CUDA (batch-invariant mode)', { skip: SKIP }, () => {
  it('the demo with its draft model and with its EAGLE-3 head: plain decoding\'s tokens and logprobs, greedy and sampled, four at once', async (t) => {
    const demo = await loadModel(backend, join(ROOT, 'models/demo'), { maxModelLen: 512 });
    const draft = await loadModel(backend, join(ROOT, 'models/demo-draft'), { maxModelLen: 512 });
    const head = await Eagle3Head.load(backend, loadEagle3Dir(join(ROOT, 'models/demo-eagle3'), demo.config), demo.model.weights.embed);
    try {
      const prompts = ['def fibonacci(n):', 'class Stack:', 'import os\nimport sys\n', 'def parse_args(argv=None):'].map((x) => demo.encode(x));
      for (const sampled of [false, true]) {
        const reqs = requests(prompts, sampled);
        const plain = await runAll(demo, {}, reqs, false);
        for (const [what, opts] of [
          ['draft model', { speculative: { proposer: 'draft', numDraftTokens: 3 }, draftModel: draft }],
          ['EAGLE-3 head', { speculative: { proposer: 'eagle3', numDraftTokens: 3 }, draftHead: head }],
        ] as const) {
          const got = await runAll(demo, opts as EngineOptions, reqs, true);
          got.runs.forEach((r, k) => sameRun(r, plain.runs[k]!, `${what} ${sampled ? 'sampled' : 'greedy'} #${k}`));
          t.diagnostic(`${what}, ${sampled ? 'sampled' : 'greedy'}: ${got.accepted} of ${got.drafted} drafted tokens accepted`);
          assert.ok(got.drafted > 0 && got.accepted > 0, `${what}: drafts made and accepted`);
        }
      }
    } finally {
      head.dispose();
      draft.model.dispose();
      demo.model.dispose();
    }
  });
});
