// On-device sampling on the CPU backend (native/sampling.c) against the reference backend's
// sampleRows (float64, the host sampler restated): for random rows (normal logits, heavy ties,
// -Infinity entries, rows of one value, f16/bf16 logits), every parameter combination, histories,
// logit bias, grammar masks, logprobs and many uniforms (0 and 1 - 2^-53 among them), the CPU's
// tokens must be IDENTICAL and its logprobs within 1e-6. The cases of test/sampling run too, and
// must also equal the host sampler's tokens.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import {
  decodeSampleResults, type DeviceSample, type DeviceSampleRow, SAMPLE_ERR_INF, SAMPLE_ERR_MASKED,
} from '../../src/contracts/device-sampling.ts';
import type { Tensor } from '../../src/contracts/backend.ts';
import {
  casesFor, compareWithHost, deviceRow, logitRows, normalLogits, randomMask,
} from '../sampling/device-sampling-cases.ts';
import { rng, WeightDir } from './helpers.ts';

let cpu: CpuBackend;
let files: WeightDir;
const ref = new ReferenceBackend();

before(async () => {
  cpu = await createCpuBackend();
  files = new WeightDir();
});
after(async () => {
  await cpu.close();
  files.cleanup();
});

const ENDS = [0, 1 - 2 ** -53];

/** CPU and reference results of one sampleRows call over `rows` of `raw` (each row's logits). */
async function both(raws: Float32Array[], rows: DeviceSampleRow[], dtype: 'f32' | 'f16' | 'bf16' = 'f32') {
  const V = raws[0]!.length;
  const flat = new Float32Array(raws.length * V);
  raws.forEach((r, i) => flat.set(r, i * V));
  cpu.beginScope();
  try {
    let t: Tensor;
    let exact: Float32Array = flat;
    if (dtype === 'f32') t = cpu.upload(flat, [raws.length, V]);
    else {
      const src = files.write(flat, dtype, [raws.length, V]);
      t = await cpu.loadWeight(src, 'keep');
      const asF32 = await cpu.loadWeight(src, 'f32');
      exact = (await cpu.read(asF32)) as Float32Array; // the values the op sees
      cpu.free(asF32);
    }
    assert.equal(t.dtype, dtype);
    const out = cpu.sampleRows(t, rows);
    const got = (await cpu.read(out)) as Int32Array;
    if (dtype !== 'f32') cpu.free(t);
    const want = (await ref.read(ref.sampleRows(ref.upload(exact, [raws.length, V]), rows))) as Int32Array;
    return { got, want, gotRows: decodeSampleResults(got, rows), wantRows: decodeSampleResults(want, rows) };
  } finally {
    cpu.endScope();
  }
}

const sameF32 = (a: number, b: number) => (Number.isNaN(a) ? Number.isNaN(b) : Math.abs(a - b) <= 1e-6 || a === b);

/** Asserts the CPU's results equal the reference's: tokens exactly, logprobs within 1e-6. */
function assertSame(got: DeviceSample[], want: DeviceSample[], what: (i: number) => string): void {
  assert.equal(got.length, want.length);
  for (let i = 0; i < got.length; i++) {
    const g = got[i]!, w = want[i]!;
    assert.equal(g.tokenId, w.tokenId, `${what(i)}: token`);
    assert.equal(g.logprob === undefined, w.logprob === undefined, `${what(i)}: logprob presence`);
    if (w.logprob !== undefined) assert.ok(sameF32(g.logprob!, w.logprob), `${what(i)}: logprob ${g.logprob} vs ${w.logprob}`);
    assert.deepEqual(g.top?.map((t) => t.tokenId), w.top?.map((t) => t.tokenId), `${what(i)}: top ids`);
    w.top?.forEach((t, j) => assert.ok(sameF32(g.top![j]!.logprob, t.logprob), `${what(i)}: top ${j} ${g.top![j]!.logprob} vs ${t.logprob}`));
  }
}

