// The CUDA GEMV kernels (gemv-kernels.ts), run on the CPU by the warp simulator (cuda-sim/),
// against a float64 product of the same bf16 inputs; their GPU twin is cuda-ops.test.ts' GEMV
// test. Every kernel, 1-8 warps per output row, ragged K (not a multiple of a pass) and N (not a
// multiple of the rows a block takes), each kernel at fewer rows than it is built for.
// Tolerance as cuda-ops.test.ts' GEMMs: |sim - ref| <= 2e-3 + 8e-3 |ref| (bf16 output).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf, f32ToBf16 } from '../../src/backends/common/half.ts';
import { ACT_CODE } from '../../src/backends/cuda/cuda-tensor.ts';
import { GEMV_KERNEL_NAMES, type GemvKernelName } from '../../src/backends/cuda/gemv-kernels.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { runGemvNormSim, runGemvSim } from './cuda-sim/gemv-sim.ts';
import { randomF32, rng } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-gemv-sim: skipping: ${SKIP}`);

const MMAX: Record<GemvKernelName, number> = { k_gemv_m1_u16: 1, k_gemv_m2_u16: 2, k_gemv_m4_u8: 4, k_gemv_m8_u4: 8 };

describe('CUDA GEMV kernels on the warp simulator', { skip: SKIP ?? false }, () => {
  it(`${GEMV_KERNEL_NAMES.join(', ')}: rows 1..MMAX, 1-8 warps per row, ragged K and N`, () => {
    const r = rng(31);
    let cases = 0;
    for (const kernel of GEMV_KERNEL_NAMES) {
      for (const [M, N, K, wpr] of [[1, 13, 8, 1], [1, 21, 1032, 2], [2, 9, 4104, 8], [3, 17, 264, 4], [4, 5, 2056, 1],
        [5, 11, 520, 2], [8, 7, 136, 1], [MMAX[kernel], 19, 776, 4]] as [number, number, number, number][]) {
        if (M > MMAX[kernel]) continue;
        const w = encodeHalf(randomF32(r, N * K), 'bf16'), x = encodeHalf(randomF32(r, M * K), 'bf16');
        const got = decodeHalf(runGemvSim(kernel, wpr, M, N, K, w, x), 'bf16');
        for (let m = 0; m < M; m++) {
          for (let n = 0; n < N; n++) {
            let want = 0;
            for (let k = 0; k < K; k++) want += bf16ToF32(x[m * K + k]!) * bf16ToF32(w[n * K + k]!);
            const y = got[m * N + n]!;
            assert.ok(Math.abs(y - want) <= 2e-3 + 8e-3 * Math.abs(want),
              `${kernel} M=${M} N=${N} K=${K} warps/row ${wpr}: y[${m}, ${n}] = ${y}, want ${want}`);
          }
        }
        cases++;
      }
    }
    assert.ok(cases >= 12, `${cases} cases ran`);
  });

  it('the add + rmsnorm twins (addRmsnormMatmul): y = rmsnorm(x + s r) · w^T and the new residual, 1-8 rows, 1-8 warps a row', () => {
    const r = rng(33);
    for (const kernel of GEMV_KERNEL_NAMES) {
      for (const [M, N, K, wpr, rScale, off] of [[1, 13, 4096, 8, 1, 0], [MMAX[kernel], 9, 520, 1, 0.5, 1],
        [Math.min(3, MMAX[kernel]), 21, 1032, 2, 1, 0]] as [number, number, number, number, number, number][]) {
        const w = encodeHalf(randomF32(r, N * K), 'bf16'), nw = encodeHalf(randomF32(r, K), 'bf16'), eps = 1e-5;
        const x = encodeHalf(randomF32(r, M * K, 2), 'bf16'), res = encodeHalf(randomF32(r, M * K, 2), 'bf16');
        const got = runGemvNormSim(kernel, wpr, M, N, K, w, x, res, nw, rScale, eps, off);
        const y = decodeHalf(got.y, 'bf16');
        for (let m = 0; m < M; m++) {
          const sum = new Float64Array(K);
          let ss = 0;
          for (let k = 0; k < K; k++) {
            const bits = f32ToBf16(Math.fround(bf16ToF32(x[m * K + k]!) + Math.fround(rScale * bf16ToF32(res[m * K + k]!))));
            assert.equal(got.sum[m * K + k], bits, `${kernel} M=${M} K=${K}: sum[${m}, ${k}]`);
            sum[k] = bf16ToF32(bits);
            ss += sum[k]! * sum[k]!;
          }
          const inv = 1 / Math.sqrt(ss / K + eps);
          // the normed row as k_add_rmsnorm stores it: rounded to bf16 (which the GEMV then reads)
          const normed = decodeHalf(encodeHalf(Float32Array.from(sum, (v, k) => v * inv * (off + bf16ToF32(nw[k]!))), 'bf16'), 'bf16');
          for (let n = 0; n < N; n++) {
            let want = 0;
            for (let k = 0; k < K; k++) want += normed[k]! * bf16ToF32(w[n * K + k]!);
            const v = y[m * N + n]!;
            assert.ok(Math.abs(v - want) <= 4e-3 + 1e-2 * Math.abs(want), `${kernel} M=${M} N=${N} K=${K} warps/row ${wpr}: y[${m}, ${n}] = ${v}, want ${want}`);
          }
        }
      }
    }
  });

  it('the GLU twins (gluMatmul: x = bf16(act(gate) * up) from packed gate/up rows) equal the unfused GEMV on the glu output, bit for bit', () => {
    const r = rng(32);
    const acts: [string, number, (x: number) => number][] = [
      ['silu', ACT_CODE.silu!, (x) => x / (1 + Math.exp(-x))],
      ['gelu_tanh', ACT_CODE.gelu_tanh!, (x) => 0.5 * x * (1 + Math.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))],
    ];
    for (const kernel of GEMV_KERNEL_NAMES) {
      for (const [M, N, K, wpr] of [[1, 11, 1032, 2], [MMAX[kernel], 9, 520, 1], [Math.min(3, MMAX[kernel]), 13, 2056, 4]] as [number, number, number, number][]) {
        for (const [name, code, act] of acts) {
          const w = encodeHalf(randomF32(r, N * K), 'bf16'), gu = encodeHalf(randomF32(r, M * 2 * K, 3), 'bf16');
          // k_glu_packed's output: each element rounded to bf16 (in float32, as the kernel does)
          const x = new Uint16Array(M * K);
          for (let m = 0; m < M; m++) {
            for (let k = 0; k < K; k++) {
              const v = Math.fround(Math.fround(act(bf16ToF32(gu[m * 2 * K + k]!))) * bf16ToF32(gu[m * 2 * K + K + k]!));
              x[m * K + k] = f32ToBf16(v);
            }
          }
          const fused = runGemvSim(kernel, wpr, M, N, K, w, gu, code);
          const plain = runGemvSim(kernel, wpr, M, N, K, w, x);
          let differ = 0;
          for (let i = 0; i < fused.length; i++) differ += fused[i] !== plain[i] ? 1 : 0;
          // the activation's float32 maths may round a few glu values differently from float64
          assert.ok(differ <= fused.length / 20, `${kernel} ${name} M=${M} N=${N} K=${K}: ${differ} of ${fused.length} outputs differ`);
          const a = decodeHalf(fused, 'bf16'), b = decodeHalf(plain, 'bf16');
          for (let i = 0; i < a.length; i++) {
            assert.ok(Math.abs(a[i]! - b[i]!) <= 2e-3 + 8e-3 * Math.abs(b[i]!), `${kernel} ${name}: y[${i}] = ${a[i]}, unfused ${b[i]}`);
          }
        }
      }
    }
  });
});
