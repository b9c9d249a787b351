// The bulk-streamed one-row GEMV (gemv-bulk-kernels.ts, k_gemvt_m1: rows streamed through a ring of
// shared memory a warp by bulk copies completing on mbarriers, multiplied with mma.sync) on the warp
// simulator, against a float64 product of the same bf16 inputs; and its launch layout. Rings of 1-3
// slots wrapped many times, short last parts, partial last groups, groups split between warps (a
// warp's first and last), K up to its 16384 limit. The simulator poisons a slot when its copy is
// issued and fills it at the first wait, so a slot read before its wait gives NaNs, and one refilled
// before its warp has read it gives NaNs (runSim runs three schedules and requires the same bytes);
// a wait no copy completes aborts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf, f32ToBf16 } from '../../src/backends/common/half.ts';
import { ACT_CODE } from '../../src/backends/cuda/cuda-tensor.ts';
import { GEMVT_MAX_K, GEMVT_SHARED_BYTES, gemvtLayout } from '../../src/backends/cuda/gemv-bulk-kernels.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { runGemvtNormSim, runGemvtSim } from './cuda-sim/gemv-bulk-sim.ts';
import { runGluPackedSim } from './cuda-sim/fused-sim.ts';
import { randomF32, rng } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-gemv-bulk-sim: skipping: ${SKIP}`);

describe('bulk-streamed GEMV layout (gemvtLayout)', () => {
  it('one block an SM over whole 16-row groups, 8 KB units, 3 slots a warp where they fit', () => {
    // the 8B's o projection on the H200: 32 rows a block on 128 of 132 SMs, 256 columns a unit (16 rows of
    // 512 + 16 bytes), 3 slots of 8 warps, then 8 KB of x and 1 KB of partial sums
    assert.deepEqual(gemvtLayout(4096, 4096, 132), { grid: 128, rowsPerBlock: 32, partCols: 256, slots: 3,
      sharedBytes: 8 * 3 * (16 * 528 + 8) + 8192 + 1024 });
    // its down projection: 28 KB of x leave 3 slots of 224 columns
    assert.deepEqual(gemvtLayout(4096, 14336, 132), { grid: 128, rowsPerBlock: 32, partCols: 224, slots: 3,
      sharedBytes: 8 * 3 * (16 * 464 + 8) + 28672 + 1024 });
    // its gate/up with the GLU: 16 outputs a unit are 32 rows, so 128 columns; 112 outputs a block
    assert.deepEqual(gemvtLayout(14336, 4096, 132, true), { grid: 128, rowsPerBlock: 112, partCols: 128, slots: 3,
      sharedBytes: 8 * 3 * (32 * 272 + 8) + 8192 + 2048 });
    // a tiny matrix: one block, one short unit, one slot (no warp has more units)
    assert.deepEqual(gemvtLayout(7, 8, 132), { grid: 1, rowsPerBlock: 16, partCols: 32, slots: 1,
      sharedBytes: 8 * (16 * 80 + 8) + 16 + 1024 });
    // lm_head-sized: 976 rows a block on all 132 SMs
    assert.equal(gemvtLayout(128256, 4096, 132)!.grid, 132);
    for (const [N, K] of [[0, 4096], [8, 4100], [8, 4], [8, GEMVT_MAX_K + 8], [1.5, 4096]]) assert.equal(gemvtLayout(N!, K!, 132), null, `N ${N} K ${K}`);
    assert.equal(gemvtLayout(8, 4096, 1, false, 20000), null, 'fewer than 2 slots of 32 columns a warp beside x');
    assert.equal(gemvtLayout(8, 4096, 1, false, 40000)!.partCols, 32, 'the widest part with 2 slots where 3 do not fit');
  });

  it('every layout fits the 227 KiB of shared memory a block may opt into on sm_90 (with the kernels\' static arrays), for every K and N shape class', () => {
    const SM90_MAX_DYNAMIC = 232448 - 4096; // a block's 227 KiB less the kernels' static arrays (the norm staging's, nvcc 13)
    let checked = 0;
    for (let K = 8; K <= GEMVT_MAX_K; K += K < 1024 ? 8 : 1016) {
      for (const N of [1, 7, 4096, 14336, 128256]) {
        for (const l of [gemvtLayout(N, K, 132), gemvtLayout(N, K, 132, true)]) {
          assert.ok(l, `N ${N} K ${K}`);
          assert.ok(l.sharedBytes <= SM90_MAX_DYNAMIC, `N ${N} K ${K}: ${l.sharedBytes} bytes`);
          assert.ok(l.slots >= 1 && l.partCols % 32 === 0 && l.grid * l.rowsPerBlock >= N && (l.grid - 1) * l.rowsPerBlock < N);
          assert.ok(l.grid === 1 || l.rowsPerBlock % 16 === 0);
          checked++;
        }
      }
    }
    assert.ok(checked > 300, `${checked} layouts`);
    assert.equal(GEMVT_SHARED_BYTES, 232448 - 4096);
  });
});

describe('bulk-streamed GEMV on the warp simulator', { skip: SKIP ?? false }, () => {
  it('k_gemvt_m1: rings wrapped many times, short parts, partial and split groups, K up to 16384, matches float64', () => {
    const r = rng(71);
    const cases: { N: number; K: number; sms: number; budget?: number; part?: number; why: string }[] = [
      { N: 20, K: 1032, sms: 1, budget: 8 * 2 * 1288 + 2064 + 1024, part: 32, why: '2 slots, 8-9 units a warp, a short last part, 4 rows of the second group' },
      { N: 112, K: 64, sms: 1, part: 32, why: '7 groups of 2 parts: warps whose first and last groups are both partial' },
      { N: 50, K: 264, sms: 2, part: 64, why: 'two blocks, the second with 18 rows; parts of 64, 64, 64, 64, 8' },
      { N: 33, K: 520, sms: 3, why: 'a group split between three warps; a block of one row' },
      { N: 7, K: 8, sms: 132, why: 'one unit of one short step, on the last warp' },
      { N: 3, K: 16384, sms: 1, why: 'the largest K: 224 columns a unit, a last part of 32' },
    ];
    for (const c of cases) {
      const l = gemvtLayout(c.N, c.K, c.sms, false, c.budget, c.part)!;
      assert.ok(l, `layout for ${JSON.stringify(c)}`);
      const w = encodeHalf(randomF32(r, c.N * c.K), 'bf16'), x = encodeHalf(randomF32(r, c.K), 'bf16');
      const got = decodeHalf(runGemvtSim(l, c.N, c.K, w, x), 'bf16');
      for (let n = 0; n < c.N; n++) {
        let want = 0;
        for (let k = 0; k < c.K; k++) want += bf16ToF32(x[k]!) * bf16ToF32(w[n * c.K + k]!);
        const y = got[n]!;
        assert.ok(Math.abs(y - want) <= 2e-3 + 8e-3 * Math.abs(want),
          `N=${c.N} K=${c.K} (${c.why}; ${JSON.stringify(l)}): y[${n}] = ${y}, want ${want}`);
      }
    }
  });

  it('k_gemvt_norm_m1: the residual sum as k_add_rmsnorm stores it (block 0), y from the bf16 normed row', () => {
    const r = rng(72);
    for (const c of [{ N: 29, K: 4096, sms: 2, rScale: 1, off: 0 }, { N: 40, K: 520, sms: 3, rScale: 0.5, off: 1 },
      { N: 5, K: 24, sms: 132, rScale: 2, off: 0 }]) {
      const l = gemvtLayout(c.N, c.K, c.sms, false, undefined, 64)!; // parts of 64 columns: many units a warp
      assert.ok(l, `layout for ${JSON.stringify(c)}`);
      const label = `norm N=${c.N} K=${c.K} (${JSON.stringify(l)})`;
      const w = encodeHalf(randomF32(r, c.N * c.K), 'bf16'), nw = encodeHalf(randomF32(r, c.K), 'bf16'), eps = 1e-5;
      const x = encodeHalf(randomF32(r, c.K, 2), 'bf16'), res = encodeHalf(randomF32(r, c.K, 2), 'bf16');
      const got = runGemvtNormSim(l, c.N, c.K, w, x, res, nw, c.rScale, eps, c.off);
      for (let k = 0; k < c.K; k++) {
        const bits = f32ToBf16(Math.fround(bf16ToF32(x[k]!) + Math.fround(c.rScale * bf16ToF32(res[k]!))));
        assert.equal(got.sum[k], bits, `${label}: sum[${k}]`);
      }
      const normed = normedRow(x, res, nw, c.rScale, eps, c.off);
      const y = decodeHalf(got.y, 'bf16');
      for (let n = 0; n < c.N; n++) {
        let want = 0;
        for (let k = 0; k < c.K; k++) want += normed[k]! * bf16ToF32(w[n * c.K + k]!);
        assert.ok(Math.abs(y[n]! - want) <= 4e-3 + 1e-2 * Math.abs(want), `${label}: y[${n}] = ${y[n]}, want ${want}`);
      }
    }
  });

  it('k_gemvt_normglu_m1: a unit\'s 16 gate rows and their up rows on one barrier; the norm twin\'s residual, then the GLU of the sums', () => {
    const r = rng(73);
    for (const c of [{ I: 21, K: 520, sms: 2, rScale: 0.5, off: 1, act: 'silu' }, { I: 9, K: 4096, sms: 4, rScale: 1, off: 0, act: 'gelu_tanh' },
      { I: 3, K: 16, sms: 132, rScale: 2, off: 0, act: 'silu' }, { I: 40, K: 200, sms: 1, rScale: 1, off: 0, act: 'silu' }] as const) {
      // parts of 32 columns: many units a warp, the rings wrap
      const l = gemvtLayout(c.I, c.K, c.sms, true, undefined, 32)!;
      assert.ok(l, `layout for ${JSON.stringify(c)}`);
      const label = `normglu I=${c.I} K=${c.K} ${c.act} (${JSON.stringify(l)})`;
      const w = encodeHalf(randomF32(r, 2 * c.I * c.K), 'bf16'), nw = encodeHalf(randomF32(r, c.K), 'bf16');
      const x = encodeHalf(randomF32(r, c.K, 2), 'bf16'), res = encodeHalf(randomF32(r, c.K, 2), 'bf16');
      const got = runGemvtNormSim(l, c.I, c.K, w, x, res, nw, c.rScale, 1e-5, c.off, ACT_CODE[c.act]!);
      // the norm twin over all 2I rows stores the same residual
      const gu = runGemvtNormSim(gemvtLayout(2 * c.I, c.K, c.sms)!, 2 * c.I, c.K, w, x, res, nw, c.rScale, 1e-5, c.off);
      assert.deepEqual([...got.sum], [...gu.sum], `${label}: the new residual`);
      // the GLU (k_glu_packed on the simulator) of the float64 gate and up sums of the bf16 normed row, rounded to bf16
      const normed = normedRow(x, res, nw, c.rScale, 1e-5, c.off);
      const sums = new Float32Array(2 * c.I);
      for (let n = 0; n < 2 * c.I; n++) {
        let v = 0;
        for (let k = 0; k < c.K; k++) v += normed[k]! * bf16ToF32(w[n * c.K + k]!);
        sums[n] = v;
      }
      const want = decodeHalf(runGluPackedSim(1, c.I, encodeHalf(sums, 'bf16'), ACT_CODE[c.act]!), 'bf16');
      const y = decodeHalf(got.y, 'bf16');
      for (let n = 0; n < c.I; n++) {
        assert.ok(Math.abs(y[n]! - want[n]!) <= 1e-2 + 3e-2 * Math.abs(want[n]!), `${label}: y[${n}] = ${y[n]}, want ${want[n]}`);
      }
    }
  });
});

/** x + rScale r rounded to bf16, rmsnorm'd with weight nw (offset off) and rounded to bf16 again, as the norm twins stage it */
function normedRow(x: Uint16Array, res: Uint16Array, nw: Uint16Array, rScale: number, eps: number, off: number): Float32Array {
  const K = x.length, sum = new Float64Array(K);
  let ss = 0;
  for (let k = 0; k < K; k++) {
    sum[k] = bf16ToF32(f32ToBf16(Math.fround(bf16ToF32(x[k]!) + Math.fround(rScale * bf16ToF32(res[k]!)))));
    ss += sum[k]! * sum[k]!;
  }
  const inv = 1 / Math.sqrt(ss / K + eps);
  return decodeHalf(encodeHalf(Float32Array.from(sum, (v, k) => v * inv * (off + bf16ToF32(nw[k]!))), 'bf16'), 'bf16');
}
