import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { KvCache, blocksPerSequence, kvGroupsOf } from '../../src/state/kv-cache.ts';
import { BlockPool } from '../../src/state/block-pool.ts';

const shape = { numKvHeads: 1, headDim: 2, blockSize: 4 };

test('kvGroupsOf groups layers by window', () => {
  assert.deepEqual(kvGroupsOf([0, 8, 0, 8, 16]), [
    { window: 0, layers: [0, 2] },
    { window: 8, layers: [1, 3] },
    { window: 16, layers: [4] },
  ]);
});

test('block pool allocates, refuses when exhausted, and takes blocks back', () => {
  const pool = new BlockPool(3);
  const a = pool.allocate(2);
  assert.equal(new Set(a).size, 2);
  assert.equal(pool.canAllocate(2), false);
  assert.throws(() => pool.allocate(2), /exhausted/);
  pool.release(a);
  assert.equal(pool.freeCount, 3);
});

test('full-attention group keeps every block; sliding group releases blocks its window passed', () => {
  const b = new ReferenceBackend();
  const kv = new KvCache(b, [0, 5], shape, () => 16);
  const seq = kv.newSequence();
  kv.grow(seq, 0, 10); // prompt of 10 tokens: blocks 0..2 in both groups
  assert.deepEqual(seq.tables.map((t) => t.length), [3, 3]);
  assert.ok(seq.tables.every((t) => t.every((x) => x >= 0)));
  // decoding position 13 with window 5 reads 9..13: logical blocks 2..3 only
  kv.grow(seq, 13, 14);
  assert.equal(seq.tables[0].filter((x) => x >= 0).length, 4);
  assert.deepEqual(seq.tables[1].slice(0, 2), [-1, -1]);
  assert.equal(seq.tables[1].filter((x) => x >= 0).length, 2);
  assert.equal(kv.usedBlocks, 6);
  kv.release(seq);
  assert.equal(kv.usedBlocks, 0);
});

test('sliding group stays bounded over a long generation', () => {
  const b = new ReferenceBackend();
  const window = 6, chunk = 1;
  const need = blocksPerSequence(window, 1000, shape.blockSize, chunk);
  const kv = new KvCache(b, [window], shape, () => need);
  const seq = kv.newSequence();
  for (let p = 0; p < 1000; p++) {
    assert.ok(kv.canGrow(seq, p, p + 1), `position ${p}`);
    kv.grow(seq, p, p + 1);
  }
  assert.ok(kv.usedBlocks <= need);
});

test('layouts map positions to slots through the block tables', async () => {
  const b = new ReferenceBackend();
  const kv = new KvCache(b, [0], shape, () => 8);
  const s1 = kv.newSequence(), s2 = kv.newSequence();
  kv.grow(s1, 0, 6);
  kv.grow(s2, 0, 2);
  const [layout] = kv.layouts([{ seq: s1, start: 4, count: 2 }, { seq: s2, start: 0, count: 2 }]);
  const slots = Array.from(await b.read(layout.slots));
  const t1 = s1.tables[0], t2 = s2.tables[0];
  assert.deepEqual(slots, [t1[1] * 4 + 0, t1[1] * 4 + 1, t2[0] * 4 + 0, t2[0] * 4 + 1]);
  assert.deepEqual(Array.from(await b.read(layout.tokenRow)), [0, 0, 1, 1]);
  assert.deepEqual(Array.from(await b.read(layout.tokenPos)), [4, 5, 0, 1]);
  assert.deepEqual(layout.blockTables.shape, [2, 2]);
  assert.throws(() => kv.layouts([{ seq: s2, start: 2, count: 3 }]), /grow first/);
});
