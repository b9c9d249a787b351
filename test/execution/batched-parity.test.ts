// The batched oracle at scale: 18 requests join a running batch at staggered moments (each new
// one when an earlier one has produced some tokens), leave at different lengths, queue when the
// batch is full, and share steps with other rows' prefill chunks. Each must produce exactly the
// greedy tokens transformers produced for it alone (the fixture reference).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');

// a plain family, a sliding-window family with soft-caps, a MoE, and fused projections
for (const name of ['llama', 'gemma2', 'qwen3_moe', 'phi3']) {
  test(`${name}: 18 staggered requests in a running batch match transformers`, async () => {
    const ref = JSON.parse(readFileSync(join(FIXTURES, name, 'reference.json'), 'utf8'));
    const backend = await createCpuBackend();
    try {
      const m = await loadModel(backend, join(FIXTURES, name), { maxModelLen: 4096 });
      const engine = new Engine(m.model, m, { maxBatch: 8, tokenBudget: 24, maxModelLen: m.maxContext });
      const jobs: Promise<void>[] = [];
      let produced = 0; // tokens produced so far by all requests: the clock joins are timed on
      let peakRunning = 0, peakWaiting = 0;
      for (let k = 0; k < 18; k++) {
        const c = ref.cases[k % ref.cases.length];
        const length = 8 + ((k * 7) % 25); // leave at different times
        const expected = c.generated_token_ids.slice(0, length);
        const got: number[] = [];
        jobs.push((async () => {
          for await (const e of engine.generate({ promptIds: c.prompt_token_ids, maxTokens: length, sampling: { temperature: 0 }, ignoreEos: true })) {
            if (e.type === 'token') {
              got.push(e.tokenId);
              produced++;
              peakRunning = Math.max(peakRunning, engine.stats.running);
              peakWaiting = Math.max(peakWaiting, engine.stats.waiting);
            }
          }
          assert.deepEqual(got, expected, `request ${k} (case ${k % ref.cases.length}, ${length} tokens)`);
        })());
        // the next request joins once the batch has made progress
        const target = produced + 3;
        while (produced < target && engine.stats.running + engine.stats.waiting > 0) await new Promise((r) => setTimeout(r, 1));
      }
      await Promise.all(jobs);
      assert.ok(peakRunning >= 6, `requests overlapped (peak running ${peakRunning})`);
      assert.ok(peakWaiting >= 1, `the batch filled and requests queued (peak waiting ${peakWaiting})`);
      assert.equal(engine.stats.kvBlocksUsed, 0);
      assert.equal(engine.stats.running + engine.stats.waiting, 0);
      await engine.close(0);
    } finally {
      await backend.close();
    }
  });
}
