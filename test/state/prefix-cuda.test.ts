// The prefix cache on the CUDA backend (bf16 KV): fixtures served from the RAM tier and restored
// from the SSD tier (readBlocks/writeBlocks on the device; sliding-window families included) stay
// close to transformers under the closeness rule (ARCHITECTURE.md) with the bf16 tolerance of
// test/backends/cuda-fixtures.test.ts. Skipped with the reason where CUDA is not usable (CI).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';

import { type CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { modelFingerprint } from '../../src/state/fingerprint.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
const FIXTURES = resolve(import.meta.dirname, '../fixtures');
const BF16_TOLERANCE = 0.1;

interface Reference {
  cases: { prompt_token_ids: number[]; steps: StepRecord[] }[];
}

let backend: CudaBackend;
before(async () => {
  if (!SKIP) backend = await createCudaBackend();
});
after(async () => {
  if (!SKIP) await backend.close();
});

const request = (c: Reference['cases'][number]) => ({
  promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 5,
});
const engine = (m: LoadedModel, opts: EngineOptions) => new Engine(m.model, m, { maxBatch: 3, blockSize: 4, maxModelLen: m.maxContext, ...opts });

for (const name of ['llama', 'qwen3', 'qwen3_moe', 'gemma2', 'gemma3_text']) {
  test(`${name}: RAM and SSD tiers on CUDA stay close to transformers`, { skip: SKIP }, async (t) => {
    const dir = join(FIXTURES, name);
    const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as Reference;
    const cacheDir = mkdtempSync(join(tmpdir(), 'llmts-cuda-kvc-'));
    try {
      const m = await loadModel(backend, dir, { maxModelLen: 4096 });
      const prefixCache = { modelFingerprint: modelFingerprint(dir), tokenizerFingerprint: m.tokenizer.fingerprint, ssd: { dir: cacheDir, maxBytes: 1 << 30 } };
      const check = (label: string, steps: StepRecord[] | undefined, c: Reference['cases'][number]) => {
        const r = compareToReference(steps!, c.steps, BF16_TOLERANCE);
        assert.ok(r.ok, `${label}: ${r.problem}`);
        return r.maxLogprobDiff;
      };
      const e = engine(m, { prefixCache });
      assert.ok(e.stats.prefixCache.ssd, `no SSD tier: ${e.stats.prefixCache.ssdOff}`); // sliding-window models too
      let worst = 0, same = 0;
      for (const [k, c] of ref.cases.entries()) {
        const cold = await e.complete(request(c));
        const warm = await e.complete(request(c));
        assert.equal(warm.cachedTokens, Math.floor((c.prompt_token_ids.length - 1) / 4) * 4, `case ${k}`);
        worst = Math.max(worst, check(`case ${k} cold`, cold.logprobs, c), check(`case ${k} warm`, warm.logprobs, c));
        if (JSON.stringify(cold.tokenIds) === JSON.stringify(warm.tokenIds)) same++;
      }
      assert.equal(e.stats.kvBlocksUsed, 0);
      await e.close();
      {
        const e2 = engine(m, { prefixCache });
        const restored = await Promise.all(ref.cases.map((c) => e2.complete(request(c))));
        restored.forEach((r, k) => {
          assert.ok(r.cachedTokens > 0, `case ${k} restored nothing`);
          worst = Math.max(worst, check(`case ${k} restored`, r.logprobs, ref.cases[k]));
        });
        assert.ok(e2.stats.prefixCache.ssdHits >= 1);
        await e2.close();
      }
      t.diagnostic(`${name}: max |Δ logprob| ${worst.toExponential(2)}; warm == cold tokens in ${same}/${ref.cases.length} cases`);
    } finally {
      rmSync(cacheDir, { recursive: true, force: true });
    }
  });
}
