// Every family against Hugging Face transformers (fixtures from tools/oracle/make_fixtures.py):
// greedy tokens and top-5 logprobs per step under DESIGN.md's closeness rule, each case alone
// and all cases batched together (the batched oracle: per-row positions are where bugs live).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');
const TOLERANCE = 0.05;

/**
 * Reference steps that record transformers artifacts rather than the model's maths; only the
 * steps before them are compared. Each entry says why.
 */
const KNOWN_REFERENCE_ARTIFACTS: Record<string, Record<number, { steps: number; why: string }>> = {
  llama_dynamic: {
    // transformers' dynamic-NTK rotary keeps max_seq_len_cached across generate() calls: case 2
    // (56-token prompt) was computed with the inv_freq of case 1's final length 80. Measured: our
    // prefill logprob matches the reference to 6e-9 when forced to length 80, and differs by
    // 5e-3 at its true length 56.
    2: { steps: 0, why: 'dynamic-NTK state leaked from the previous case' },
  },
  phi3_longrope: {
    // Case 0 crosses original_max_position_embeddings (16) during decoding at step 11. From there
    // transformers 5.17's Phi3 generate discards its cache on every step, so each new token
    // attends only to itself. Measured: a one-token forward of the previous token reproduces the
    // reference's steps 11-15 (top-3 logprobs to 1e-3). llmts instead re-prefills once with the
    // long factors (what Phi3's cache-invalidation comment intends); the steps before the switch
    // must match exactly.
    0: { steps: 11, why: 'transformers discards the KV cache every step after the LongRoPE switch' },
  },
};

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
      const request = (c: Reference['cases'][number]) => ({
        promptIds: c.prompt_token_ids,
        maxTokens: c.steps.length,
        sampling: { temperature: 0 },
        ignoreEos: true,
        topLogprobs: 5,
      });
      const solo: Awaited<ReturnType<Engine["complete"]>>[] = [];
      for (const c of ref.cases) {
        const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
        solo.push(await e.complete(request(c)));
        await e.close(0);
      }
      let worst = 0;
      ref.cases.forEach((c, k) => {
        const artifact = KNOWN_REFERENCE_ARTIFACTS[name]?.[k];
        if (artifact) t.diagnostic(`case ${k}: comparing ${artifact.steps} steps only (${artifact.why})`);
        const n = artifact ? artifact.steps : c.steps.length;
        const r = compareToReference(solo[k].logprobs!.slice(0, n), c.steps.slice(0, n), TOLERANCE);
        worst = Math.max(worst, r.maxLogprobDiff);
        assert.ok(r.ok, `case ${k}: ${r.problem}`);
      });
      t.diagnostic(`max |Δ logprob| on matched prefix: ${worst.toExponential(2)}`);

      // Batched: all cases at once, small token budget so prefill chunks interleave with decodes.
      const e = new Engine(m.model, m, { maxBatch: ref.cases.length, tokenBudget: 16, maxModelLen: m.maxContext });
      const batched = await Promise.all(ref.cases.map((c) => e.complete(request(c))));
      await e.close(0);
      batched.forEach((b, k) => assert.deepEqual(b.tokenIds, solo[k].tokenIds, `case ${k} batched differs from solo`));
    } finally {
      await backend.close();
    }
  });
}
