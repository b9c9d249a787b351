// The decoder's fused path (packed q/k/v and gate/up weights, residual adds inside the norms,
// norm + rope + KV write in one op) against the transformers fixtures. The CPU backend has no
// fused ops and runs the plain path (fixtures.test.ts); the reference backend has them, so it
// runs this path here, as the CUDA backend does on the GPU machine.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { hasFusedOps } from '../../src/contracts/backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';
import { KNOWN_REFERENCE_ARTIFACTS } from '../helpers/known-artifacts.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');
const TOLERANCE = 0.05;

interface Reference {
  cases: { prompt_token_ids: number[]; steps: StepRecord[] }[];
}

const dirs = existsSync(FIXTURES)
  ? readdirSync(FIXTURES).filter((d) => existsSync(join(FIXTURES, d, 'reference.json'))).sort()
  : [];

test('the reference backend has every fused op', () => {
  assert.ok(hasFusedOps(new ReferenceBackend()));
});

for (const name of dirs) {
  test(`${name}: fused path matches transformers alone and batched`, async (t) => {
    const dir = join(FIXTURES, name);
    const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as Reference;
    const backend = new ReferenceBackend();
    const m = await loadModel(backend, dir, { maxModelLen: 4096 });
    const l0 = m.model.weights.layers[0];
    t.diagnostic(`packed q/k/v: ${l0.attn.qkv !== undefined}, packed gate/up: ${l0.mlp.kind === 'dense' && l0.mlp.gateUp !== undefined}`);
    if (m.config.qkNorm !== 'full') assert.ok(l0.attn.qkv, 'q/k/v should load packed');
    const request = (c: Reference['cases'][number]) => ({
      promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 5,
    });
    const solo: Awaited<ReturnType<Engine["complete"]>>[] = [];
    for (const c of ref.cases) {
      const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
      solo.push(await e.complete(request(c)));
      await e.close(0);
    }
    ref.cases.forEach((c, k) => {
      const artifact = KNOWN_REFERENCE_ARTIFACTS[name]?.[k];
      const n = artifact ? artifact.steps : c.steps.length;
      const r = compareToReference(solo[k].logprobs!.slice(0, n), c.steps.slice(0, n), TOLERANCE);
      assert.ok(r.ok, `case ${k}: ${r.problem}`);
    });
    const e = new Engine(m.model, m, { maxBatch: ref.cases.length, tokenBudget: 16, maxModelLen: m.maxContext });
    const batched = await Promise.all(ref.cases.map((c) => e.complete(request(c))));
    await e.close(0);
    batched.forEach((b, k) => assert.deepEqual(b.tokenIds, solo[k].tokenIds, `case ${k} batched differs from solo`));
  });
}
