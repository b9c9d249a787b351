// FP8 (e4m3) matmul weights on the CUDA backend (cuda-fp8-weights.ts, fp8-kernels.ts), on a GPU:
// matmul against a float64 product of the same e4m3 values and scales at decode rows (each FP8
// GEMV), at more within an ulp of the bf16 matmul of the loader's values (what the dequantization feeds
// cuBLASLt), with a bias, through row views and a packed load; a row's bits alone and batched in
// the tensor-core GEMV; the FP8 checkpoint fixtures (scripts/make_fp8_fixtures.py) kept in FP8 against
// transformers under the bf16 tolerance of the CPU's FP8 test, alone and batched; and
// LLMTS_CUDA_FP8_WEIGHTS off loading them dequantized. The kernels' simulator twin:
// cuda-fp8-sim.test.ts. Skipped with the reason where CUDA is not usable (CI).
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { bf16ToF32, encodeHalf } from '../../src/backends/common/half.ts';
import { type CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import { E4M3_VALUES } from '../../src/artifacts/fp8-checkpoint.ts';
import type { Tensor, WeightSource } from '../../src/contracts/backend.ts';
import { Engine } from '../../src/execution/engine.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import type { DecoderModel } from '../../src/models/decoder.ts';
import { checkReferenceCases, type ReferenceCase } from '../helpers/reference-cases.ts';
import { randomF32, rng } from './helpers.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
if (SKIP) console.log(`# cuda-fp8: skipping every test: ${SKIP}`);

const FIXTURES = resolve(import.meta.dirname, '../fixtures/fp8');
/** as test/models/fp8-fixtures.test.ts for matrices dequantized to bf16 */
const TOLERANCE = 0.1;

/** An FP8 source of random e4m3 bytes (no NaN bytes) and scales [N, ceil(K / 128)] in [0.01, 2]. */
function fp8Source(r: () => number, name: string, N: number, K: number) {
  const KB = Math.ceil(K / 128);
  const bits = new Uint8Array(N * K);
  for (let i = 0; i < bits.length; i++) {
    let b = Math.floor(r() * 256);
    if ((b & 0x7f) === 0x7f) b ^= 1;
    bits[i] = b;
  }
  const scales = new Float32Array(N * KB).map(() => 0.01 + 1.99 * r());
  const values = new Float32Array(N * K);
  for (let i = 0; i < values.length; i++) values[i] = E4M3_VALUES[bits[i]!]! * scales[Math.floor(i / K) * KB + ((i % K) >> 7)]!;
  const src: WeightSource = {
    path: '/nonexistent', offset: 0, dtype: 'bf16', shape: [N, K], name,
    decode: () => new Uint8Array(encodeHalf(values, 'bf16').buffer),
    fp8: () => ({ bits, scales, scaleCols: 128 }),
  };
  return { src, values };
}

/** y = x · values^T (+ bias) in float64, x given as bf16-rounded f32 */
function product(M: number, N: number, K: number, x: Float32Array, values: Float32Array, bias?: Float32Array) {
  const y = new Float64Array(M * N);
  for (let m = 0; m < M; m++) {
    for (let n = 0; n < N; n++) {
      let v = bias ? bias[n]! : 0;
      for (let k = 0; k < K; k++) v += x[m * K + k]! * values[n * K + k]!;
      y[m * N + n] = v;
    }
  }
  return { y };
}

/** the spacing of bf16 values at magnitude v (8 significant bits) */
const bf16Ulp = (v: number) => (v === 0 ? 0 : 2 ** (Math.floor(Math.log2(v)) - 7));

const bf16Round = (a: Float32Array) => Float32Array.from(encodeHalf(a, 'bf16'), bf16ToF32);

describe('FP8 weights on the CUDA backend', { skip: SKIP }, () => {
  let backend: CudaBackend;
  before(async () => {
    if (SKIP) return;
    backend = await createCudaBackend();
    console.log(`# ${backend.describe()}`);
  });
  after(async () => {
    if (!SKIP) await backend.close();
  });

  async function matmulOf(x: Float32Array, M: number, K: number, w: Tensor, bias?: Tensor, on: CudaBackend = backend): Promise<Float32Array> {
    on.beginScope();
    try {
      // scale by 1 is exact: the bf16 copy of the (bf16-rounded) data, as an activation holds it
      const xb = on.scale(on.upload(x, [M, K]), 1);
      return (await on.read(on.matmul(xb, w, bias))) as Float32Array;
    } finally {
      on.endScope();
    }
  }

  for (const engine of ['tensor-core', 'cuda-core'] as const) {
    const gemvRows = engine === 'tensor-core' ? 16 : 8;
    it(`matmul of an FP8 matrix: the ${engine} GEMV to ${gemvRows} rows matches the float64 product, more rows the bf16 matmul of the loader's values (to an ulp); with a bias, in views`, async () => {
      const on = await createCudaBackend({ settings: { gemv: { fp8Gemv: engine } } });
      try {
        const r = rng(3);
        const N = 300, K = 1040; // 9 scale columns, the last one partial
        const { src, values } = fp8Source(r, 'w', N, K);
        const w = await on.loadWeight(src, 'keep');
        assert.equal(w.dtype, 'fp8', 'kept FP8');
        // the loader's bf16 values as a plain bf16 weight: what more rows than a GEMV takes multiply
        const plain = await on.loadWeight({ ...src, fp8: undefined }, 'keep');
        assert.equal(plain.dtype, 'bf16');
        const bias = randomF32(r, N, 2);
        const bt = on.upload(bias, [N]);
        for (const M of [1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 64]) {
          const x = bf16Round(randomF32(r, M * K));
          for (const withBias of [false, true]) {
            const label = `M ${M}${withBias ? ' +bias' : ''}`;
            const y = await matmulOf(x, M, K, w, withBias ? bt : undefined, on);
            if (M > gemvRows) {
              // the plain weight may take a bf16 GEMV where the dequantized scratch takes cuBLASLt:
              // f32 sums in another order, so their bf16 may differ by one unit in the last place
              const ref = await matmulOf(x, M, K, plain, withBias ? bt : undefined, on);
              const i = y.findIndex((v, j) => Math.abs(v - ref[j]!) > bf16Ulp(Math.max(Math.abs(v), Math.abs(ref[j]!))));
              assert.equal(i, -1, `${label}: y[${i}] ${y[i]} vs the bf16 weight's ${ref[i]}`);
              continue;
            }
            const want = product(M, N, K, x, values, withBias ? bias : undefined).y;
            for (let i = 0; i < want.length; i++) {
              assert.ok(Math.abs(y[i]! - want[i]!) <= 2e-3 + 1e-2 * Math.abs(want[i]!), `${label}: y[${i}] ${y[i]} vs ${want[i]}`);
            }
          }
        }
        // a row view [100, 220) multiplies those rows with their own scales
        const view = on.rowView(w, 100, 120);
        const x = bf16Round(randomF32(r, 2 * K));
        const yv = await matmulOf(x, 2, K, view, undefined, on);
        const full = product(2, N, K, x, values).y;
        for (let m = 0; m < 2; m++) {
          for (let n = 0; n < 120; n++) {
            const want = full[m * N + 100 + n]!;
            assert.ok(Math.abs(yv[m * 120 + n]! - want) <= 2e-3 + 1e-2 * Math.abs(want), `view: y[${m}, ${n}]`);
          }
        }
        on.free(bt);
        on.free(w);
        on.free(plain);
      } finally {
        await on.close();
      }
    });
  }

  it('the tensor-core FP8 GEMV gives a row of x the same bits alone and among 8 or 16 rows', async () => {
    const r = rng(7);
    const N = 256, K = 4096;
    const { src } = fp8Source(r, 'w', N, K);
    const tc = await createCudaBackend({ settings: { gemv: { fp8Gemv: 'tensor-core' } } });
    try {
      const w = await tc.loadWeight(src, 'keep');
      const x = bf16Round(randomF32(r, 16 * K));
      const y16 = await matmulOf(x, 16, K, w, undefined, tc);
      const y8 = await matmulOf(x.subarray(0, 8 * K), 8, K, w, undefined, tc);
      assert.deepEqual(y8, y16.subarray(0, 8 * N), 'rows 0-7: one tile of 8 rows and two');
      for (const m of [0, 3, 9, 15]) {
        assert.deepEqual(await matmulOf(x.subarray(m * K, (m + 1) * K), 1, K, w, undefined, tc), y16.subarray(m * N, (m + 1) * N), `row ${m} alone`);
      }
      tc.free(w);
    } finally {
      await tc.close();
    }
  });

  it('a packed load of FP8 sources is their rows one after another; with fp8Weights off they load dequantized', async () => {
    const r = rng(4);
    const K = 256;
    const a = fp8Source(r, 'a', 40, K), b = fp8Source(r, 'b', 24, K);
    const packed = await backend.loadConcat([a.src, b.src], 'keep');
    assert.equal(packed.dtype, 'fp8');
    const x = bf16Round(randomF32(r, K));
    const y = await matmulOf(x, 1, K, packed);
    const values = new Float32Array([...a.values, ...b.values]);
    const want = product(1, 64, K, x, values).y;
    for (let i = 0; i < 64; i++) assert.ok(Math.abs(y[i]! - want[i]!) <= 2e-3 + 1e-2 * Math.abs(want[i]!), `packed: y[${i}]`);
    backend.free(packed);
    const plain = await createCudaBackend({ settings: { gemv: { fp8Weights: false } } });
    try {
      const t = await plain.loadWeight(a.src, 'keep');
      assert.equal(t.dtype, 'bf16', 'fp8Weights off: the dequantized values');
    } finally {
      await plain.close();
    }
  });

  it('--quantization fp8: the layers\' matrices kept FP8 give the tokens and logprobs of their values loaded as floats', async (t) => {
    const dir = resolve(import.meta.dirname, '../fixtures/llama');
    const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: ReferenceCase[] };
    const plain = await createCudaBackend({ settings: { gemv: { fp8Weights: false } } });
    try {
      const run = async (b: CudaBackend) => {
        const m = await loadModel(b, dir, { maxModelLen: 512, quantization: 'fp8' });
        const out = [];
        for (const c of ref.cases) {
          const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
          out.push(await e.complete({ promptIds: c.prompt_token_ids, maxTokens: 16, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 1 }));
          await e.close(0);
        }
        return { out, o: (m.model as DecoderModel).weights.layers[0]!.attn.o.dtype };
      };
      const kept = await run(backend), bf16 = await run(plain);
      assert.deepEqual([kept.o, bf16.o], ['fp8', 'f32'], 'FP8 kept; off, the values in the checkpoint\'s dtype (f32 here)');
      // bf16 activations either way; the FP8 GEMV's bf16 outputs against the f32 weights' products:
      // within the bf16 tolerance of the FP8 fixtures
      let worst = 0;
      kept.out.forEach((r, k) => {
        assert.deepEqual(r.tokenIds, bf16.out[k]!.tokenIds, `case ${k} tokens`);
        r.logprobs!.forEach((l, i) => (worst = Math.max(worst, Math.abs(l.logprob - bf16.out[k]!.logprobs![i]!.logprob))));
      });
      t.diagnostic(`max |Δ logprob|: ${worst.toExponential(2)}`);
      assert.ok(worst <= TOLERANCE, `max |Δ logprob| ${worst}`);
    } finally {
      await plain.close();
    }
  });

  const fixtures = existsSync(FIXTURES) ? readdirSync(FIXTURES).filter((d) => existsSync(join(FIXTURES, d, 'reference.json'))).sort() : [];
  for (const name of fixtures) {
    // by default a batched step's rows may take other kernels than a lone row's (the FP8 GEMV at
    // decode rows, the dequantized GEMM with prefill chunks beside them): each run close to
    // transformers; batch-invariant mode (always the dequantized GEMM): batched equal to solo
    for (const invariant of [false, true]) {
      it(`${name}: kept in FP8, close to transformers alone and batched${invariant ? ', batched = solo in batch-invariant mode' : ''}`, async (t) => {
        const dir = join(FIXTURES, name);
        const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: ReferenceCase[] };
        const b = invariant ? await createCudaBackend({ settings: { batchInvariant: true } }) : backend;
        try {
          const m = await loadModel(b, dir, { maxModelLen: 512 });
          const layer = (m.model as DecoderModel).weights.layers[0]!;
          assert.equal(layer.attn.o.dtype, 'fp8', 'o_proj kept FP8');
          const worst = await checkReferenceCases(m, ref.cases, TOLERANCE, undefined, invariant ? 'equal' : 'close');
          t.diagnostic(`max |Δ logprob| on the matched prefix: ${worst.toExponential(2)}`);
        } finally {
          if (invariant) await b.close();
        }
      });
    }
  }
});
