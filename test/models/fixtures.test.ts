// Every family against Hugging Face transformers (fixtures from tools/oracle/make_fixtures.py):
// greedy tokens and top-5 logprobs per step under the closeness rule (ARCHITECTURE.md), each case
// alone and all cases batched together (the batched oracle: per-row positions are where bugs live).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';
import { checkReferenceCases } from '../helpers/reference-cases.ts';
import { KNOWN_REFERENCE_ARTIFACTS } from '../helpers/known-artifacts.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');
const TOLERANCE = 0.05;


interface Reference {
  name: string;
  cases: { prompt_token_ids: number[]; generated_token_ids: number[]; steps: StepRecord[] }[];
}

const dirs = existsSync(FIXTURES)
  ? readdirSync(FIXTURES).filter((d) => existsSync(join(FIXTURES, d, 'reference.json'))).sort()
  : [];

test('fixtures exist', () => {
  assert.ok(dirs.length >= 12, `expected a fixture per family in ${FIXTURES}, found ${dirs.length}`);
});

for (const name of dirs) {
  test(`${name}: matches transformers alone and batched`, async (t) => {
    const dir = join(FIXTURES, name);
    const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as Reference;
    const backend = await createCpuBackend();
    try {
      // fixtures may run past max_position_embeddings (dynamic NTK exists for that): as transformers does
      const m = await loadModel(backend, dir, { maxModelLen: 4096 });
      ref.cases.forEach((_, k) => {
        const artifact = KNOWN_REFERENCE_ARTIFACTS[name]?.[k];
        if (artifact) t.diagnostic(`case ${k}: comparing ${artifact.steps} steps only (${artifact.why})`);
      });
      const worst = await checkReferenceCases(m, ref.cases, TOLERANCE, (k) => KNOWN_REFERENCE_ARTIFACTS[name]?.[k]?.steps);
      t.diagnostic(`max |Δ logprob| on matched prefix: ${worst.toExponential(2)}`);
    } finally {
      await backend.close();
    }
  });
}

// Lossy KV caches (the CPU backend's --kv-dtype bf16, int8, fp8): keys and values rounded as they
// are written (native/kv.c), everything else f32; every family within the closeness rule, each case
// alone, at a tolerance per dtype: bf16 the rule's own, int8 (per-row scales, steps of 1/127 of a
// row's largest magnitude) and fp8 e4m3 (3 mantissa bits: steps of up to 1/16 of a value) wider.
const KV_TOLERANCE = { bf16: TOLERANCE, int8: 0.1, fp8: 0.4 } as const;
for (const [kvDtype, tolerance] of Object.entries(KV_TOLERANCE) as [keyof typeof KV_TOLERANCE, number][]) {
  test(`every family with a ${kvDtype} KV cache matches transformers (tolerance ${tolerance})`, async (t) => {
    const backend = await createCpuBackend();
    try {
      for (const name of dirs) {
        const dir = join(FIXTURES, name);
        const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as Reference;
        const m = await loadModel(backend, dir, { maxModelLen: 4096 });
        let worst = 0;
        for (const [k, c] of ref.cases.entries()) {
          const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext, kvDtype });
          const out = await e.complete({ promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 },
            ignoreEos: true, topLogprobs: 5 });
          await e.close(0);
          const artifact = KNOWN_REFERENCE_ARTIFACTS[name]?.[k];
          const n = artifact ? artifact.steps : c.steps.length;
          const r = compareToReference(out.logprobs!.slice(0, n), c.steps.slice(0, n), tolerance);
          worst = Math.max(worst, r.maxLogprobDiff);
          assert.ok(r.ok, `${name} case ${k}: ${r.problem}`);
        }
        t.diagnostic(`${name}: max |Δ logprob| ${worst.toExponential(2)}`);
      }
    } finally {
      await backend.close();
    }
  });
}
