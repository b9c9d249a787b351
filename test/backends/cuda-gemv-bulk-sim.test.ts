// The bulk-streamed one-row GEMV (gemv-bulk-kernels.ts, k_gemvt_m1: rows streamed through a ring of
// shared memory by bulk copies completing on mbarriers) on the warp simulator, against a float64
// product of the same bf16 inputs; and its launch layout. Rings of 2-3 stages wrapped many times,
// partial last chunks, odd rows a chunk, K up to its 16384 limit. The simulator poisons a stage
// when its copy is issued and fills it at the first wait, so a stage read before its wait gives
// NaNs, and one refilled while other warps still read it gives NaNs when warp 0 runs ahead (runSim
// runs both schedules and requires the same bytes); a wait no copy completes aborts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf, f32ToBf16 } from '../../src/backends/common/half.ts';
import { ACT_CODE } from '../../src/backends/cuda/cuda-tensor.ts';
import { GEMVT_MAX_K, GEMVT_SHARED_BYTES, gemvtLayout, gemvtNormLayout } from '../../src/backends/cuda/gemv-bulk-kernels.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { runGemvtNormSim, runGemvtSim } from './cuda-sim/gemv-bulk-sim.ts';
import { runGluPackedSim } from './cuda-sim/fused-sim.ts';
import { randomF32, rng } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-gemv-bulk-sim: skipping: ${SKIP}`);

describe('bulk-streamed GEMV layout (gemvtLayout)', () => {
  it('one block an SM over contiguous rows, ~16 KB chunks of whole rows, as many stages as 200 KiB holds', () => {
    // the 8B's o projection on the H200: 2 rows a chunk, 12 stages, 32 rows a block on 128 of 132 SMs
    assert.deepEqual(gemvtLayout(4096, 4096, 132), { grid: 128, rowsPerBlock: 32, rowsPerChunk: 2, stages: 12, sharedBytes: 12 * 16384 + 96 });
    // its down projection: a 28 KB row a chunk, 7 stages
    assert.deepEqual(gemvtLayout(4096, 14336, 132), { grid: 128, rowsPerBlock: 32, rowsPerChunk: 1, stages: 7, sharedBytes: 7 * 28672 + 56 });
    // a row a block: a chunk of that row, 2 stages (no more than the block's chunks, but a ring)
    assert.deepEqual(gemvtLayout(7, 8, 132), { grid: 7, rowsPerBlock: 1, rowsPerChunk: 1, stages: 2, sharedBytes: 2 * 16 + 16 });
    // lm_head-sized: 972 rows a block, 2 rows a chunk, 12 stages
    assert.equal(gemvtLayout(128256, 4096, 132)!.stages, 12);
    for (const [N, K] of [[0, 4096], [8, 4100], [8, 4], [8, GEMVT_MAX_K + 8], [1.5, 4096]]) assert.equal(gemvtLayout(N!, K!, 132), null, `N ${N} K ${K}`);
    assert.equal(gemvtLayout(8, 4096, 1, 16384), null, 'a ring of fewer than 2 chunks (2 rows of 8 KB a chunk)');
  });

  it('every layout fits the 227 KiB of shared memory a block may opt into on sm_90 (with the kernels\' static arrays), for every K and N shape class', () => {
    const SM90_MAX_DYNAMIC = 232448 - 4096; // a block's 227 KiB less the kernels' static arrays (2 KiB of sums, nvcc 13)
    let checked = 0;
    for (let K = 8; K <= GEMVT_MAX_K; K += K < 1024 ? 8 : 1016) {
      for (const N of [1, 7, 4096, 14336, 128256]) {
        for (const l of [gemvtLayout(N, K, 132), gemvtNormLayout(N, K, 132), gemvtNormLayout(N, K, 132, undefined, undefined, 2)]) {
          if (!l) continue;
          assert.ok(l.sharedBytes <= SM90_MAX_DYNAMIC, `N ${N} K ${K}: ${l.sharedBytes} bytes`);
          assert.ok(l.stages >= 2 && l.rowsPerChunk >= 1 && l.grid * l.rowsPerBlock >= N && (l.grid - 1) * l.rowsPerBlock < N);
          checked++;
        }
      }
    }
    assert.ok(checked > 300, `${checked} layouts`);
    assert.ok(gemvtNormLayout(4096, GEMVT_MAX_K, 132, undefined, undefined, 2), 'the GLU twin at the largest K');
  });

  it('the norm twin: the ring less the normed row, which follows the barriers at a 16-byte boundary', () => {
    // the 8B's q/k/v (6144 rows, K 4096): 47 rows a block on 131 SMs; 192 KiB of ring is 12 chunks of 16 KB; 12 barriers; 8 KB of x
    assert.deepEqual(gemvtNormLayout(6144, 4096, 132), { grid: 131, rowsPerBlock: 47, rowsPerChunk: 2, stages: 12,
      sharedBytes: 12 * 16384 + 12 * 8 + 8192 });
    // an odd stage count rounds the barriers up to an even one
    const l = gemvtNormLayout(50, 264, 2, 3 * 1056 + 528, 1100)!;
    assert.equal(l.stages, 3);
    assert.equal(l.sharedBytes, 3 * 1056 + 4 * 8 + 528);
  });
});

describe('bulk-streamed GEMV on the warp simulator', { skip: SKIP ?? false }, () => {
  it('k_gemvt_m1: rings wrapped many times, partial and odd chunks, K up to 16384, matches float64', () => {
    const r = rng(71);
    const cases: { N: number; K: number; sms: number; ring: number; chunk: number }[] = [
      { N: 50, K: 264, sms: 2, ring: 3 * 1056, chunk: 1100 },   // 2 rows a chunk, 3 stages, 13 chunks a block (last of 1 row)
      { N: 9, K: 4104, sms: 4, ring: 2 * 8208, chunk: 16384 },  // 1 row a chunk, 2 stages; 3 rows a block
      { N: 7, K: 8, sms: 132, ring: GEMVT_SHARED_BYTES, chunk: 16384 }, // a row a block, more blocks than rows
      { N: 3, K: 16384, sms: 1, ring: 2 * 32768, chunk: 32768 }, // every x register of a thread in use
      { N: 33, K: 520, sms: 3, ring: 2 * 3120, chunk: 3120 },   // 3 rows a chunk (odd), 2 stages, 11 rows a block
    ];
    for (const c of cases) {
      const l = gemvtLayout(c.N, c.K, c.sms, c.ring, c.chunk)!;
      assert.ok(l, `layout for ${JSON.stringify(c)}`);
      const w = encodeHalf(randomF32(r, c.N * c.K), 'bf16'), x = encodeHalf(randomF32(r, c.K), 'bf16');
      const got = decodeHalf(runGemvtSim(l, c.N, c.K, w, x), 'bf16');
      for (let n = 0; n < c.N; n++) {
        let want = 0;
        for (let k = 0; k < c.K; k++) want += bf16ToF32(x[k]!) * bf16ToF32(w[n * c.K + k]!);
        const y = got[n]!;
        assert.ok(Math.abs(y - want) <= 2e-3 + 8e-3 * Math.abs(want),
          `N=${c.N} K=${c.K} (${l.rowsPerChunk} rows a chunk, ${l.stages} stages, ${l.rowsPerBlock} rows a block): y[${n}] = ${y}, want ${want}`);
      }
    }
  });

  it('k_gemvt_norm_m1: the residual sum as k_add_rmsnorm stores it (block 0), y from the bf16 normed row', () => {
    const r = rng(72);
    for (const c of [{ N: 29, K: 4096, sms: 2, rScale: 1, off: 0 }, { N: 40, K: 520, sms: 3, rScale: 0.5, off: 1 },
      { N: 5, K: 24, sms: 132, rScale: 2, off: 0 }]) {
      const l = gemvtNormLayout(c.N, c.K, c.sms, 4 * 2 * c.K * 2 + c.K * 2, 2 * c.K * 2)!; // 2 rows a chunk, 4 stages
      assert.ok(l, `layout for ${JSON.stringify(c)}`);
      const label = `norm N=${c.N} K=${c.K} (${l.rowsPerChunk} rows a chunk, ${l.stages} stages, ${l.rowsPerBlock} rows a block)`;
      const w = encodeHalf(randomF32(r, c.N * c.K), 'bf16'), nw = encodeHalf(randomF32(r, c.K), 'bf16'), eps = 1e-5;
      const x = encodeHalf(randomF32(r, c.K, 2), 'bf16'), res = encodeHalf(randomF32(r, c.K, 2), 'bf16');
      const got = runGemvtNormSim(l, c.N, c.K, w, x, res, nw, c.rScale, eps, c.off);
      const sum = new Float64Array(c.K);
      let ss = 0;
      for (let k = 0; k < c.K; k++) {
        const bits = f32ToBf16(Math.fround(bf16ToF32(x[k]!) + Math.fround(c.rScale * bf16ToF32(res[k]!))));
        assert.equal(got.sum[k], bits, `${label}: sum[${k}]`);
        sum[k] = bf16ToF32(bits);
        ss += sum[k]! * sum[k]!;
      }
      const inv = 1 / Math.sqrt(ss / c.K + eps);
      const normed = decodeHalf(encodeHalf(Float32Array.from(sum, (v, k) => v * inv * (c.off + bf16ToF32(nw[k]!))), 'bf16'), 'bf16');
      const y = decodeHalf(got.y, 'bf16');
      for (let n = 0; n < c.N; n++) {
        let want = 0;
        for (let k = 0; k < c.K; k++) want += normed[k]! * bf16ToF32(w[n * c.K + k]!);
        assert.ok(Math.abs(y[n]! - want) <= 4e-3 + 1e-2 * Math.abs(want), `${label}: y[${n}] = ${y[n]}, want ${want}`);
      }
    }
  });

  it('k_gemvt_normglu_m1: a chunk\'s gate and up rows as two copies on one barrier; the norm twin\'s residual and sums, then the GLU, bit for bit', () => {
    const r = rng(73);
    for (const c of [{ I: 21, K: 520, sms: 2, rScale: 0.5, off: 1, act: 'silu' }, { I: 9, K: 4096, sms: 4, rScale: 1, off: 0, act: 'gelu_tanh' },
      { I: 3, K: 16, sms: 132, rScale: 2, off: 0, act: 'silu' }] as const) {
      // 2 outputs a chunk (4 weight rows), 3 stages: the ring wraps
      const l = gemvtNormLayout(c.I, c.K, c.sms, 3 * 2 * 2 * c.K * 2 + c.K * 2, 2 * 2 * c.K * 2, 2)!;
      assert.ok(l, `layout for ${JSON.stringify(c)}`);
      const label = `normglu I=${c.I} K=${c.K} ${c.act} (${l.rowsPerChunk} outputs a chunk, ${l.stages} stages, ${l.rowsPerBlock} a block)`;
      const w = encodeHalf(randomF32(r, 2 * c.I * c.K), 'bf16'), nw = encodeHalf(randomF32(r, c.K), 'bf16');
      const x = encodeHalf(randomF32(r, c.K, 2), 'bf16'), res = encodeHalf(randomF32(r, c.K, 2), 'bf16');
      const got = runGemvtNormSim(l, c.I, c.K, w, x, res, nw, c.rScale, 1e-5, c.off, ACT_CODE[c.act]!);
      // the norm twin over all 2I rows gives each row's bf16 sum in the same order; then k_glu_packed
      const gu = runGemvtNormSim(gemvtNormLayout(2 * c.I, c.K, c.sms)!, 2 * c.I, c.K, w, x, res, nw, c.rScale, 1e-5, c.off);
      assert.deepEqual([...got.sum], [...gu.sum], `${label}: the new residual`);
      assert.deepEqual([...got.y], [...runGluPackedSim(1, c.I, gu.y, ACT_CODE[c.act]!)], `${label}: the GLU`);
    }
  });
});
