// The fixture tests' common check: a loaded model's greedy steps against a reference's cases,
// each case alone under the closeness rule, then all of them batched (a small token budget, so
// prefill chunks interleave with decodes) giving the same tokens as alone.

import assert from 'node:assert/strict';

import { Engine } from '../../src/execution/engine.ts';
import type { LoadedModel } from '../../src/execution/load-model.ts';
import { compareToReference, type StepRecord } from './closeness.ts';

export interface ReferenceCase { prompt_token_ids: number[]; steps: StepRecord[] }

/**
 * Runs every case alone and batched; asserts closeness within `tolerance` on each case's first
 * `stepsOf(k)` steps (default all) and batched tokens equal to solo (`batched` 'equal', the
 * default), or batched runs as close to the reference as solo ones must be ('close': a backend
 * whose kernels depend on the rows a step holds). Returns the largest |Δ logprob|.
 */
export async function checkReferenceCases(m: LoadedModel, cases: readonly ReferenceCase[], tolerance: number,
  stepsOf: (k: number) => number | undefined = () => undefined, batched: 'equal' | 'close' = 'equal'): Promise<number> {
  const request = (c: ReferenceCase) => ({
    promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 5,
  });
  const solo: Awaited<ReturnType<Engine['complete']>>[] = [];
  for (const c of cases) {
    const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
    solo.push(await e.complete(request(c)));
    await e.close(0);
  }
  let worst = 0;
  cases.forEach((c, k) => {
    const n = stepsOf(k) ?? c.steps.length;
    const r = compareToReference(solo[k]!.logprobs!.slice(0, n), c.steps.slice(0, n), tolerance);
    worst = Math.max(worst, r.maxLogprobDiff);
    assert.ok(r.ok, `case ${k}: ${r.problem}`);
  });
  const e = new Engine(m.model, m, { maxBatch: cases.length, tokenBudget: 16, maxModelLen: m.maxContext });
  const together = await Promise.all(cases.map((c) => e.complete(request(c))));
  await e.close(0);
  together.forEach((b, k) => {
    if (batched === 'equal') {
      assert.deepEqual(b.tokenIds, solo[k]!.tokenIds, `case ${k} batched differs from solo`);
      return;
    }
    const n = stepsOf(k) ?? cases[k]!.steps.length;
    const r = compareToReference(b.logprobs!.slice(0, n), cases[k]!.steps.slice(0, n), tolerance);
    worst = Math.max(worst, r.maxLogprobDiff);
    assert.ok(r.ok, `case ${k} batched: ${r.problem}`);
  });
  return worst;
}
