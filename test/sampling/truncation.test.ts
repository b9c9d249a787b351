// Each transform on its own, against hand-computed distributions.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { samplingDistribution, type TruncationParams } from '../../src/sampling/sample-row.ts';
import { assertClose } from './reference.ts';
import { topPSelect } from '../../src/sampling/truncation.ts';

const off: TruncationParams = { temperature: 1, topK: 0, topP: 1, minP: 0 };
const ln = Math.log;

function expectDist(x: number[], p: Partial<TruncationParams>, want: Record<number, number>): void {
  const got = samplingDistribution(Float32Array.from(x), { ...off, ...p });
  assert.deepEqual([...got.keys()].sort((a, b) => a - b), Object.keys(want).map(Number), `support for ${JSON.stringify(p)}`);
  for (const [id, prob] of Object.entries(want)) assertClose(got.get(Number(id))!, prob, 1e-6, `p(${id})`);
}

test('temperature: softmax(x / T)', () => {
  const x = [0, ln(2), ln(4)];
  expectDist(x, {}, { 0: 1 / 7, 1: 2 / 7, 2: 4 / 7 });
  expectDist(x, { temperature: 0.5 }, { 0: 1 / 21, 1: 4 / 21, 2: 16 / 21 });
  const s = 3 + Math.SQRT2;
  expectDist(x, { temperature: 2 }, { 0: 1 / s, 1: Math.SQRT2 / s, 2: 2 / s });
});

test('temperature 0 is argmax, lowest id on ties', () => {
  expectDist([1, 5, 5, 2], { temperature: 0 }, { 1: 1 });
});

test('top-k keeps the k best and renormalises; ties with the k-th are kept', () => {
  const e = Math.E;
  expectDist([1, 3, 2, 0], { topK: 2 }, { 1: e / (e + 1), 2: 1 / (e + 1) });
  expectDist([2, 2, 0], { topK: 1 }, { 0: 0.5, 1: 0.5 });
  expectDist([1, 3, 2, 0], { topK: -1 }, distOf([1, 3, 2, 0]));
  expectDist([1, 3, 2, 0], { topK: 4 }, distOf([1, 3, 2, 0]));
});

test('top-p keeps the smallest head reaching the mass', () => {
  const x = [0.5, 0.3, 0.15, 0.05].map(ln);
  expectDist(x, { topP: 0.4 }, { 0: 1 });
  expectDist(x, { topP: 0.75 }, { 0: 0.5 / 0.8, 1: 0.3 / 0.8 });
  expectDist(x, { topP: 0.81 }, { 0: 0.5 / 0.95, 1: 0.3 / 0.95, 2: 0.15 / 0.95 });
});

test('min-p drops tokens below minP * p_max', () => {
  const x = [0.5, 0.3, 0.15, 0.05].map(ln);
  expectDist(x, { minP: 0.2 }, { 0: 0.5 / 0.95, 1: 0.3 / 0.95, 2: 0.15 / 0.95 });
  expectDist(x, { minP: 0.5 }, { 0: 0.5 / 0.8, 1: 0.3 / 0.8 });
  expectDist(x, { minP: 1 }, { 0: 1 });
  // the same cut on the sorted candidate lists that top-k and top-p produce
  expectDist(x, { topK: 3, minP: 0.5 }, { 0: 0.5 / 0.8, 1: 0.3 / 0.8 });
  expectDist(x, { topP: 0.99, minP: 0.5 }, { 0: 0.5 / 0.8, 1: 0.3 / 0.8 });
  expectDist(x, { topK: 4, minP: 0.2 }, { 0: 0.5 / 0.95, 1: 0.3 / 0.95, 2: 0.15 / 0.95 });
});

test('order: top-p sees the top-k-renormalised distribution', () => {
  // after top-k=2: [4/7, 3/7]; top-p 0.5 keeps only the first. (On the raw distribution the first
  // token has only 0.4 < 0.5, so applying top-p first would keep two.)
  const x = [0.4, 0.3, 0.2, 0.1].map(ln);
  expectDist(x, { topK: 2, topP: 0.5 }, { 0: 1 });
  expectDist(x, { topK: 2 }, { 0: 4 / 7, 1: 3 / 7 });
});

test('order: temperature applies before top-p', () => {
  // T = 0.5 squares the weights: [0.25, 0.09, ...] / 0.3625 -> first token 0.69 >= 0.6
  const x = [0.5, 0.3, 0.15, 0.05].map(ln);
  expectDist(x, { temperature: 0.5, topP: 0.6 }, { 0: 1 });
  expectDist(x, { temperature: 1, topP: 0.6 }, { 0: 0.5 / 0.8, 1: 0.3 / 0.8 });
});

function distOf(x: number[]): Record<number, number> {
  const e = x.map(Math.exp);
  const z = e.reduce((a, b) => a + b, 0);
  return Object.fromEntries(e.map((v, i) => [i, v / z]));
}

test('topPSelect: a partition sum reaching the target where the one-by-one sum falls short continues the rule past the partition', () => {
  // ids a..e = 0..4. The first partition (pivot 1) sums a + b + c = 1 + 1 + 1e16 = 1e16 + 2 and
  // narrows to them; one by one, 1e16 + 1 + 1 rounds to 1e16 (< target), so the rule must go on to
  // d (kept: the mass before it is still short) and stop before e, not keep the whole row.
  const x = Float32Array.from([2, 2, 3, 1, 0]);
  const w = Float64Array.from([1, 1, 1e16, 1e16, 1]);
  const ids = Int32Array.from([3, 0, 1, 2, 4]);
  const n = topPSelect(x, w, ids, 5, 1e16 + 2);
  assert.equal(n, 4);
  assert.deepEqual([...ids.subarray(0, n)].sort(), [0, 1, 2, 3]);
});
