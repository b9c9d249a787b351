// The weight prefetch hint's budget split (l2-prefetch.ts l2PrefetchPrefixes), which needs no GPU;
// the hint itself on a GPU is in cuda-ops.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { l2PrefetchPrefixes } from '../../src/backends/cuda/l2-prefetch.ts';

describe('l2PrefetchPrefixes', () => {
  it('takes the weights in order, whole while the budget lasts, the last one cut to 16 bytes, none after', () => {
    const MB = 1024 * 1024;
    // the 8B's o (33.5 MB) and gate/up (235 MB) within 48 MiB: all of o, then gate/up's first 14.5 MB
    const o = 4096 * 4096 * 2, gateUp = 2 * 14336 * 4096 * 2;
    assert.deepEqual(l2PrefetchPrefixes([o, gateUp], 48 * MB), [o, 48 * MB - o]);
    assert.deepEqual(l2PrefetchPrefixes([o, gateUp], 16 * MB), [16 * MB, 0]);
    assert.deepEqual(l2PrefetchPrefixes([100, 64], 1000), [96, 64], 'a size cut to whole 16-byte pieces');
    assert.deepEqual(l2PrefetchPrefixes([64, 64], 70), [64, 0], 'a budget left of less than 16 bytes takes nothing');
    assert.deepEqual(l2PrefetchPrefixes([64, 64], 0), [0, 0]);
    assert.deepEqual(l2PrefetchPrefixes([64], -5), [0]);
    assert.deepEqual(l2PrefetchPrefixes([], 100), []);
  });
});
