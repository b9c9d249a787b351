import { test } from 'node:test';
import assert from 'node:assert/strict';
import { argmax, kthLargestValue, topIndices } from '../../src/sampling/select.ts';
import { refOrder, testRandom } from './reference.ts';

test('argmax: lowest id on ties, -1 when fully masked, NaN ignored', () => {
  assert.equal(argmax(Float32Array.from([1, 5, 5, 2])), 1);
  assert.equal(argmax(Float32Array.from([7, 7])), 0);
  assert.equal(argmax(Float32Array.from([NaN, 1, NaN])), 1);
  assert.equal(argmax(Float32Array.from([-Infinity, -Infinity])), -1);
});

test('topIndices equals a full sort (value desc, id asc) with many ties', () => {
  const r = testRandom(9);
  for (const [n, m] of [[1, 1], [10, 3], [1000, 1], [1000, 50], [1000, 999], [5000, 257]] as const) {
    // values on a coarse grid so ties are frequent
    const x = Float32Array.from({ length: n }, () => Math.floor(r() * 20) - 10);
    const want = refOrder(x).slice(0, m);
    assert.deepEqual(Array.from(topIndices(x, m)), want, `n=${n} m=${m}`);
    assert.equal(kthLargestValue(x, m), x[want[m - 1]!], `kth n=${n} m=${m}`);
  }
  assert.deepEqual(Array.from(topIndices(Float32Array.from([1, 2]), 5)), [1, 0]);
  assert.deepEqual(Array.from(topIndices(Float32Array.from([1, 2]), 0)), []);
});

test('kthLargestValue on distinct, constant and masked rows', () => {
  const x = Float32Array.from([3, -1, 7, 0, 5]);
  assert.deepEqual([1, 2, 3, 4, 5].map((k) => kthLargestValue(x, k)), [7, 5, 3, 0, -1]);
  assert.equal(kthLargestValue(new Float32Array(100).fill(2), 37), 2);
  assert.equal(kthLargestValue(Float32Array.from([NaN, -Infinity, 1]), 2), -Infinity);
});
