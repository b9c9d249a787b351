// The demo's draft model (models/demo-draft, tools/demo/train_draft.py) is an ordinary model: it
// loads like any other and matches transformers (its sample_reference.json) under the closeness
// rule; and it loads beside the demo on one backend, each model's steps unchanged by the other's.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const TOLERANCE = 0.05;

interface Sample {
  prompt_token_ids: number[];
  generated_token_ids: number[];
  steps: StepRecord[];
}

const sample = (dir: string) => JSON.parse(readFileSync(join(ROOT, dir, 'sample_reference.json'), 'utf8')) as Sample;

function greedy(m: LoadedModel, s: Sample) {
  const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
  return { e, out: e.complete({ promptIds: s.prompt_token_ids, maxTokens: s.steps.length, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 5 }) };
}

test('the draft model and the demo, loaded on one backend, each match transformers, run apart and side by side', async (t) => {
  const backend = await createCpuBackend();
  try {
    const demo = await loadModel(backend, join(ROOT, 'models/demo'), { onProgress: () => {} });
    const draft = await loadModel(backend, join(ROOT, 'models/demo-draft'), { onProgress: () => {} });
    assert.equal(draft.config.vocabSize, demo.config.vocabSize);
    assert.deepEqual(draft.encode('def fibonacci(n):'), demo.encode('def fibonacci(n):'), 'one tokenizer');
    assert.ok(draft.config.numLayers < demo.config.numLayers && draft.config.hiddenSize < demo.config.hiddenSize);
    const refs = { demo: sample('models/demo'), draft: sample('models/demo-draft') };
    const apart: Record<string, number[]> = {};
    for (const [name, m] of [['demo', demo], ['draft', draft]] as const) {
      const { e, out } = greedy(m, refs[name]);
      const res = await out;
      apart[name] = res.tokenIds;
      const r = compareToReference(res.logprobs!, refs[name].steps, TOLERANCE);
      await e.close(0);
      assert.ok(r.ok, `${name}: ${r.problem}`);
      t.diagnostic(`${name}: max |Δ logprob| ${r.maxLogprobDiff.toExponential(2)} over ${r.matched} steps`);
    }
    // both engines stepping at once on the shared backend: the same tokens as apart
    const a = greedy(demo, refs.demo), b = greedy(draft, refs.draft);
    const [da, db] = await Promise.all([a.out, b.out]);
    await Promise.all([a.e.close(0), b.e.close(0)]);
    assert.deepEqual(da.tokenIds, apart.demo, 'demo side by side');
    assert.deepEqual(db.tokenIds, apart.draft, 'draft side by side');
  } finally {
    await backend.close();
  }
});
