// On-device sampling (Backend.sampleRows) on the reference backend, which CPU CI runs: for random
// rows, every parameter combination and many uniforms, the device token equals the host sampler's
// for the same params / history / mask / u; logprobs equal src/sampling/logprobs.ts; seeded
// requests sampled through sampleOnDevice reproduce the host's whole sequence.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { type DeviceSampleRow, packSampleRows, unpackSampleRows } from '../../src/contracts/device-sampling.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { sampleOnDevice } from '../../src/sampling/device-sampling.ts';
import { TokenHistory } from '../../src/sampling/history.ts';
import { topLogprobs } from '../../src/sampling/logprobs.ts';
import { Sampler } from '../../src/sampling/sampler.ts';
import { sortIdsAscending } from '../../src/sampling/sample-row.ts';
import type { SamplingParamsInput } from '../../src/sampling/params.ts';
import {
  type Case, casesFor, compareWithHost, logitRows, normalLogits, randomHistory, randomMask, sampleCases,
  SEEDED_REQUESTS,
} from './device-sampling-cases.ts';
import { testRandom } from './reference.ts';

const ref = new ReferenceBackend();

for (const V of [50, 1000, 32000]) {
  test(`reference sampleRows = host sampler, V ${V}: every combination, many uniforms, logprobs`, async () => {
    let skipped = 0;
    let checked = 0;
    for (const [k, raw] of logitRows(V, V).entries()) {
      const cases = casesFor(raw, V + k, V >= 32000 ? 6 : 16);
      const r = compareWithHost(cases, await sampleCases(ref, cases), 1e-12);
      skipped += r.skipped;
      checked += r.checked;
    }
    assert.equal(skipped, 0, 'float64 on both sides: no case should sit on a boundary');
    assert.ok(checked > 200, `${checked} cases checked`);
  });
}

test('the device draw walks ascending ids: every u lands where the host lands, including the ends', async () => {
  const raw = Float32Array.from([0.5, 2, -1, 2, 1, -Infinity, 0]);
  const params = { temperature: 1, topK: 0, topP: 1, minP: 0, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0,
    logitBias: new Map<number, number>() };
  const cases: Case[] = [];
  for (let j = 0; j <= 64; j++) cases.push({ label: 'grid', raw, params, history: new TokenHistory(), u: Math.min(j / 64, 1 - 2 ** -52) });
  compareWithHost(cases, await sampleCases(ref, cases), 1e-12);
});

test('seeded requests sampled on the device reproduce the host sequence (one RNG draw per token)', async () => {
  const V = 1000;
  const inputs = SEEDED_REQUESTS;
  const prompt = Array.from({ length: 12 }, (_, i) => (i * 37) % V);
  const host = inputs.map((p) => new Sampler(p, { vocabSize: V }));
  const dev = inputs.map((p) => new Sampler(p, { vocabSize: V }));
  const hh = inputs.map(() => new TokenHistory(prompt));
  const hd = inputs.map(() => new TokenHistory(prompt));
  const masks = inputs.map((_, i) => (i === 4 ? randomMask(V, 3) : undefined));
  const seqH: number[][] = inputs.map(() => []);
  const seqD: number[][] = inputs.map(() => []);
  for (let step = 0; step < 40; step++) {
    const rows = inputs.map((_, i) => normalLogits(V, 1000 * step + i, 2));
    rows.forEach((raw, i) => {
      const id = host[i]!.sample(raw, hh[i], masks[i]);
      hh[i]!.push(id);
      seqH[i]!.push(id);
    });
    const logits = new Float32Array(inputs.length * V);
    rows.forEach((r, i) => logits.set(r, i * V));
    const pending = sampleOnDevice(ref, ref.upload(logits, [inputs.length, V]),
      inputs.map((_, i) => ({ sampler: dev[i]!, history: hd[i], mask: masks[i], topLogprobs: i === 1 ? 2 : undefined })));
    const outcomes = await pending.read();
    outcomes.forEach((o, i) => {
      assert.ok('tokenId' in o, `row ${i}: ${'error' in o ? o.error : ''}`);
      hd[i]!.push(o.tokenId);
      seqD[i]!.push(o.tokenId);
      if (i !== 1) return;
      const want = topLogprobs(rows[i]!, 2, o.tokenId); // of the raw row; the device returns f32
      assert.deepEqual(o.logprobs!.top.map((t) => t.tokenId), want.top.map((t) => t.tokenId));
      for (const [g, w] of [[o.logprobs!.logprob, want.logprob], ...o.logprobs!.top.map((t, j) => [t.logprob, want.top[j]!.logprob])]) {
        assert.ok(Math.abs(g! - w!) <= 1e-5, `logprob ${g} vs ${w}`);
      }
    });
  }
  assert.deepEqual(seqD, seqH);
  assert.ok(new Set(seqH[0]).size > 5, 'the sequences are random');
});

