import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Sampler } from '../../src/sampling/sampler.ts';
import { samplingDistribution } from '../../src/sampling/sample-row.ts';
import type { SamplingParamsInput } from '../../src/sampling/params.ts';
import { SamplingParamsError } from '../../src/sampling/validate.ts';
import { assertClose, chiSquare, randomLogits, refDistribution, type RefParams } from './reference.ts';

const full = (p: Partial<RefParams>): RefParams => ({ temperature: 1, topK: 0, topP: 1, minP: 0, ...p });

function draws(params: SamplingParamsInput, row: Float32Array, n: number): Map<number, number> {
  const s = new Sampler(params);
  const counts = new Map<number, number>();
  for (let i = 0; i < n; i++) {
    const id = s.sample(row);
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  return counts;
}

test('greedy: argmax with ties to the lowest id, no randomness consumed', () => {
  const s = new Sampler({ temperature: 0 });
  assert.equal(s.sample(Float32Array.from([0, 4, 1, 4])), 1);
  assert.throws(() => s.sample(Float32Array.from([-Infinity, -Infinity])), /every logit/);
});

test('masked (-Infinity) tokens are never drawn; a fully masked or +Infinity row is an error', () => {
  const row = Float32Array.from([-Infinity, 0, -Infinity, 0.5, -Infinity]);
  for (const p of [{}, { topK: 4 }, { topP: 0.99 }, { minP: 0.01 }]) {
    assert.deepEqual([...draws({ ...p, seed: 3 }, row, 2000).keys()].sort(), [1, 3], JSON.stringify(p));
  }
  for (const p of [{}, { topK: 2 }, { topP: 0.5 }]) {
    assert.throws(() => new Sampler(p).sample(Float32Array.from([-Infinity, -Infinity])), /every logit/);
  }
  assert.throws(() => new Sampler({}).sample(Float32Array.from([0, Infinity])), /\+Infinity/);
});

test('same seed -> same tokens; different seeds -> different tokens', () => {
  const rows = Array.from({ length: 200 }, (_, i) => randomLogits(1000, i, 1));
  const run = (seed?: number): number[] => {
    const s = new Sampler({ temperature: 1, seed });
    return rows.map((r) => s.sample(r));
  };
  assert.deepEqual(run(7), run(7));
  assert.notDeepEqual(run(7), run(8));
  assert.notDeepEqual(run(), run(), 'unseeded requests are crypto-seeded');
});

test('sampled frequencies match the softmax (chi-square, fixed seed)', () => {
  const row = Float32Array.from([1.0, 0.2, -0.5, 2.0, 0.0, 1.5, -1.0, 0.7]);
  const n = 40000;
  for (const p of [{ temperature: 1 }, { temperature: 0.7 }, { temperature: 1.3, topK: 5, topP: 0.9, minP: 0.1 }]) {
    const want = refDistribution(row, full(p));
    const counts = draws({ ...p, seed: 2024 }, row, n);
    for (const id of counts.keys()) assert.ok(want.has(id), `token ${id} is outside the distribution for ${JSON.stringify(p)}`);
    const df = want.size - 1;
    const chi = chiSquare(counts, want, n);
    // loose bound: mean df, sd sqrt(2 df); a wrong temperature or off-by-one cut gives hundreds
    assert.ok(chi < df + 6 * Math.sqrt(2 * df), `chi-square ${chi.toFixed(1)} with df ${df} for ${JSON.stringify(p)}`);
  }
});

test('a wrong distribution would fail the chi-square check (the test can fail)', () => {
  const row = Float32Array.from([1.0, 0.2, -0.5, 2.0, 0.0, 1.5, -1.0, 0.7]);
  const n = 40000;
  const counts = draws({ temperature: 0.7, seed: 2024 }, row, n);
  const wrong = refDistribution(row, full({ temperature: 0.8 }));
  assert.ok(chiSquare(counts, wrong, n) > 7 + 6 * Math.sqrt(14));
});

test('top-k / top-p / min-p: excluded tokens are never drawn', () => {
  const row = randomLogits(1000, 5, 2);
  for (const p of [{ topK: 5 }, { topP: 0.3 }, { minP: 0.3 }, { topK: 50, topP: 0.5, minP: 0.05 }]) {
    const allowed = refDistribution(row, full(p));
    const counts = draws({ ...p, seed: 1 }, row, 5000);
    for (const id of counts.keys()) assert.ok(allowed.has(id), `drew excluded token ${id} under ${JSON.stringify(p)}`);
    assert.ok(counts.size > 1, 'several tokens were allowed and drawn');
  }
});

test('large vocab fast paths give exactly the reference distribution', () => {
  const row = randomLogits(128 * 1024, 11, 2);
  for (const p of [{ topP: 0.9 }, { topP: 0.2, temperature: 0.5 }, { topK: 40 }, { minP: 0.05 }, { topK: 1000, topP: 0.95, minP: 0.01 }]) {
    const want = refDistribution(row, full(p));
    const got = samplingDistribution(row, full(p));
    assert.equal(got.size, want.size, `support size for ${JSON.stringify(p)}`);
    for (const [id, prob] of want) assertClose(got.get(id) ?? -1, prob, 1e-9, `p(${id}) for ${JSON.stringify(p)}`);
  }
});

test('peaked rows: the top-p head fast path gives exactly the reference distribution', () => {
  const row = randomLogits(64 * 1024, 13, 2);
  [3, 900, 40000, 41000, 65535].forEach((id, j) => (row[id] = 14 - j * 0.7)); // a few dominant tokens
  for (const p of [{ topP: 0.9 }, { topP: 0.5, minP: 0.3 }, { topP: 0.999 }]) {
    const want = refDistribution(row, full(p));
    const got = samplingDistribution(row, full(p));
    assert.deepEqual([...got.keys()].sort((a, b) => a - b), [...want.keys()].sort((a, b) => a - b), `support for ${JSON.stringify(p)}`);
    for (const [id, prob] of want) assertClose(got.get(id)!, prob, 1e-9, `p(${id}) for ${JSON.stringify(p)}`);
  }
});

test('ties and large k: quickselect paths give exactly the reference distribution', () => {
  // logits on a coarse grid: thousands of exact ties, which the cuts must break by id
  const r = randomLogits(20000, 12, 1);
  const row = r.map((v) => Math.round(v * 4) / 4);
  for (const p of [{ topP: 0.5 }, { topK: 3000 }, { topK: 5000, topP: 0.7 }, { topK: 2500, minP: 0.3 }, { topP: 0.3, minP: 0.8, temperature: 0.7 }]) {
    const want = refDistribution(row, full(p));
    const got = samplingDistribution(row, full(p));
    assert.deepEqual([...got.keys()].sort((a, b) => a - b), [...want.keys()].sort((a, b) => a - b), `support for ${JSON.stringify(p)}`);
    for (const [id, prob] of want) assertClose(got.get(id)!, prob, 1e-9, `p(${id}) for ${JSON.stringify(p)}`);
  }
});

test('the constructor rejects invalid parameters', () => {
  assert.throws(() => new Sampler({ topP: 0 }), SamplingParamsError);
  assert.throws(() => new Sampler({ logitBias: { 5: 1 } }, { vocabSize: 5 }), /out of range \[0, 4\]/);
});
