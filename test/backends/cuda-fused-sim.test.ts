// Kernels of the CUDA fused module run on the CPU by the warp simulator (cuda-sim/): add +
// rmsnorm (vector and generic paths) against float64, and the two-pass device argmax (ties to the
// lowest index, -Infinity rows to -1). Their GPU twins are in cuda-fused.test.ts. Also the fused
// GEMV paths (gluMatmul, addRmsnormMatmul: gemv-kernels.ts' persistent twins, launched as
// gemvFusedChoice says) against the two kernels they replace.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { ACT_CODE } from '../../src/backends/cuda/cuda-tensor.ts';
import { gemvFusedChoice, gemvNormGluChoice, gemvNormRopeChoice } from '../../src/backends/cuda/gemv-kernels.ts';
import { CUDA_DEFAULTS } from '../../src/backends/cuda/cuda-settings.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { type RopeSimCall, runAddRmsnormSim, runArgmaxSim, runGluPackedSim, runRopeQkvSim } from './cuda-sim/fused-sim.ts';
import { runGemvLaunchSim, runGemvNormGluLaunchSim, runGemvNormLaunchSim, runGemvNormRopeLaunchSim } from './cuda-sim/gemv-sim.ts';
import { randomF32, rng } from './helpers.ts';

/** resident blocks an SM of the fused persistent launches, as the backend's default settings have them */
const BPS = CUDA_DEFAULTS.gemv.fusedBlocksPerSm;

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
  it('the fused GEMV launches (gemvFusedChoice) give what their two unfused kernels give: k_glu_packed / k_add_rmsnorm, then the GEMV', () => {
    const r = rng(43);
    // SMs 1-2: the persistent blocks loop over several row groups; K 4104 = 4096 + 8 (a ragged pass)
    for (const [T, K, N, sms] of [[1, 4104, 37, 1], [3, 520, 29, 2], [8, 3072, 11, 1], [5, 24, 19, 2]] as const) {
      const f = gemvFusedChoice(T, N, K, BPS)!;
      assert.ok(f, `T=${T} K=${K} fits shared memory`);
      const w = encodeHalf(randomF32(r, N * K), 'bf16');
      for (const act of ['silu', 'gelu_tanh'] as const) {
        const gu = encodeHalf(randomF32(r, T * 2 * K, 3), 'bf16');
        const fused = runGemvLaunchSim({ choice: f.choice, smCount: sms, kernel: f.glu, sharedBytes: f.sharedBytes }, T, N, K, w, gu, ACT_CODE[act]!);
        const h = runGluPackedSim(T, K, gu, ACT_CODE[act]!);
        const plain = runGemvLaunchSim({ choice: f.choice, smCount: sms }, T, N, K, w, h);
        // the same activation maths on the same bits: the same bf16 glu, so the same products
        assert.deepEqual([...fused], [...plain], `gluMatmul T=${T} K=${K} N=${N} ${act}`);
      }
      const x = encodeHalf(randomF32(r, T * K, 2), 'bf16'), res = encodeHalf(randomF32(r, T * K, 2), 'bf16');
      const nw = encodeHalf(randomF32(r, K), 'bf16');
      const got = runGemvNormLaunchSim({ choice: f.choice, smCount: sms, kernel: f.norm, sharedBytes: f.sharedBytes }, T, N, K, w, x, res, nw,
        0.5, 1e-5, 1);
      const { sum, normed } = runAddRmsnormSim(T, K, x, res, nw, 0.5, 1e-5, 1);
      assert.deepEqual([...got.sum], [...sum], `addRmsnormMatmul T=${T} K=${K}: the new residual`);
      // the sum of squares is reduced in another order (another 1 / rms in its last bit, at most
      // a rare normed value one bf16 step off): close, not bit-equal
      const want = decodeHalf(runGemvLaunchSim({ choice: f.choice, smCount: sms }, T, N, K, w, normed), 'bf16');
      const y = decodeHalf(got.y, 'bf16');
      for (let i = 0; i < y.length; i++) {
        assert.ok(Math.abs(y[i]! - want[i]!) <= 2e-3 + 8e-3 * Math.abs(want[i]!), `addRmsnormMatmul T=${T} K=${K} N=${N}: y[${i}] = ${y[i]}, unfused ${want[i]}`);
      }
    }
  });

  it('the norm-GLU launch (gemvNormGluChoice: k_gemvp_normglu_*) gives what the add + rmsnorm GEMV and k_glu_packed give, bit for bit', () => {
    const r = rng(44);
    // the launch takes twice the warps a row of the norm twin takes, half on the gate row and half
    // on the up row, each summed as the norm twin sums its rows; SMs 1-2 make its blocks loop
    for (const [T, K, I, sms] of [[1, 4104, 37, 1], [1, 520, 64, 2], [2, 1032, 19, 2], [8, 3072, 11, 1], [3, 24, 9, 1]] as const) {
      const f = gemvNormGluChoice(T, I, K, BPS)!;
      const plainChoice = gemvFusedChoice(T, 2 * I, K, BPS)!;
      assert.equal(f.choice.warpsPerRow, Math.min(8, 2 * plainChoice.choice.warpsPerRow));
      const w = encodeHalf(randomF32(r, 2 * I * K), 'bf16');
      const x = encodeHalf(randomF32(r, T * K, 2), 'bf16'), res = encodeHalf(randomF32(r, T * K, 2), 'bf16');
      const nw = encodeHalf(randomF32(r, K), 'bf16');
      for (const act of ['silu', 'gelu_tanh'] as const) {
        const label = `T=${T} K=${K} I=${I} ${act} on ${sms} SMs`;
        const got = runGemvNormGluLaunchSim({ choice: f.choice, smCount: sms, kernel: f.kernel, sharedBytes: f.sharedBytes }, T, I, K, w, x, res,
          nw, 0.5, 1e-5, 1, ACT_CODE[act]!);
        // the unfused pair at the same split of each weight row (warps per row: half the launch's)
        const half = { ...f.choice, warpsPerRow: f.choice.warpsPerRow / 2 };
        const gu = runGemvNormLaunchSim({ choice: half, smCount: sms, kernel: plainChoice.norm, sharedBytes: f.sharedBytes }, T, 2 * I, K, w, x,
          res, nw, 0.5, 1e-5, 1);
        assert.deepEqual([...got.sum], [...gu.sum], `${label}: the new residual`);
        assert.deepEqual([...got.y], [...runGluPackedSim(T, I, gu.y, ACT_CODE[act]!)], `${label}: the GLU`);
      }
    }
  });

  it('the norm-rope launch (gemvNormRopeChoice: k_gemvp_normrope_*) gives what the add + rmsnorm GEMV and k_rope_qkv give, bit for bit', () => {
    const r = rng(45);
    // full and partial rotary, one invFreq row or one per token, MHA and GQA; slots -1 (skipped) and
    // past the pool (error 2) in the last case
    const cases: [string, number, number, number, number, number, number, boolean, number[], number][] = [
      ['GQA 2, full rotary', 1, 4, 2, 16, 8, 1032, false, [5], 1],
      ['partial rotary (12 of 24 dims)', 1, 2, 1, 24, 6, 64, false, [3], 2],
      ['two tokens, per-token invFreq', 2, 4, 1, 16, 8, 520, true, [1, 6], 1],
      ['MHA, a skipped slot and one past the pool', 3, 2, 2, 8, 4, 24, false, [-1, 9, 2], 2],
    ];
    for (const [label, T, H, KVH, D, half, K, perToken, slots, sms] of cases) {
      const rows = (H + 2 * KVH) * D;
      const f = gemvNormRopeChoice(T, rows, K, BPS)!;
      const plain = gemvFusedChoice(T, rows, K, BPS)!;
      const numSlots = 8;
      const call: RopeSimCall = {
        T, H, KVH, D, half, invStride: perToken ? half : 0, numSlots, scaling: 0.9,
        pos: Int32Array.from({ length: T }, (_, t) => 3 + 17 * t), invFreq: randomF32(r, (perToken ? T : 1) * half).map(Math.abs),
        slots: Int32Array.from(slots), kpool: encodeHalf(randomF32(r, numSlots * KVH * D), 'bf16'),
        vpool: encodeHalf(randomF32(r, numSlots * KVH * D), 'bf16'),
      };
      const w = encodeHalf(randomF32(r, rows * K), 'bf16');
      const x = encodeHalf(randomF32(r, T * K, 2), 'bf16'), res = encodeHalf(randomF32(r, T * K, 2), 'bf16');
      const nw = encodeHalf(randomF32(r, K), 'bf16');
      const got = runGemvNormRopeLaunchSim({ choice: f.choice, smCount: sms, kernel: f.kernel, sharedBytes: f.sharedBytes }, call, K, w, x, res, nw,
        1, 1e-5, 0);
      const qkv = runGemvNormLaunchSim({ choice: { ...f.choice, warpsPerRow: f.choice.warpsPerRow / 2 }, smCount: sms, kernel: plain.norm,
        sharedBytes: f.sharedBytes }, T, rows, K, w, x, res, nw, 1, 1e-5, 0);
      const want = runRopeQkvSim(call, qkv.y);
      assert.deepEqual([...got.sum], [...qkv.sum], `${label}: the new residual`);
      assert.deepEqual([...got.q], [...want.q], `${label}: q`);
      assert.deepEqual([...got.kpool], [...want.kpool], `${label}: the k pool`);
      assert.deepEqual([...got.vpool], [...want.vpool], `${label}: the v pool`);
      assert.deepEqual([...got.err], [...want.err], `${label}: the error word`);
      if (slots.includes(9)) assert.equal(got.err[0], 2, `${label}: a slot past the pool reports error 2`);
    }
  });
});