test('rows the host cannot sample come back as errors; a greedy row takes a +Infinity logit', async () => {
  const V = 40;
  const raw = normalLogits(V, 5);
  const inf = Float32Array.from(raw);
  inf[7] = Infinity;
  const none = new Int32Array(2); // nothing allowed
  const s = (p: SamplingParamsInput) => new Sampler(p, { vocabSize: V });
  const logits = new Float32Array(4 * V);
  [raw, inf, inf, raw].forEach((r, i) => logits.set(r, i * V));
  const pending = sampleOnDevice(ref, ref.upload(logits, [4, V]), [
    { sampler: s({ seed: 1 }), mask: none, topLogprobs: 2 },
    { sampler: s({ seed: 1 }) },
    { sampler: s({ temperature: 0 }) },
    { sampler: s({ temperature: 0 }), mask: none },
  ]);
  const out = await pending.read();
  assert.deepEqual(out[0], { error: 'cannot sample: every logit is -Infinity or NaN' });
  assert.deepEqual(out[1], { error: 'cannot sample: a logit is +Infinity' });
  assert.deepEqual(out[2], { tokenId: 7 });
  assert.deepEqual(out[3], { error: 'cannot sample: every logit is -Infinity or NaN' });
  assert.throws(() => new Sampler({ temperature: 0 }).sample(raw, undefined, none), /every logit/);
  assert.throws(() => new Sampler({ seed: 1 }).sample(inf), /\+Infinity/);
});

test('penalties without a history are refused before any uniform is drawn', () => {
  let draws = 0;
  const sampler = { params: new Sampler({ repetitionPenalty: 1.2 }).params, nextUniform: () => (draws++, 0.5) };
  assert.throws(() => sampleOnDevice(ref, ref.upload(new Float32Array(4), [1, 4]), [{ sampler }]), /no TokenHistory/);
  assert.equal(draws, 0);
});

test('packed rows: one buffer, round trip, merged entries, ids outside the row ignored, bad rows refused', () => {
  const V = 100;
  const h = randomHistory(V, 1);
  const base: DeviceSampleRow = {
    temperature: 0.7, topK: 5, topP: 0.9, minP: 0.05, u: 0.25, repetitionPenalty: 1.1, frequencyPenalty: 0.5,
    presencePenalty: -0.25,
  };
  const ids = [...h.seen()];
  const rows: DeviceSampleRow[] = [
    {
      ...base, penaltyIds: Int32Array.from([...ids, 150]), outputCounts: Int32Array.from([...ids.map((id) => h.count(id)), 1]),
      biasIds: Int32Array.from([ids[0]!, 99, -3]), biasValues: Float64Array.from([0.1, -100, 4]), mask: randomMask(V, 4),
      topLogprobs: 7,
    },
    { ...base, temperature: 0, topK: 1000 },
  ];
  const packed = packSampleRows(rows, V);
  assert.equal(packed.k, 7);
  assert.equal(packed.scratchRows, 1);
  const back = unpackSampleRows(packed.words);
  const r0 = back.rows[0]!;
  assert.deepEqual([...r0.penaltyIds!], ids);
  assert.deepEqual([...r0.outputCounts!], ids.map((id) => h.count(id)));
  assert.deepEqual([...r0.biasIds!], [ids[0]!, 99]);
  assert.deepEqual([...r0.biasValues!], [0.1, -100]);
  assert.deepEqual([...r0.mask!], [...rows[0]!.mask!, ...new Array(Math.ceil(V / 32) - rows[0]!.mask!.length).fill(0)]);
  assert.equal(r0.topLogprobs, 7);
  for (const k of ['temperature', 'topK', 'topP', 'minP', 'u', 'repetitionPenalty', 'frequencyPenalty', 'presencePenalty'] as const) {
    assert.equal(r0[k], base[k], k);
  }
  assert.equal(back.rows[1]!.topK, 0, 'top-k at or past the vocabulary is off');
  assert.equal(back.rows[1]!.penaltyIds, undefined);
  const bad: [Partial<DeviceSampleRow>, RegExp][] = [
    [{ u: 1 }, /u 1/], [{ temperature: -1 }, /temperature/], [{ topLogprobs: 21 }, /topLogprobs/],
    [{ penaltyIds: Int32Array.from([1, 1]), outputCounts: Int32Array.from([0, 0]) }, /twice/],
    [{ biasIds: Int32Array.from([1]) }, /biasValues/],
  ];
  for (const [patch, re] of bad) assert.throws(() => packSampleRows([{ ...base, ...patch }], V), re);
});

test('sortIdsAscending: few ids by sort, many by marking', () => {
  const r = testRandom(3);
  for (const [n, V] of [[5, 1000], [600, 1000], [1000, 1000]] as const) {
    const all = Int32Array.from({ length: V }, (_, i) => i).sort(() => r() - 0.5);
    const ids = all.slice(0, n);
    const want = [...ids].sort((a, b) => a - b);
    sortIdsAscending(ids, n, V);
    assert.deepEqual([...ids], want);
  }
});
