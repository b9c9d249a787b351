// Kernels of the CUDA fused module run on the CPU by the warp simulator (cuda-sim/): add +
// rmsnorm (vector and generic paths) against float64, and the two-pass device argmax (ties to the
// lowest index, -Infinity rows to -1). Their GPU twins are in cuda-fused.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { runAddRmsnormSim, runArgmaxSim } from './cuda-sim/fused-sim.ts';
import { randomF32, rng } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-fused-sim: skipping: ${SKIP}`);


describe('CUDA fused kernels on the warp simulator', { skip: SKIP ?? false }, () => {
  it('k_add_rmsnorm: sum = bf16(a + s b), normed = bf16(sum / rms * (off + w)); 8-wide and scalar paths, several rows', () => {
    const r = rng(41);
    for (const [rows, D, rScale, off] of [[1, 4096, 1, 0], [3, 64, 0.5, 1], [2, 21, 1, 0], [5, 1000, 2, 0]] as const) {
      const a = encodeHalf(randomF32(r, rows * D, 2), 'bf16'), b = encodeHalf(randomF32(r, rows * D, 2), 'bf16');
      const w = encodeHalf(randomF32(r, D), 'bf16');
      const eps = 1e-6;
      const got = runAddRmsnormSim(rows, D, a, b, w, rScale, eps, off);
      const sum = decodeHalf(got.sum, 'bf16'), normed = decodeHalf(got.normed, 'bf16');
      for (let i = 0; i < rows; i++) {
        let ss = 0;
        for (let d = 0; d < D; d++) {
          const want = bf16ToF32(a[i * D + d]!) + rScale * bf16ToF32(b[i * D + d]!);
          const s = sum[i * D + d]!;
          assert.ok(Math.abs(s - want) <= 4e-3 * Math.abs(want) + 1e-6, `rows ${rows} D ${D}: sum[${i}, ${d}] = ${s}, want ${want}`);
          ss += s * s;
        }
        const inv = 1 / Math.sqrt(ss / D + eps);
        for (let d = 0; d < D; d++) {
          const want = sum[i * D + d]! * inv * (off + bf16ToF32(w[d]!));
          const n = normed[i * D + d]!;
          assert.ok(Math.abs(n - want) <= 8e-3 * Math.abs(want) + 1e-5, `rows ${rows} D ${D}: normed[${i}, ${d}] = ${n}, want ${want}`);
        }
      }
    }
  });

  it('k_argmax_part + k_argmax_final: one or many parts, ties to the lowest index, an all -Infinity row gives -1', () => {
    const r = rng(42);
    for (const [R, V] of [[1, 100], [3, 5000], [2, 70001]] as const) {
      const x = randomF32(r, R * V, 10);
      const want = new Int32Array(R);
      for (let i = 0; i < R; i++) {
        // a tie between a late and an early position: the early one wins
        const top = 1000 + i;
        x[i * V + V - 3] = top;
        x[i * V + Math.floor(V / 3)] = top;
        want[i] = Math.floor(V / 3);
      }
      if (R > 1) {
        x.fill(-Infinity, (R - 1) * V, R * V);
        want[R - 1] = -1;
      }
      assert.deepEqual([...runArgmaxSim(R, V, x)], [...want], `R ${R} V ${V}`);
    }
  });
});
