// Block pool bookkeeping for prefix reuse: reference counts, the LRU of evictable cached blocks,
// its cap, and what counts as free.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockPool } from '../../src/state/block-pool.ts';
import { chainHashes, hashTokens, prefixNamespace } from '../../src/state/block-hash.ts';

test('a shared block is in use once and never counted as free', () => {
  const pool = new BlockPool(6, 6);
  const [a, b] = pool.allocate(2);
  assert.ok(pool.register(a, 'h0'));
  assert.ok(pool.register(b, 'h1'));
  // a second sequence takes the same two blocks
  pool.acquire(pool.lookup('h0')!);
  pool.acquire(pool.lookup('h1')!);
  assert.equal(pool.usedCount, 2);
  assert.equal(pool.freeCount, 4);
  pool.release([b, a]); // the first sequence leaves: still in use by the second
  assert.equal(pool.usedCount, 2);
  assert.equal(pool.cachedCount, 0);
  pool.release([b, a]);
  assert.equal(pool.usedCount, 0);
  assert.equal(pool.cachedCount, 2);
  assert.equal(pool.freeCount, 6);
  assert.equal(pool.lookup('h0'), a); // still reusable
  pool.acquire(a); // taken back off the LRU
  assert.equal(pool.cachedCount, 1);
  assert.equal(pool.usedCount, 1);
  assert.throws(() => pool.release([b]), /not in use/);
});

test('allocation evicts the least recently released cached block once the free list is empty', () => {
  const pool = new BlockPool(4, 4);
  const ids = pool.allocate(4);
  ids.forEach((id, k) => pool.register(id, `h${k}`));
  pool.release([ids[3], ids[2]]); // tail first: h3 then h2 become evictable
  pool.release([ids[1]]);
  assert.equal(pool.cachedCount, 3);
  const [x] = pool.allocate(1);
  assert.equal(x, ids[3]);
  assert.equal(pool.lookup('h3'), undefined);
  assert.equal(pool.lookup('h2'), ids[2]);
  assert.equal(pool.evictions, 1);
  assert.equal(pool.hashOfBlock(x), undefined);
  assert.throws(() => pool.allocate(3), /exhausted/);
  assert.deepEqual(pool.allocate(2).sort(), [ids[1], ids[2]].sort());
});

test('the cap bounds evictable blocks; 0 keeps none and registers nothing', () => {
  const pool = new BlockPool(8, 2);
  const ids = pool.allocate(5);
  ids.forEach((id, k) => pool.register(id, `h${k}`));
  pool.release(ids);
  assert.equal(pool.cachedCount, 2);
  assert.deepEqual([pool.lookup('h3'), pool.lookup('h4')], [ids[3], ids[4]]);
  assert.equal(pool.lookup('h0'), undefined);
  assert.equal(pool.freeCount, 8);
  pool.setMaxCached(1);
  assert.equal(pool.cachedCount, 1);
  assert.equal(pool.dropCached(), 1);
  assert.equal(pool.hashedCount, 0);
  const off = new BlockPool(4, 0);
  const [y] = off.allocate(1);
  assert.equal(off.register(y, 'h'), false);
  off.release([y]);
  assert.equal(off.cachedCount, 0);
});

test('a duplicate of a registered block stays private and is freed on release', () => {
  const pool = new BlockPool(4, 4);
  const [a, b] = pool.allocate(2);
  assert.ok(pool.register(a, 'same'));
  assert.equal(pool.register(b, 'same'), false);
  pool.release([b]);
  assert.equal(pool.cachedCount, 0);
  assert.equal(pool.lookup('same'), a);
});

test('block hashes chain: a prefix decides every later hash; namespaces separate models', () => {
  const kv = { dtype: 'f32' as const, blockSize: 4, numLayers: 2, numKvHeads: 1, headDim: 8 };
  const ns = prefixNamespace({ model: 'm', kv });
  const t = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
  const h = hashTokens(ns, t, 4);
  assert.equal(h.length, 2); // only full blocks
  assert.deepEqual(hashTokens(ns, [...t.slice(0, 8), 99], 4), h);
  const changed = hashTokens(ns, [0, ...t.slice(1)], 4);
  assert.notEqual(changed[0], h[0]);
  assert.notEqual(changed[1], h[1]); // block 1's tokens are equal, its prefix is not
  assert.deepEqual(chainHashes(ns, (p) => t[p], 4, 1, 2, h[0]), [h[1]]);
  assert.notDeepEqual(hashTokens(prefixNamespace({ model: 'other', kv }), t, 4), h);
  assert.notDeepEqual(hashTokens(prefixNamespace({ model: 'm', kv: { ...kv, dtype: 'bf16' } }), t, 4), h);
  assert.notDeepEqual(hashTokens(prefixNamespace({ model: 'm', kv, tokenizer: 'x' }), t, 4), h);
});

test('every eviction is announced with its hash while the block still holds it; an explicit drop is not', () => {
  const pool = new BlockPool(3, 2);
  const seen: { hash: string; stillThere: boolean }[] = [];
  pool.onEvict = (hash) => seen.push({ hash, stillThere: pool.lookup(hash) !== undefined });
  const ids = pool.allocate(3);
  ids.forEach((id, k) => pool.register(id, `h${k}`));
  pool.release([ids[2], ids[1], ids[0]]); // the cap (2) evicts the least recently released: h2
  assert.deepEqual(seen, [{ hash: 'h2', stillThere: true }]);
  pool.allocate(2); // one free block, then the LRU: h1
  assert.deepEqual(seen.map((s) => s.hash), ['h2', 'h1']);
  assert.ok(seen.every((s) => s.stillThere));
  assert.equal(pool.evictions, 2);
  assert.equal(pool.dropCached(), 1); // h0: forgotten on purpose, not announced
  assert.equal(seen.length, 2);
});
