// Warm-up before serving (execution/warmup.ts): one batch per graph bucket, through the engine. On a backend that captures graphs every bucket is captured by it, so
// the requests that follow only replay; nothing is left behind (KV blocks, prefix cache, rows).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { warmUp } from '../../src/execution/warmup.ts';
import { bucketFor, bucketRowCounts } from '../../src/models/decode-graphs.ts';
import { ReplayingReference } from '../helpers/replaying-reference.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

test('bucketRowCounts: one row count per bucket a batch of at most N rows can use', () => {
  assert.deepEqual(bucketRowCounts(1), [1]);
  assert.deepEqual(bucketRowCounts(5), [1, 2, 3, 4, 5]);
  assert.deepEqual(bucketRowCounts(8), [1, 2, 3, 4, 5, 6, 7, 8]);
  assert.deepEqual(bucketRowCounts(9), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual(bucketRowCounts(16), [1, 2, 3, 4, 5, 6, 7, 8, 16]);
  assert.deepEqual(bucketRowCounts(20), [1, 2, 3, 4, 5, 6, 7, 8, 16, 20]);
  assert.deepEqual(bucketRowCounts(64), [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 48, 64]);
  // every bucket any row count up to N falls in is covered, and only those
  for (const n of [1, 7, 9, 17, 33, 100, 256]) {
    const want = new Set(Array.from({ length: n }, (_, r) => bucketFor(r + 1)));
    assert.deepEqual(new Set(bucketRowCounts(n).map(bucketFor)), want, `N = ${n}`);
  }
});

test('warm-up captures every bucket once; later batches only replay; nothing is left behind', async () => {
  const backend = new ReplayingReference();
  const m = await loadModel(backend, writeTinyLlama());
  const e = new Engine(m.model, m, { maxBatch: 12, tokenBudget: 24, maxModelLen: m.maxContext });
  const progress: number[] = [];
  const w = await warmUp(e, (done) => progress.push(done));
  assert.deepEqual(w.rowCounts, [1, 2, 3, 4, 5, 6, 7, 8, 12]);
  assert.deepEqual(progress, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.equal(backend.captures, w.rowCounts.length, 'one capture per bucket');
  assert.equal(e.stats.running, 0);
  assert.equal(e.stats.kvBlocksUsed, 0);
  assert.equal(e.stats.kvBlocksCached, 0, 'nothing for the prefix cache');
  const captured = backend.captures, replays = backend.replays;
  const done = await Promise.all([3, 11, 6].map((k) => e.complete({
    promptIds: [k, k + 1, k + 2], maxTokens: 6, sampling: { temperature: 0 }, ignoreEos: true,
  })));
  assert.ok(done.every((c) => c.completionTokens === 6));
  assert.equal(backend.captures, captured, 'no capture after the warm-up');
  assert.ok(backend.replays > replays);
  await e.close(0);
});
