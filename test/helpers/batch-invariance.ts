// The end-to-end batch-invariance cases every backend runs (test/execution/batch-invariance.test.ts
// on the CPU, test/backends/cuda-batch-invariant.test.ts on CUDA): B requests at once, B = 1..32,
// identical and mixed prompts, greedy and seeded sampling, a prompt split by a small token budget
// and one served from the prefix cache; each must equal its solo run bit for bit (logprobs
// compared with Object.is, not a tolerance).
import assert from 'node:assert/strict';
import { it } from 'node:test';

import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import type { LoadedModel } from '../../src/execution/load-model.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';

interface Run { tokens: number[]; logprobs: number[]; top: number[][]; cachedTokens: number }

async function runOne(engine: Engine, req: EngineRequest): Promise<Run> {
  const run: Run = { tokens: [], logprobs: [], top: [], cachedTokens: 0 };
  for await (const e of engine.generate(req)) {
    if (e.type === 'token') {
      run.tokens.push(e.tokenId);
      run.logprobs.push(e.logprobs!.logprob);
      run.top.push(e.logprobs!.top.map((t) => t.logprob));
    } else {
      if (e.finishReason === 'error') throw new Error(e.error);
      run.cachedTokens = e.cachedTokens;
    }
  }
  return run;
}

function sameBits(got: Run, want: Run, what: string): void {
  assert.deepEqual(got.tokens, want.tokens, `${what}: tokens`);
  for (let i = 0; i < want.logprobs.length; i++) {
    assert.ok(Object.is(got.logprobs[i], want.logprobs[i]), `${what}: token ${i} logprob ${got.logprobs[i]} vs alone ${want.logprobs[i]}`);
    for (let j = 0; j < want.top[i]!.length; j++)
      assert.ok(Object.is(got.top[i]![j], want.top[i]![j]), `${what}: token ${i} top ${j} logprob ${got.top[i]![j]} vs alone ${want.top[i]![j]}`);
  }
}

/** Prompts of 1 to ~90 tokens of the vocabulary's ids, deterministic. */
function prompts(vocab: number, count: number): number[][] {
  const out: number[][] = [];
  let s = 12345;
  const next = () => (s = (s * 1103515245 + 12345) % 2147483648);
  for (let k = 0; k < count; k++) {
    const len = 1 + ((k * 37) % 90);
    out.push(Array.from({ length: len }, () => 3 + (next() % (vocab - 3))));
  }
  return out;
}

/**
 * Registers the cases (inside the caller's describe) for the model `model()` returns once its
 * `before` has loaded it; each request decodes `outputTokens` tokens.
 */
export function batchInvarianceCases(model: () => LoadedModel, outputTokens: number): void {
  const opts: EngineOptions = { maxBatch: 32, tokenBudget: 256, maxModelLen: 512 };
  const request = (promptIds: number[], k: number, seeded: boolean): EngineRequest => ({
    promptIds, maxTokens: outputTokens, ignoreEos: true, topLogprobs: 2,
    sampling: seeded ? { temperature: 0.9, seed: 1000 + k } : { temperature: 0 },
  });

  async function alone(reqs: EngineRequest[]): Promise<Run[]> {
    const m = model();
    const out: Run[] = [];
    for (const r of reqs) {
      const engine = new Engine(m.model, m, { ...opts, prefixCache: { promptCacheBytes: 0 } });
      out.push(await runOne(engine, r));
      await engine.close(0);
    }
    return out;
  }

  async function together(reqs: EngineRequest[], engineOpts: EngineOptions = opts): Promise<Run[]> {
    const m = model();
    const engine = new Engine(m.model, m, engineOpts);
    try {
      return await Promise.all(reqs.map((r) => runOne(engine, r)));
    } finally {
      await engine.close(0);
    }
  }

  it('B identical greedy requests, B = 1..32, equal the request alone', async () => {
    const [p] = prompts(model().config.vocabSize, 8).slice(7);
    const [solo] = await alone([request(p!, 0, false)]);
    for (let b = 1; b <= 32; b++) {
      const runs = await together(Array.from({ length: b }, () => request(p!, 0, false)));
      runs.forEach((r, i) => sameBits(r, solo!, `B=${b} copy ${i}`));
    }
  });

  it('mixed prompts, greedy and seeded, at B = 2..32, each equal its solo run', async () => {
    const ps = prompts(model().config.vocabSize, 32);
    const reqs = ps.map((p, k) => request(p, k, k % 2 === 1));
    const solo = await alone(reqs);
    for (const b of [2, 3, 5, 8, 13, 17, 24, 32]) {
      const runs = await together(reqs.slice(0, b));
      runs.forEach((r, i) => sameBits(r, solo[i]!, `B=${b} request ${i} (${reqs[i]!.promptIds.length}-token prompt)`));
    }
  });

  it('a prompt split into other chunks by a small token budget, and one served from the prefix cache, equal it whole', async () => {
    const m = model();
    const ps = prompts(m.config.vocabSize, 32).filter((p) => p.length > 40).slice(0, 6);
    const reqs = ps.map((p, k) => request(p, k, false));
    const solo = await alone(reqs);
    const small = await together(reqs, { ...opts, tokenBudget: 23 });
    small.forEach((r, i) => sameBits(r, solo[i]!, `token budget 23, request ${i}`));
    // the same prompts again on one engine: the second round's prompts come from the prefix cache
    const engine = new Engine(m.model, m, opts);
    try {
      await Promise.all(reqs.map((r) => runOne(engine, r)));
      const again = await Promise.all(reqs.map((r) => runOne(engine, r)));
      assert.ok(again.every((r) => r.cachedTokens > 0), `every second-round prompt was served from the prefix cache: ${again.map((r) => r.cachedTokens)}`);
      again.forEach((r, i) => sameBits(r, solo[i]!, `prefix-cached, request ${i}`));
    } finally {
      await engine.close(0);
    }
  });
}
