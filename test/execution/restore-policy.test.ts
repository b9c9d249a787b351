// Restore a prefix from the SSD tier or compute it again (execution/restore-policy.ts): the
// decision from measured rates, and an engine that skips a slow restore and still gives the
// same tokens.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RestorePolicy, PREFILL_RATE_MIN_TOKENS } from '../../src/execution/restore-policy.ts';
import { Engine } from '../../src/execution/engine.ts';
import type { LoadedModel } from '../../src/execution/load-model.ts';
import { modelFingerprint } from '../../src/state/fingerprint.ts';
import { coldOutputs, greedy, tinyModel, tokens } from '../state/helpers.ts';

test('restores until both rates are known, then only when the read is predicted faster', () => {
  const p = new RestorePolicy();
  assert.ok(p.shouldRestore(1000, 1e9), 'no rates yet: restore (it measures the disk)');
  p.recordStep(PREFILL_RATE_MIN_TOKENS - 1, 1); // a decode-sized step says nothing about prefill
  assert.equal(p.prefillTokensPerMs, undefined);
  p.recordStep(1000, 10); // 100 tokens/ms
  assert.ok(p.shouldRestore(1000, 1e9), 'no restore timed yet');
  p.recordRestore(1e6, 10); // 1e5 bytes/ms
  // 1,000 tokens: computing takes 10 ms; reading 1e6 bytes 10 ms, 5e5 bytes 5 ms
  assert.ok(p.shouldRestore(1000, 5e5));
  assert.ok(!p.shouldRestore(1000, 2e6));
  assert.equal(p.skipped, 1);
  // rates follow new measurements (a slower disk)
  for (let i = 0; i < 20; i++) p.recordRestore(1e6, 100);
  assert.ok(Math.abs(p.restoreBytesPerMs! - 1e4) < 1e3);
  assert.ok(!p.shouldRestore(1000, 5e5));
});

function ssdEngine(m: LoadedModel, dir: string): Engine {
  return new Engine(m.model, m, {
    maxBatch: 2,
    prefixCache: { modelFingerprint: modelFingerprint(m.dir), tokenizerFingerprint: m.tokenizer.fingerprint, ssd: { dir, maxBytes: 64 << 20 } },
  });
}

test('an engine whose prefill beats its disk computes the prefix instead of restoring it, same tokens', async () => {
  const m = await tinyModel();
  const dir = mkdtempSync(join(tmpdir(), 'llmts-policy-'));
  try {
    const A = tokens(21, 70);
    const [cold] = await coldOutputs(m, [A], 8);
    const e1 = ssdEngine(m, dir);
    await e1.complete(greedy(A, 8));
    await e1.flushPrefixCache();
    await e1.close();

    const e2 = ssdEngine(m, dir); // a restart: the prefix is on disk only
    e2.restorePolicy.recordStep(10_000, 1); // prefill at 10k tokens/ms
    e2.restorePolicy.recordRestore(1, 1000); // the disk at 1 byte/ms
    const a = await e2.complete(greedy(A, 8));
    assert.deepEqual(a.tokenIds, cold);
    assert.equal(a.cachedTokens, 0);
    const s = e2.stats.prefixCache;
    assert.equal(s.ssdRestoresSkipped, 1);
    assert.equal(s.ssd!.restores, 0);
    await e2.close();

    const e3 = ssdEngine(m, dir); // rates unknown again: it restores
    const b = await e3.complete(greedy(A, 8));
    assert.deepEqual(b.tokenIds, cold);
    assert.equal(b.cachedTokens, 64);
    assert.ok(e3.restorePolicy.restoreBytesPerMs! > 0, 'the restore was timed');
    await e3.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