/** Raw result words equal, NaN logprobs compared as NaN, finite ones within 1e-6. */
function assertSameWords(got: Int32Array, want: Int32Array): void {
  assert.equal(got.length, want.length);
  const gf = new Float32Array(got.buffer, got.byteOffset, got.length), wf = new Float32Array(want.buffer, want.byteOffset, want.length);
  // only the layout: every even word is an id (exact), every odd word a logprob
  for (let i = 0; i < got.length; i++) {
    if (i % 2 === 0) assert.equal(got[i], want[i], `word ${i}`);
    else assert.ok(sameF32(gf[i]!, wf[i]!), `word ${i}: ${gf[i]} vs ${wf[i]}`);
  }
}

/** A parameter grid over one row: every truncation value asked for, alone and combined. */
function gridRows(V: number, seed: number, us: number[]): DeviceSampleRow[] {
  const r = rng(seed);
  const rows: DeviceSampleRow[] = [];
  const base = { temperature: 1, topK: 0, topP: 1, minP: 0, u: 0, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0 };
  const variants: Partial<DeviceSampleRow>[] = [];
  for (const temperature of [0, 0.3, 1, 2.5]) {
    for (const topK of [0, 1, 5, V]) {
      for (const topP of [0.1, 0.9, 1]) {
        for (const minP of [0, 0.05]) variants.push({ temperature, topK, topP, minP });
      }
    }
  }
  const penalised = (): Partial<DeviceSampleRow> => {
    const n = 1 + Math.floor(r() * Math.min(40, V));
    const pid = new Set<number>();
    while (pid.size < n) pid.add(Math.floor(r() * V));
    const penaltyIds = Int32Array.from(pid);
    return {
      penaltyIds, outputCounts: Int32Array.from(penaltyIds, () => (r() < 0.4 ? 0 : 1 + Math.floor(r() * 5))),
      repetitionPenalty: r() < 0.5 ? 1.3 : 0.8, frequencyPenalty: r() < 0.5 ? 0.5 : -0.25, presencePenalty: r() < 0.5 ? 0 : 1.2,
    };
  };
  const biased = (): Partial<DeviceSampleRow> => {
    const bid = new Set<number>();
    while (bid.size < Math.min(6, V)) bid.add(Math.floor(r() * V));
    const biasIds = Int32Array.from(bid);
    return { biasIds, biasValues: Float64Array.from(biasIds, () => (r() < 0.2 ? -100 : (r() - 0.5) * 10)) };
  };
  let k = 0;
  for (const v of variants) {
    const extra: Partial<DeviceSampleRow>[] = [{}];
    // penalties, bias, a mask and logprobs on a rotating subset (every one appears with every truncation kind)
    if (k % 3 === 0) extra.push(penalised());
    if (k % 3 === 1) extra.push(biased());
    if (k % 3 === 2) extra.push({ mask: randomMask(V, seed + k) });
    if (k % 4 === 0) extra.push({ ...penalised(), ...biased(), mask: randomMask(V, seed + 7 * k), topLogprobs: 20 });
    for (const e of extra) {
      const lp = [undefined, 0, 5, 20][(k + rows.length) % 4];
      const uList = v.temperature === 0 ? [0] : us;
      for (const u of uList) rows.push({ ...base, ...v, ...e, u, topLogprobs: e.topLogprobs ?? lp } as DeviceSampleRow);
    }
    k++;
  }
  return rows;
}

function uniformsFor(n: number, seed: number): number[] {
  const r = rng(seed);
  return [...ENDS, ...Array.from({ length: n }, () => r())];
}

