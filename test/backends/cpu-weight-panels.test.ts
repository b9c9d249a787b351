// bf16 matmul weights in panels (native/weight_pack.c, LLMTS_CPU_PACK_WEIGHTS): the layout is
// invisible except in speed. Read back and embedding rows are exact; matmuls agree with the
// row-major weights within the kernels' rounding, on every ISA; each row of y is bit for bit the
// same whatever M is (batch invariance), bias included; every other op refuses a panel tensor.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import type { CpuTensor } from '../../src/backends/cpu/cpu-tensor.ts';
import { assertClose, CPU_ISA_NAMES, forEachCpuIsa, ISA_AVX512_BF16, randomF32, rng, WeightDir } from './helpers.ts';

let packed: CpuBackend;
let rows: CpuBackend;
let files: WeightDir;

before(async () => {
  packed = await createCpuBackend({ settings: { packWeights: 'on' } });
  rows = await createCpuBackend({ settings: { packWeights: 'off' } });
  files = new WeightDir();
});
after(async () => {
  await packed.close();
  await rows.close();
  files.cleanup();
});

// N around panel edges (16), K around vector and block edges (pairs of 16, 512-pair blocks)
const SHAPES: [number, number][] = [[1, 2], [15, 30], [16, 32], [17, 34], [40, 96], [33, 1026], [130, 2048]];

describe('bf16 weights in panels', () => {
  it('load as panels only when asked, and read back exactly', async () => {
    const r = rng(7);
    for (const [N, K] of SHAPES) {
      const src = files.write(randomF32(r, N * K), 'bf16', [N, K]);
      const p = (await packed.loadWeight(src, 'keep', 'matmul')) as CpuTensor;
      const q = (await rows.loadWeight(src, 'keep', 'matmul')) as CpuTensor;
      assert.equal(p.layout, 'p16', `[${N}, ${K}]`);
      assert.equal(q.layout, 'rows');
      assert.deepEqual(p.shape, [N, K]);
      assert.equal(p.dtype, 'bf16');
      assertClose(`read [${N}, ${K}]`, await packed.read(p), await rows.read(q), { atol: 0, rtol: 0 });
      packed.free(p);
      rows.free(q);
    }
  });

  it('stay row-major where panels do not apply: f32, an odd K, a vector, as f32, not for matmul', async () => {
    const r = rng(8);
    const cases: [string, ReturnType<WeightDir['write']>, 'keep' | 'f32'][] = [
      ['f32', files.write(randomF32(r, 64), 'f32', [4, 16]), 'keep'],
      ['odd K', files.write(randomF32(r, 60), 'bf16', [4, 15]), 'keep'],
      ['vector', files.write(randomF32(r, 16), 'bf16', [16]), 'keep'],
      ['as f32', files.write(randomF32(r, 64), 'bf16', [4, 16]), 'f32'],
    ];
    const plain = await packed.loadWeight(files.write(randomF32(r, 64), 'bf16', [4, 16]), 'keep');
    assert.equal((plain as CpuTensor).layout, 'rows', 'not for matmul');
    packed.free(plain);
    for (const [what, src, as] of cases) {
      const t = (await packed.loadWeight(src, as, 'matmul')) as CpuTensor;
      assert.equal(t.layout, 'rows', what);
      packed.free(t);
    }
  });

  it('embedding rows of a panel table are exact', async () => {
    const r = rng(9);
    const [V, D] = [37, 66];
    const src = files.write(randomF32(r, V * D), 'bf16', [V, D]);
    const p = await packed.loadWeight(src, 'keep', 'matmul');
    const q = await rows.loadWeight(src, 'keep', 'matmul');
    const ids = Int32Array.from({ length: 50 }, (_, i) => (i * 7) % V);
    const got = await packed.read(packed.embedding(p, packed.upload(ids, [ids.length]), 0.5));
    const want = await rows.read(rows.embedding(q, rows.upload(ids, [ids.length]), 0.5));
    assertClose('embedding', got, want, { atol: 0, rtol: 0 });
    packed.free(p);
    rows.free(q);
  });

  it('matmul: close to the row-major weights and batch invariant, every ISA, bias or none', async () => {
    const r = rng(10);
    for (const [N, K] of [[17, 34], [40, 96], [33, 1026], [130, 2048]] as [number, number][]) {
      const src = files.write(randomF32(r, N * K, 0.5), 'bf16', [N, K]);
      const p = await packed.loadWeight(src, 'keep', 'matmul');
      const q = await rows.loadWeight(src, 'keep', 'matmul');
      const bias = randomF32(r, N);
      const Mmax = 40; // past ROWS_MAX_M (16) and past one 6-row prefill tile's multiples
      const x = randomF32(r, Mmax * K);
      await forEachCpuIsa(packed, async (isa, parallel) => {
        const label = `[${N}, ${K}] ${CPU_ISA_NAMES[isa]}${parallel ? ' (team)' : ''}`;
        for (const b of [undefined, bias]) {
          const bp = b && packed.upload(b, [N]);
          const solo: Float32Array[] = [];
          for (let m = 0; m < Mmax; m++) {
            const xm = packed.upload(x.subarray(m * K, (m + 1) * K), [1, K]);
            solo.push((await packed.read(packed.matmul(xm, p, bp))) as Float32Array);
          }
          for (const M of [2, 3, 5, 16, 17, 23, 40]) {
            const y = (await packed.read(packed.matmul(packed.upload(x.subarray(0, M * K), [M, K]), p, bp))) as Float32Array;
            for (let m = 0; m < M; m++) {
              assert.deepEqual(y.subarray(m * N, (m + 1) * N), solo[m], `${label} M=${M} row ${m} ${b ? 'bias' : ''}`);
            }
          }
          // the row-major kernels of the same ISA: x rounded to bf16 by both on AVX512-BF16
          await rows.sync();
          const bq = b && rows.upload(b, [N]);
          const want = await rows.read(rows.matmul(rows.upload(x, [Mmax, K]), q, bq));
          const tol = isa === ISA_AVX512_BF16 ? { atol: 1e-4 * Math.sqrt(K), rtol: 1e-5 } : { atol: 1e-5 * Math.sqrt(K), rtol: 1e-5 };
          assertClose(`${label} vs rows`, Float32Array.from(solo.flatMap((s) => [...s])), want, tol);
        }
      });
      packed.free(p);
      rows.free(q);
    }
  });

  it('other ops refuse a panel tensor by name', async () => {
    const src = files.write(randomF32(rng(11), 64), 'bf16', [4, 16]);
    const p = await packed.loadWeight(src, 'keep', 'matmul');
    assert.throws(() => packed.reshape(p, [16, 4]), /reshape: t bf16\[4, 16\] is a matmul weight stored in panels/);
    const x = packed.upload(new Float32Array(64), [4, 16]);
    assert.throws(() => packed.matmul(x, x, p), /matmul: bias .* panels|matmul/);
    packed.free(p);
  });
});
