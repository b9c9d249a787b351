// The prefix cache end to end on the engine: greedy outputs are identical with and without it
// (alone, concurrent, under eviction pressure, multi-turn), cached tokens are reported, and no
// block leaks. Tiny random models on the native CPU backend (the reference backend with
// LLMTS_TEST_BACKEND=reference).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Engine } from '../../src/execution/engine.ts';
import { coldOutputs, greedy, tinyModel, tokens } from './helpers.ts';

test('repeated and shared prefixes are reused, outputs unchanged, nothing leaks', async () => {
  const m = await tinyModel();
  const P = tokens(1, 40);
  const prompts = [[...P, ...tokens(2, 9)], [...P, ...tokens(3, 5)], [...P, ...tokens(2, 9)], tokens(9, 20)];
  const cold = await coldOutputs(m, prompts, 10);
  const e = new Engine(m.model, m, { maxBatch: 2 });
  assert.equal(e.stats.prefixCache.enabled, true);
  const cached: number[] = [];
  for (const [k, p] of prompts.entries()) {
    const c = await e.complete(greedy(p, 10));
    assert.deepEqual(c.tokenIds, cold[k], `prompt ${k}`);
    cached.push(c.cachedTokens);
  }
  // 1st: nothing; 2nd: the two full blocks of P; 3rd: every full block but the last prompt
  // token's (49 tokens -> 48 = 3 blocks); 4th: unrelated
  assert.deepEqual(cached, [0, 32, 48, 0]);
  const s = e.stats;
  assert.equal(s.kvBlocksUsed, 0);
  assert.ok(s.kvBlocksCached > 0);
  assert.equal(s.prefixCache.queries, 4);
  assert.equal(s.prefixCache.hits, 2);
  assert.equal(s.prefixCache.misses, 2);
  assert.equal(s.prefixCache.ramTokens, 80);
  await e.close();
  await m.model.backend.close();
});

test('a multi-turn conversation reuses everything up to its newest turn', async () => {
  const m = await tinyModel();
  const e = new Engine(m.model, m, { maxBatch: 1 });
  let history = tokens(4, 37);
  const turns: { prompt: number[]; out: number[]; cached: number }[] = [];
  for (let turn = 0; turn < 3; turn++) {
    const c = await e.complete(greedy(history, 12));
    turns.push({ prompt: history, out: c.tokenIds, cached: c.cachedTokens });
    history = [...history, ...c.tokenIds, ...tokens(10 + turn, 7)];
  }
  for (let t = 1; t < 3; t++) {
    // the previous turn computed its prompt and all but its last generated token
    const computed = turns[t - 1].prompt.length + turns[t - 1].out.length - 1;
    assert.equal(turns[t].cached, Math.floor(computed / 16) * 16, `turn ${t}`);
  }
  const cold = await coldOutputs(m, turns.map((t) => t.prompt), 12);
  assert.deepEqual(turns.map((t) => t.out), cold);
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
  await m.model.backend.close();
});

test('concurrent requests sharing a prefix produce their solo outputs', async () => {
  const m = await tinyModel();
  const P = tokens(5, 70);
  const prompts = Array.from({ length: 6 }, (_, k) => [...P, ...tokens(20 + k, 3 + k)]);
  const cold = await coldOutputs(m, prompts, 9);
  // a small token budget interleaves prefill chunks with other rows' decode steps
  const e = new Engine(m.model, m, { maxBatch: 4, tokenBudget: 24 });
  const results = await Promise.all(prompts.map((p) => e.complete(greedy(p, 9))));
  assert.deepEqual(results.map((r) => r.tokenIds), cold);
  assert.ok(results.some((r) => r.cachedTokens >= 64), `cached: ${results.map((r) => r.cachedTokens)}`);
  assert.equal(e.stats.kvBlocksUsed, 0);
  // and again, all at once, now every prompt is warm
  const again = await Promise.all(prompts.map((p) => e.complete(greedy(p, 9))));
  assert.deepEqual(again.map((r) => r.tokenIds), cold);
  assert.ok(again.every((r) => r.cachedTokens >= 64));
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
  await m.model.backend.close();
});

