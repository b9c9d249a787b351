// On-device sampling on the CUDA backend (k_sample_rows) against the host sampler: for random
// rows (f32 and bf16 logits), every parameter combination and many uniforms, the device token
// equals the host's, except where the case sits within the stated tolerance of a rounding
// boundary (1e-5 of the mass: a draw boundary near u * Z, a top-p cut, a min-p weight), computed
// on the host in float64; those are counted and must stay rare. Logprobs within 1e-5. Skipped
// without a usable CUDA.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { decodeSampleResults } from '../../src/contracts/device-sampling.ts';
import { CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import { sampleOnDevice } from '../../src/sampling/device-sampling.ts';
import { TokenHistory } from '../../src/sampling/history.ts';
import type { SamplingParamsInput } from '../../src/sampling/params.ts';
import { Sampler } from '../../src/sampling/sampler.ts';
import {
  boundaryMargin, type Case, casesFor, compareWithHost, deviceRow, logitRows, NEAR_ENDS, normalLogits, randomMask, toBf16,
  SEEDED_REQUESTS,
} from '../sampling/device-sampling-cases.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
if (SKIP) console.log(`# cuda-sampling: skipping every test: ${SKIP}`);

/** the stated tolerance, relative to the mass (to minP for min-p) */
const TOL = 1e-5;

let cuda: CudaBackend;

before(async () => {
  if (SKIP) return;
  cuda = await createCudaBackend();
  await cuda.ready?.();
});
after(async () => {
  if (SKIP) return;
  await cuda.close();
});

/** The cases as one sampleRows call on CUDA, logits uploaded as f32 or converted to bf16. */
async function runCuda(cases: Case[], dtype: 'f32' | 'bf16') {
  const V = cases[0]!.raw.length;
  const logits = new Float32Array(cases.length * V);
  cases.forEach((c, i) => logits.set(c.raw, i * V));
  const rows = cases.map(deviceRow);
  cuda.beginScope();
  try {
    const t = cuda.upload(logits, [cases.length, V]);
    const x = dtype === 'bf16' ? cuda.scale(t, 1) : t;
    const out = cuda.sampleRows(x, rows);
    return decodeSampleResults((await cuda.read(out)) as Int32Array, rows);
  } finally {
    cuda.endScope();
  }
}

describe('sampleRows on CUDA = the host sampler', { skip: SKIP }, () => {
  for (const V of [50, 1000, 32000, 128256]) {
    for (const dtype of ['f32', 'bf16'] as const) {
      it(`V ${V}, ${dtype} logits: every combination, many uniforms, logprobs`, async (t) => {
        let skipped = 0;
        let checked = 0;
        for (const [k, raw0] of logitRows(V, 17 * V).entries()) {
          const raw = dtype === 'bf16' ? toBf16(raw0) : raw0;
          const cases = casesFor(raw, V + 10 * k, V > 32000 ? 4 : 12, NEAR_ENDS);
          const r = compareWithHost(cases, await runCuda(cases, dtype), TOL);
          skipped += r.skipped;
          checked += r.checked;
        }
        t.diagnostic(`${checked} cases equal, ${skipped} within ${TOL} of a boundary`);
        assert.ok(skipped <= Math.max(2, checked / 100), `${skipped} of ${checked + skipped} cases differ near a boundary`);
      });
    }
  }

  it('256 rows of a 256k vocabulary in one call, mixed parameters', async (t) => {
    const V = 256000;
    const cases: Case[] = [];
    for (let i = 0; cases.length < 256; i++) {
      const all = casesFor(toBf16(normalLogits(V, 900 + i, 3)), 900 + i, 3, NEAR_ENDS);
      // every combination appears; rows share no logits
      for (let j = i % 3; j < all.length && cases.length < 256; j += 9) cases.push(all[j]!);
    }
    const t0 = performance.now();
    const got = await runCuda(cases, 'bf16');
    t.diagnostic(`256 x ${V}: ${(performance.now() - t0).toFixed(1)} ms, the upload of the logits included`);
    const r = compareWithHost(cases, got, TOL);
    assert.ok(r.skipped <= 3, `${r.skipped} of ${cases.length} differ near a boundary`);
  });

  it('is deterministic: the same call twice gives the same bits', async () => {
    const raw = toBf16(normalLogits(50000, 5, 3));
    const cases = casesFor(raw, 5, 4, NEAR_ENDS);
    const a = await runCuda(cases, 'bf16');
    const b = await runCuda(cases, 'bf16');
    assert.deepEqual(b, a);
  });

  it('seeded requests sampled on the device follow the host sequence', async (t) => {
    const V = 32000;
    const inputs = SEEDED_REQUESTS;
    const prompt = Array.from({ length: 50 }, (_, i) => (i * 37) % V);
    const host = inputs.map((p) => new Sampler(p, { vocabSize: V }));
    const dev = inputs.map((p) => new Sampler(p, { vocabSize: V }));
    const hh = inputs.map(() => new TokenHistory(prompt));
    const hd = inputs.map(() => new TokenHistory(prompt));
    const masks = inputs.map((_, i) => (i === 4 ? randomMask(V, 3) : undefined));
    const diverged = inputs.map(() => false);
    let compared = 0;
    for (let step = 0; step < 30; step++) {
      const rows = inputs.map((_, i) => toBf16(normalLogits(V, 1000 * step + i, 2)));
      const us: number[] = inputs.map(() => 0);
      const logits = new Float32Array(inputs.length * V);
      rows.forEach((r, i) => logits.set(r, i * V));
      cuda.beginScope();
      let outcomes;
      try {
        const pending = sampleOnDevice(cuda, cuda.upload(logits, [inputs.length, V]), inputs.map((_, i) => ({
          sampler: { params: dev[i]!.params, nextUniform: () => (us[i] = dev[i]!.nextUniform()) },
          history: hd[i], mask: masks[i],
        })));
        outcomes = await pending.read();
      } finally {
        cuda.endScope();
      }
      rows.forEach((raw, i) => {
        if (diverged[i]) return;
        const c: Case = { label: `seeded ${i}`, raw, params: host[i]!.params, history: hh[i]!, mask: masks[i], u: us[i]! };
        const want = host[i]!.sample(raw, hh[i], masks[i]);
        const o = outcomes[i]!;
        assert.ok('tokenId' in o, `row ${i}: ${'error' in o ? o.error : ''}`);
        if (o.tokenId !== want) {
          // allowed only at a boundary; the histories part ways from here
          assert.ok(boundaryMargin(c) < TOL, `row ${i}, step ${step}: ${o.tokenId} vs the host's ${want}`);
          diverged[i] = true;
          return;
        }
        compared++;
        hh[i]!.push(want);
        hd[i]!.push(o.tokenId);
      });
    }
    t.diagnostic(`${compared} tokens equal, ${diverged.filter(Boolean).length} sequences parted at a boundary`);
    assert.ok(diverged.filter(Boolean).length <= 1);
  });

  it('rows the host cannot sample come back as errors; a greedy row takes a +Infinity logit', async () => {
    const V = 40;
    const raw = normalLogits(V, 5);
    const inf = Float32Array.from(raw);
    inf[7] = Infinity;
    const none = new Int32Array(2);
    const s = (p: SamplingParamsInput) => new Sampler(p, { vocabSize: V });
    const logits = new Float32Array(4 * V);
    [raw, inf, inf, raw].forEach((r, i) => logits.set(r, i * V));
    cuda.beginScope();
    try {
      const out = await sampleOnDevice(cuda, cuda.upload(logits, [4, V]), [
        { sampler: s({ seed: 1 }), mask: none, topLogprobs: 2 },
        { sampler: s({ seed: 1 }) },
        { sampler: s({ temperature: 0 }) },
        { sampler: s({ temperature: 0 }), mask: none },
      ]).read();
      assert.deepEqual(out[0], { error: 'cannot sample: every logit is -Infinity or NaN' });
      assert.deepEqual(out[1], { error: 'cannot sample: a logit is +Infinity' });
      assert.deepEqual(out[2], { tokenId: 7 });
      assert.deepEqual(out[3], { error: 'cannot sample: every logit is -Infinity or NaN' });
    } finally {
      cuda.endScope();
    }
  });

  it('refuses inside a graph capture (it uploads its rows) and checks its arguments', () => {
    const x = cuda.upload(new Float32Array(8), [2, 4]);
    const row = deviceRow(casesFor(normalLogits(4, 1), 1, 2)[0]!);
    assert.throws(() => cuda.sampleRows(x, [row]), /1 rows for logits/);
    assert.throws(() => cuda.sampleRows(x, [row, { ...row, u: 1 }]), /u 1/);
    assert.throws(() => cuda.captureGraph(() => [cuda.sampleRows(x, [row, row])]), /graph/);
    cuda.free(x);
  });
});
