import { test } from 'node:test';
import assert from 'node:assert/strict';
import { topLogprobs } from '../../src/sampling/logprobs.ts';
import { randomLogits, refLogSoftmax, refOrder, assertClose } from './reference.ts';

test('topLogprobs matches a naive float64 log-softmax', () => {
  const x = randomLogits(5000, 3, 4);
  const ref = refLogSoftmax(x);
  const order = refOrder(x);
  const got = topLogprobs(x, 20, 123);
  assert.equal(got.tokenId, 123);
  assertClose(got.logprob, ref[123]!, 1e-9, 'chosen');
  assert.equal(got.top.length, 20);
  got.top.forEach((t, j) => {
    assert.equal(t.tokenId, order[j]);
    assertClose(t.logprob, ref[order[j]!]!, 1e-9, `top[${j}]`);
  });
});

test('stable for huge logits, -Infinity masked tokens, and ties (lower id first)', () => {
  const x = Float32Array.from([1e4, 1e4 - 1, -Infinity, 1e4]);
  const got = topLogprobs(x, 4, 2);
  assert.equal(got.logprob, -Infinity);
  assert.deepEqual(got.top.map((t) => t.tokenId), [0, 3, 1, 2]);
  const z = 2 + Math.exp(-1);
  assertClose(got.top[0]!.logprob, -Math.log(z), 1e-12);
  assertClose(got.top[2]!.logprob, -1 - Math.log(z), 1e-12);
  assert.ok(got.top.every((t) => !Number.isNaN(t.logprob)));
});

test('k = 0 gives no top list; a chosen id outside the row is an error', () => {
  const got = topLogprobs(Float32Array.from([0, Math.log(3)]), 0, 1);
  assert.deepEqual(got.top, []);
  assertClose(got.logprob, Math.log(0.75), 1e-7);
  assert.throws(() => topLogprobs(Float32Array.from([0]), 1, 1), /outside the vocabulary/);
});