test('under eviction pressure (tiny cache, small pool) outputs stay right and blocks are accounted', async () => {
  const m = await tinyModel();
  const P = tokens(6, 33);
  const prompts = Array.from({ length: 10 }, (_, k) => (k % 3 === 0 ? tokens(40 + k, 30 + k) : [...P, ...tokens(30 + (k % 4), 4 + k)]));
  const cold = await coldOutputs(m, prompts, 6);
  const blockBytes = 2 * 2 * 16 * 2 * 8 * 4; // layers * (K,V) * blockSize * kvHeads * headDim * f32
  // a pool of 8 blocks holds two sequences of up to 60 tokens: with the default cap (the whole
  // pool) allocation itself must evict cached blocks; with 1 or 3 the cap does
  for (const cacheBlocks of [1, 3, 8]) {
    const e = new Engine(m.model, m, {
      maxBatch: 2, kvTokens: 128, tokenBudget: 16,
      prefixCache: { promptCacheBytes: cacheBlocks === 8 ? undefined : cacheBlocks * blockBytes },
    });
    const got = await Promise.all(prompts.map((p) => e.complete(greedy(p, 6))));
    assert.deepEqual(got.map((r) => r.tokenIds), cold, `cache of ${cacheBlocks} blocks`);
    assert.equal(e.stats.kvBlocksUsed, 0);
    assert.ok(e.stats.kvBlocksCached <= cacheBlocks);
    assert.equal(e.stats.kvBlocksTotal, 8);
    assert.equal(e.stats.prefixCache.ramCapacityBytes, cacheBlocks * blockBytes);
    assert.ok(e.stats.prefixCache.ramEvictions > 0);
    assert.ok(e.stats.prefixCache.hits > 0);
    await e.close();
  }
  await m.model.backend.close();
});

test('sliding-window models share the blocks their window still reaches', async () => {
  const m = await tinyModel({ slidingWindow: 8 });
  const P = tokens(7, 40);
  const prompts = [[...P, ...tokens(8, 3)], [...P, ...tokens(8, 3)], [...P, ...tokens(9, 20)], tokens(7, 15)];
  const cold = await coldOutputs(m, prompts, 12);
  const e = new Engine(m.model, m, { maxBatch: 2, tokenBudget: 16 });
  const s = e.stats.prefixCache;
  assert.equal(s.enabled, true);
  const got = [];
  for (const p of prompts) got.push(await e.complete(greedy(p, 12)));
  assert.deepEqual(got.map((r) => r.tokenIds), cold);
  // the window (8) reaches one block (16) back: each reuse needs only the last block before it
  assert.deepEqual(got.map((r) => r.cachedTokens), [0, 32, 32, 0]);
  assert.equal(e.stats.kvBlocksUsed, 0);
  // concurrently too
  const again = await Promise.all(prompts.map((p) => e.complete(greedy(p, 12))));
  assert.deepEqual(again.map((r) => r.tokenIds), cold);
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
  // under pressure: a one-block cache and a pool that holds two rows
  const blockBytes = 2 * 2 * 16 * 2 * 8 * 4;
  const small = new Engine(m.model, m, { maxBatch: 2, tokenBudget: 16, kvTokens: 128, prefixCache: { promptCacheBytes: blockBytes } });
  const pressed = await Promise.all([...prompts, ...prompts].map((p) => small.complete(greedy(p, 12))));
  assert.deepEqual(pressed.map((r) => r.tokenIds), [...cold, ...cold]);
  assert.equal(small.stats.kvBlocksUsed, 0);
  assert.ok(small.stats.kvBlocksCached <= 2); // one per group at most
  await small.close();
  await m.model.backend.close();
});

test('cancelling a row that shares cached blocks leaves its siblings and the cache intact', async () => {
  const m = await tinyModel();
  const P = tokens(12, 64);
  const prompts = [0, 1, 2].map((k) => [...P, ...tokens(60 + k, 5)]);
  const cold = await coldOutputs(m, prompts, 20);
  const e = new Engine(m.model, m, { maxBatch: 3, tokenBudget: 32 });
  await e.complete(greedy(P, 2)); // P's blocks are cached
  const ac = new AbortController();
  let seen = 0;
  const victim = new Promise<string>((resolve) => e.submit(greedy(prompts[1], 20), (ev) => {
    if (ev.type === 'token' && ++seen === 3) ac.abort();
    if (ev.type === 'finish') resolve(ev.finishReason);
  }, ac.signal));
  const [a, v, c] = await Promise.all([e.complete(greedy(prompts[0], 20)), victim, e.complete(greedy(prompts[2], 20))]);
  assert.equal(v, 'cancelled');
  assert.deepEqual([a.tokenIds, c.tokenIds], [cold[0], cold[2]]);
  assert.ok(a.cachedTokens >= 48 && c.cachedTokens >= 48);
  assert.equal(e.stats.kvBlocksUsed, 0);
  // the shared blocks are still cached and still right
  const again = await e.complete(greedy(prompts[1], 20));
  assert.deepEqual(again.tokenIds, cold[1]);
  assert.ok(again.cachedTokens >= 48);
  await e.close();
  await m.model.backend.close();
});
