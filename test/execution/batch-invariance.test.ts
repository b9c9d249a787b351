// Batch invariance on the CPU backend: a request's tokens and logprobs do not depend on the other
// rows in its steps. B requests run at once, for B in 1..32, identical and mixed prompts, greedy
// and seeded sampling; each must equal its solo run bit for bit (logprobs compared with
// Object.is, not a tolerance). What breaks it: a kernel chosen by how many rows share a step (the
// matmul's decode and prefill paths, the bf16 dot products), a reduction order that depends on the
// row count, or a prompt's own prefill computed differently when the token budget splits it into
// other chunks (attention over cached keys vs the chunk's own).

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import type { Backend } from '../../src/contracts/backend.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const OUTPUT_TOKENS = 6;

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
    for (let j = 0; j < want.top[i].length; j++)
      assert.ok(Object.is(got.top[i][j], want.top[i][j]), `${what}: token ${i} top ${j} logprob ${got.top[i][j]} vs alone ${want.top[i][j]}`);
  }
}

// Prompts of different lengths (1 to ~90 tokens) made of the vocabulary's ids, deterministic.
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

function request(promptIds: number[], k: number, seeded: boolean): EngineRequest {
  return {
    promptIds, maxTokens: OUTPUT_TOKENS, ignoreEos: true, topLogprobs: 2,
    sampling: seeded ? { temperature: 0.9, seed: 1000 + k } : { temperature: 0 },
  };
}

for (const { name, dir } of [
  { name: 'demo (bf16 weights)', dir: join(ROOT, 'models/demo') },
  { name: 'llama fixture (f32 weights)', dir: join(ROOT, 'test/fixtures/llama') },
  { name: 'qwen3_moe fixture (experts)', dir: join(ROOT, 'test/fixtures/qwen3_moe') },
  { name: 'gemma2 fixture (sliding windows, soft-caps)', dir: join(ROOT, 'test/fixtures/gemma2') },
]) {
  describe(`batch invariance: ${name}`, () => {
    let backend: Backend;
    let m: LoadedModel;
    const opts: EngineOptions = { maxBatch: 32, tokenBudget: 256, maxModelLen: 512 };
    before(async () => {
      backend = await createCpuBackend();
      m = await loadModel(backend, dir, { maxModelLen: 512 });
    });
    after(async () => {
      await backend?.close();
    });

    async function alone(reqs: EngineRequest[]): Promise<Run[]> {
      const out: Run[] = [];
      for (const r of reqs) {
        const engine = new Engine(m.model, m, { ...opts, prefixCache: { promptCacheBytes: 0 } });
        out.push(await runOne(engine, r));
        await engine.close(0);
      }
      return out;
    }

    async function together(reqs: EngineRequest[], engineOpts: EngineOptions = opts): Promise<Run[]> {
      const engine = new Engine(m.model, m, engineOpts);
      try {
        return await Promise.all(reqs.map((r) => runOne(engine, r)));
      } finally {
        await engine.close(0);
      }
    }

    it('B identical greedy requests, B = 1..32, equal the request alone', async () => {
      const [p] = prompts(m.config.vocabSize, 8).slice(7);
      const [solo] = await alone([request(p, 0, false)]);
      for (let b = 1; b <= 32; b++) {
        const runs = await together(Array.from({ length: b }, () => request(p, 0, false)));
        runs.forEach((r, i) => sameBits(r, solo, `B=${b} copy ${i}`));
      }
    });

    it('mixed prompts, greedy and seeded, at B = 2..32, each equal its solo run', async () => {
      const ps = prompts(m.config.vocabSize, 32);
      const reqs = ps.map((p, k) => request(p, k, k % 2 === 1));
      const solo = await alone(reqs);
      for (const b of [2, 3, 5, 8, 13, 17, 24, 32]) {
        const runs = await together(reqs.slice(0, b));
        runs.forEach((r, i) => sameBits(r, solo[i], `B=${b} request ${i} (${reqs[i].promptIds.length}-token prompt)`));
      }
    });

    it('a prompt split into other chunks by a small token budget, and one served from the prefix cache, equal it whole', async () => {
      const ps = prompts(m.config.vocabSize, 32).filter((p) => p.length > 40).slice(0, 6);
      const reqs = ps.map((p, k) => request(p, k, false));
      const solo = await alone(reqs);
      const small = await together(reqs, { ...opts, tokenBudget: 23 });
      small.forEach((r, i) => sameBits(r, solo[i], `token budget 23, request ${i}`));
      // the same prompts again on one engine: the second round's prompts come from the prefix cache
      const engine = new Engine(m.model, m, opts);
      try {
        await Promise.all(reqs.map((r) => runOne(engine, r)));
        const again = await Promise.all(reqs.map((r) => runOne(engine, r)));
        assert.ok(again.every((r) => r.cachedTokens > 0), `every second-round prompt was served from the prefix cache: ${again.map((r) => r.cachedTokens)}`);
        again.forEach((r, i) => sameBits(r, solo[i], `prefix-cached, request ${i}`));
      } finally {
        await engine.close(0);
      }
    });
  });
}