/** Rows of the kinds the brief names, for one V. */
function rowKinds(V: number, seed: number): [string, Float32Array][] {
  const r = rng(seed);
  const withNegInf = normalLogits(V, seed + 3, 3);
  for (let i = 0; i < V; i++) if (r() < 0.3) withNegInf[i] = -Infinity;
  withNegInf[Math.floor(r() * V)] = 1;
  const flat = new Float32Array(V).fill(0.5); // one value everywhere: every cut lands on ties
  const two = Float32Array.from({ length: V }, (_, i) => (i % 3 === 0 ? 1 : 0)); // two tie classes
  return [
    ['normal', normalLogits(V, seed, 3)],
    ['heavy ties', normalLogits(V, seed + 1, 2, 0.5)],
    ['-Infinity entries', withNegInf],
    ['one value', flat],
    ['two values', two],
  ];
}

describe('sampleRows on the CPU = the reference backend', () => {
  for (const V of [50, 1000, 32000, 128256]) {
    it(`V ${V}: every parameter combination, histories, bias, masks, logprobs, many uniforms`, async (t) => {
      const nu = V >= 32000 ? 1 : V >= 1000 ? 3 : 6;
      let n = 0;
      for (const [kind, raw] of rowKinds(V, V)) {
        const rows = gridRows(V, V + n, uniformsFor(nu, V + 31 * n));
        const take = V === 128256 ? rows.filter((_, i) => (i + n) % 16 === 0) : V === 32000 ? rows.filter((_, i) => (i + n) % 5 === 0) : rows;
        const { got, want, gotRows, wantRows } = await both(take.map(() => raw), take, 'f32');
        assertSameWords(got, want);
        assertSame(gotRows, wantRows, (i) => `${kind}, V ${V}, row ${i} ${JSON.stringify({ ...take[i], penaltyIds: undefined, outputCounts: undefined, biasIds: undefined, biasValues: undefined, mask: undefined })}`);
        n += take.length;
      }
      t.diagnostic(`${n} rows equal`);
    });
  }

  for (const V of [50, 1000, 32000, 128256]) {
    it(`V ${V}: the host-sampler cases (test/sampling), also equal to the host's tokens`, async () => {
      for (const [k, raw] of logitRows(V, 29 * V).entries()) {
        const cases = casesFor(raw, V + 10 * k, V > 32000 ? 2 : V > 1000 ? 4 : 10, ENDS);
        const rows = cases.map(deviceRow);
        const { got, want, gotRows, wantRows } = await both(cases.map((c) => c.raw), rows);
        assertSameWords(got, want);
        assertSame(gotRows, wantRows, (i) => `${cases[i]!.label}, V ${V}, u ${cases[i]!.u}`);
        const { skipped } = compareWithHost(cases, gotRows, 0);
        assert.equal(skipped, 0);
      }
    });
  }

  it('large top-k (the quickselect path past the heap limit), with top-p, min-p and ties', async () => {
    const V = 32000;
    const kinds = rowKinds(V, 9);
    const raws: Float32Array[] = [];
    const rows: DeviceSampleRow[] = [];
    const us = uniformsFor(2, 10);
    let k = 0;
    for (const topK of [4097, 10000, 31999]) {
      for (const [topP, minP] of [[1, 0], [0.9, 0], [0.5, 0.01]] as const) {
        for (const u of us) {
          raws.push(kinds[k++ % kinds.length]![1]);
          rows.push({ temperature: 1.2, topK, topP, minP, u, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0 });
        }
      }
    }
    const { got, want, gotRows, wantRows } = await both(raws, rows);
    assertSameWords(got, want);
    assertSame(gotRows, wantRows, (i) => `row ${i} ${JSON.stringify(rows[i])}`);
  });

  for (const dtype of ['bf16', 'f16'] as const) {
    it(`${dtype} logits: converted exactly, same results`, async () => {
      const V = 1000;
      const raws = rowKinds(V, 5).map(([, r]) => r);
      const rows = gridRows(V, 77, uniformsFor(1, 78)).filter((_, i) => i % 5 === 0);
      const pick = rows.map((_, i) => raws[i % raws.length]!);
      const { got, want, gotRows, wantRows } = await both(pick, rows, dtype);
      assertSameWords(got, want);
      assertSame(gotRows, wantRows, (i) => `${dtype} row ${i}`);
    });
  }

  it('error rows: all -Infinity (or NaN) -> -1; +Infinity on a non-greedy row -> -2; greedy +Infinity picks it', async () => {
    const V = 1000;
    const allNeg = new Float32Array(V).fill(-Infinity);
    const nan = new Float32Array(V).fill(NaN);
    const mixed = normalLogits(V, 3);
    mixed[17] = NaN;
    const posInf = normalLogits(V, 4);
    posInf[123] = Infinity;
    posInf[456] = Infinity;
    const masked = normalLogits(V, 5);
    const row = (p: Partial<DeviceSampleRow>): DeviceSampleRow => ({
      temperature: 1, topK: 0, topP: 1, minP: 0, u: 0.5, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0, ...p,
    });
    const raws = [allNeg, allNeg, nan, mixed, posInf, posInf, posInf, masked, mixed];
    const rows = [
      row({}), row({ temperature: 0, topLogprobs: 3 }), row({ topLogprobs: 2 }), row({ topLogprobs: 20, topP: 0.9 }),
      row({}), row({ temperature: 0, topLogprobs: 1 }), row({ topK: 5 }),
      row({ mask: new Int32Array(Math.ceil(V / 32)) }), // everything disallowed
      row({ temperature: 0, topLogprobs: 4 }),
    ];
    const { got, want, gotRows, wantRows } = await both(raws, rows);
    assertSameWords(got, want);
    assertSame(gotRows, wantRows, (i) => `error row ${i}`);
    assert.deepEqual(gotRows.map((g) => g.tokenId).slice(0, 8),
      [SAMPLE_ERR_MASKED, SAMPLE_ERR_MASKED, SAMPLE_ERR_MASKED, gotRows[3]!.tokenId, SAMPLE_ERR_INF, 123, SAMPLE_ERR_INF, SAMPLE_ERR_MASKED]);
    assert.ok(gotRows[3]!.tokenId >= 0 && gotRows[3]!.tokenId !== 17);
  });

  it('validates like the reference backend; zero rows; stream order (later ops see the result)', async () => {
    cpu.beginScope();
    try {
      const x = cpu.upload(normalLogits(10, 1), [2, 5]);
      const ok = { temperature: 1, topK: 0, topP: 1, minP: 0, u: 0.5, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0 };
      assert.throws(() => cpu.sampleRows(x, [ok]), /sampleRows: 1 rows for logits/);
      assert.throws(() => cpu.sampleRows(x, [ok, { ...ok, u: 1 }]), { name: 'RangeError', message: 'sampleRows: u 1 is out of range' });
      assert.throws(() => cpu.sampleRows(x, [ok, { ...ok, topLogprobs: 21 }]), /sampleRows: topLogprobs 21 is out of range/);
      assert.throws(() => cpu.sampleRows(cpu.upload(new Int32Array(4), [2, 2]), [ok, ok]), /sampleRows/);
      const empty = cpu.sampleRows(cpu.upload(new Float32Array(0), [0, 5]), []);
      assert.deepEqual(empty.shape, [0, 2]);
      // the result feeds a later op in stream order: gather the token words
      const y = cpu.sampleRows(x, [{ ...ok, temperature: 0 }, { ...ok, temperature: 0, topLogprobs: 2 }]);
      assert.deepEqual(y.shape, [2, 6]);
      const g = cpu.gatherRows(y, cpu.upload(Int32Array.from([1, 0]), [2]));
      const rows = (await cpu.read(g)) as Int32Array;
      const raw = normalLogits(10, 1);
      const am = (a: Float32Array) => a.indexOf(Math.max(...a));
      assert.equal(rows[0], am(raw.subarray(5, 10)));
      assert.equal(rows[6], am(raw.subarray(0, 5)));
    } finally {
      cpu.endScope();
    }
  });
});
