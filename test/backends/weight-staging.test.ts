// forEachPiece (backends/cuda/weight-staging.ts): how a weight's bytes are split over the pinned
// chunks that read and upload them concurrently. It needs no GPU, so it runs everywhere.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { forEachPiece } from '../../src/backends/cuda/weight-staging.ts';

const tick = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

test('forEachPiece covers [0, total) exactly once, in pieces of at most the size, with at most `lanes` running', async () => {
  for (const [total, piece, lanes] of [[0, 16, 4], [1, 16, 4], [16, 16, 4], [17, 16, 4], [100, 7, 3], [64, 16, 8], [50, 10, 1]]) {
    const seen: [number, number][] = [];
    let running = 0, most = 0;
    await forEachPiece(total, piece, lanes, async (off, n) => {
      running++;
      most = Math.max(most, running);
      seen.push([off, n]);
      await tick((off * 7) % 3); // pieces finish out of order
      running--;
    });
    seen.sort((a, b) => a[0] - b[0]);
    let at = 0;
    for (const [off, n] of seen) {
      assert.equal(off, at, `total ${total}: a gap or an overlap at ${at}`);
      assert.ok(n > 0 && n <= piece);
      at += n;
    }
    assert.equal(at, total);
    assert.ok(most <= lanes, `total ${total}: ${most} pieces ran at once, lanes ${lanes}`);
    if (total >= 2 * piece * lanes) assert.equal(most, lanes, 'the lanes are used');
  }
});

test('forEachPiece: a failed piece stops new ones, and it rejects only after the running ones have settled', async () => {
  const started: number[] = [];
  let settled = 0;
  const run = forEachPiece(100, 10, 3, async (off) => {
    started.push(off);
    if (off === 10) {
      await tick(1);
      throw new Error('read failed at 10');
    }
    await tick(20);
    settled++;
  });
  await assert.rejects(run, /read failed at 10/);
  // pieces 0 and 20 were running when 10 failed: both finished before the rejection
  assert.equal(settled, started.length - 1);
  assert.ok(started.length <= 4, `no piece starts after the failure (started ${started.join(', ')})`);
  await assert.rejects(forEachPiece(10, 0, 1, async () => {}), /must be positive/);
});
