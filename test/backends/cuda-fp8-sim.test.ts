// The CUDA FP8 weight kernels (fp8-kernels.ts), run on the CPU by the warp simulator (cuda-sim/):
// k_fp8_dequant gives the checkpoint loader's bf16 values bit for bit (fp8-checkpoint.ts
// dequantizeFp8, rounded to bf16), every e4m3 byte included; the FP8 GEMV matches a float64
// product of the same e4m3 values, scales and bf16 x within the bf16 GEMMs' tolerance
// (|sim - ref| <= 2e-3 + 8e-3 |ref|), at every row count, ragged N and K (not a multiple of the
// columns a scale covers), scales of 16, 32 and 128 columns and one a row, the launch
// gemvFp8Choice picks and every other warps-a-row count, with a bias and an f32 output; so does
// the tensor-core GEMV to 16 rows (scales of 64 columns and more), which gives a row of x the same
// bits whatever rows share its launch. Scales differ by row and column
// block by up to 200x, so a scale taken from the wrong row or block fails it (as a scale index
// off by one block and a mis-shifted byte did). Their GPU twin: cuda-fp8.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { gemvFp8Choice } from '../../src/backends/cuda/fp8-kernels.ts';
import { dequantizeFp8, E4M3_VALUES } from '../../src/artifacts/fp8-checkpoint.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { runFp8DequantSim, runGemvFp8Sim } from './cuda-sim/fp8-sim.ts';
import { randomF32, rng } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-fp8-sim: skipping: ${SKIP}`);

/** random e4m3 bytes, never the NaN ones (0x7f, 0xff) */
function randomFp8(r: () => number, n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) {
    let b = Math.floor(r() * 256);
    if ((b & 0x7f) === 0x7f) b ^= 1;
    out[i] = b;
  }
  return out;
}

/** scales [N, KB] in [0.01, 2] */
function randomScales(r: () => number, N: number, KB: number): Float32Array {
  const s = new Float32Array(N * KB);
  for (let i = 0; i < s.length; i++) s[i] = 0.01 + 1.99 * r();
  return s;
}

/** y = x · (w ⊙ scale)^T (+ bias) in float64, each scale covering 2^colShift columns */
function product(M: number, N: number, K: number, x: Uint16Array, w: Uint8Array, s: Float32Array, colShift: number,
  bias?: Float32Array): Float64Array {
  const KB = Math.ceil(K / 2 ** colShift);
  const out = new Float64Array(M * N);
  for (let m = 0; m < M; m++) {
    for (let n = 0; n < N; n++) {
      let v = bias ? bias[n]! : 0;
      for (let k = 0; k < K; k++) v += bf16ToF32(x[m * K + k]!) * E4M3_VALUES[w[n * K + k]!]! * s[n * KB + (k >> colShift)]!;
      out[m * N + n] = v;
    }
  }
  return out;
}

function assertNear(label: string, got: ArrayLike<number>, want: Float64Array, atol: number, rtol: number): void {
  for (let i = 0; i < want.length; i++) {
    assert.ok(Math.abs(got[i]! - want[i]!) <= atol + rtol * Math.abs(want[i]!), `${label}: y[${i}] = ${got[i]}, want ${want[i]}`);
  }
}

describe('CUDA FP8 weight kernels (warp simulator)', { skip: SKIP ?? false }, () => {
  it('k_fp8_dequant gives the loader\'s bf16 values: every e4m3 byte, scales by row and 128 columns', () => {
    const N = 5, K = 272, KB = Math.ceil(K / 128); // the last scale column covers 16 columns
    const r0 = rng(12), w32 = randomFp8(r0, 3 * 96), s32 = randomScales(r0, 3, 3); // and scales of 32 columns
    assert.deepEqual(runFp8DequantSim(3, 96, w32, s32, 5),
      encodeHalf(dequantizeFp8(w32, s32, { rowsPerScale: 1, colsPerScale: 32, cols: 3 }, 3, 96), 'bf16'), '32-column scales');
    const r = rng(11);
    const w = new Uint8Array(N * K);
    for (let i = 0; i < w.length; i++) w[i] = i % 256; // every byte, NaNs included (they stay apart below)
    const scales = randomScales(r, N, KB);
    const got = runFp8DequantSim(N, K, w, scales, 7);
    const want = encodeHalf(dequantizeFp8(w, scales, { rowsPerScale: 1, colsPerScale: 128, cols: KB }, N, K), 'bf16');
    for (let i = 0; i < w.length; i++) {
      if ((w[i]! & 0x7f) === 0x7f) continue; // NaN bytes: no quantizer writes them (the hardware widens them to NaN)
      assert.equal(got[i], want[i], `element ${i} (byte 0x${w[i]!.toString(16)}, row ${Math.floor(i / K)}): ${got[i]} vs ${want[i]}`);
    }
    // scale 1: the e4m3 values themselves, exactly (3 mantissa bits fit bf16's 7)
    const one = runFp8DequantSim(1, 256, Uint8Array.from({ length: 256 }, (_, b) => b), new Float32Array(2).fill(1), 7);
    const vals = decodeHalf(one, 'bf16');
    for (let b = 0; b < 256; b++) if ((b & 0x7f) !== 0x7f) assert.equal(vals[b], E4M3_VALUES[b], `byte 0x${b.toString(16)}`);
  });

  it('the CUDA-core FP8 GEMV matches the float64 product at every row count, ragged shapes, each warps-a-row count', () => {
    const r = rng(5);
    // M, N, K, log2 of the columns a scale covers (a single column of scales when it covers K)
    const cases: [number, number, number, number][] = [[1, 13, 16, 7], [1, 37, 272, 7], [2, 21, 1040, 7], [3, 9, 4112, 7],
      [4, 19, 128, 4], [5, 11, 528, 5], [6, 7, 2064, 12], [7, 30, 144, 4], [8, 23, 1296, 5], [1, 300, 4096, 7]];
    for (const [M, N, K, colShift] of cases) {
      const KB = Math.ceil(K / 2 ** colShift);
      const w = randomFp8(r, N * K), scales = randomScales(r, N, KB);
      const x = encodeHalf(randomF32(r, M * K), 'bf16');
      const want = product(M, N, K, x, w, scales, colShift);
      const pick = gemvFp8Choice(M, N, K, colShift, 'cuda-core')!;
      assert.ok(pick, `${M}x${N}x${K}: a launch`);
      for (const wpr of [...new Set([pick.warpsPerRow, 1, 2, 4, 8])]) {
        const y = runGemvFp8Sim({ ...pick, warpsPerRow: wpr, grid: Math.ceil(N / (8 / wpr)) }, M, N, K, w, scales, colShift, x);
        assertNear(`${pick.kernel} ${M}x${N}x${K}/${2 ** colShift} w${wpr}`, decodeHalf(y as Uint16Array, 'bf16'), want, 2e-3, 8e-3);
      }
    }
  });

  it('the tensor-core FP8 GEMV matches the float64 product at every row count to 16, ragged N and K, scales of 64 columns to a row, 4 to 16 warps a block', () => {
    const r = rng(6);
    // ragged K: not a multiple of the 64-column chunk (a lane's 16 columns past K read nothing)
    const cases: [number, number, number, number][] = [[1, 13, 16, 7], [1, 37, 272, 7], [2, 21, 1040, 6], [3, 9, 4112, 7],
      [5, 40, 528, 12], [8, 23, 1296, 7], [9, 17, 336, 6], [12, 33, 1088, 7], [16, 16, 2064, 12], [1, 300, 4096, 7]];
    for (const [M, N, K, colShift] of cases) {
      const KB = Math.ceil(K / 2 ** colShift);
      const w = randomFp8(r, N * K), scales = randomScales(r, N, KB);
      const x = encodeHalf(randomF32(r, M * K), 'bf16');
      const want = product(M, N, K, x, w, scales, colShift);
      for (const warps of [4, 8, 16]) {
        const pick = gemvFp8Choice(M, N, K, colShift, 'tensor-core', warps)!;
        assert.equal(pick.kernel, M <= 8 ? 'k_gemv_fp8_tc_n1' : 'k_gemv_fp8_tc_n2');
        const y = runGemvFp8Sim(pick, M, N, K, w, scales, colShift, x);
        assertNear(`${pick.kernel} ${M}x${N}x${K}/${2 ** colShift} ${warps} warps`, decodeHalf(y as Uint16Array, 'bf16'), want, 2e-3, 8e-3);
      }
    }
  });

  it('the tensor-core FP8 GEMV gives a row of x the same bits alone, among 8 rows and among 16', () => {
    const r = rng(9);
    const N = 40, K = 1104, colShift = 7;
    const w = randomFp8(r, N * K), scales = randomScales(r, N, Math.ceil(K / 128));
    const x = encodeHalf(randomF32(r, 16 * K), 'bf16');
    const run = (M: number, rows: Uint16Array) => runGemvFp8Sim(gemvFp8Choice(M, N, K, colShift)!, M, N, K, w, scales, colShift, rows) as Uint16Array;
    const y16 = run(16, x), y8 = run(8, x.subarray(0, 8 * K));
    assert.deepEqual(y8, y16.subarray(0, 8 * N), 'rows 0-7: tiles n1 and n2');
    for (const m of [0, 5, 11, 15]) assert.deepEqual(run(1, x.subarray(m * K, (m + 1) * K)), y16.subarray(m * N, (m + 1) * N), `row ${m} alone`);
  });

  it('the FP8 GEMVs add a bias and store f32 when asked (the matmul\'s bias path)', () => {
    const r = rng(8);
    const M = 3, N = 17, K = 400;
    const KB = Math.ceil(K / 128);
    const w = randomFp8(r, N * K), scales = randomScales(r, N, KB);
    const x = encodeHalf(randomF32(r, M * K), 'bf16');
    const bias = randomF32(r, N, 4);
    for (const p of [gemvFp8Choice(M, N, K, 7, 'cuda-core')!, gemvFp8Choice(M, N, K, 7)!]) {
      const y = runGemvFp8Sim(p, M, N, K, w, scales, 7, x, bias, true) as Float32Array;
      assertNear(`${p.kernel}: f32 with bias`, y, product(M, N, K, x, w, scales, 7, bias), 1e-4, 1e-5);
    }
  });

  it('gemvFp8Choice: the tensor-core kernel to 16 rows where scales cover 64 columns or more, else the CUDA-core one to 8; none where M or K rule them out', () => {
    assert.deepEqual(gemvFp8Choice(1, 4096, 4096, 7), { kernel: 'k_gemv_fp8_tc_n1', warpsPerRow: 1, grid: 256, threads: 128 });
    assert.equal(gemvFp8Choice(1, 4096, 4096, 7, 'tensor-core', 16)!.threads, 512);
    assert.equal(gemvFp8Choice(9, 4096, 4096, 7)!.kernel, 'k_gemv_fp8_tc_n2');
    assert.equal(gemvFp8Choice(16, 4096, 4096, 6)!.kernel, 'k_gemv_fp8_tc_n2');
    assert.equal(gemvFp8Choice(17, 4096, 4096, 7), undefined);
    assert.equal(gemvFp8Choice(3, 4096, 4096, 5)!.kernel, 'k_gemv_fp8_m4', 'scales of 32 columns: the CUDA-core kernel');
    assert.equal(gemvFp8Choice(9, 4096, 4096, 5), undefined);
    assert.equal(gemvFp8Choice(1, 4096, 4096, 7, 'cuda-core')!.kernel, 'k_gemv_fp8_m1');
    assert.equal(gemvFp8Choice(3, 4096, 4096, 7, 'cuda-core')!.kernel, 'k_gemv_fp8_m4');
    assert.equal(gemvFp8Choice(8, 4096, 4096, 7, 'cuda-core')!.kernel, 'k_gemv_fp8_m8');
    assert.equal(gemvFp8Choice(1, 4096, 4096, 7, 'cuda-core')!.warpsPerRow, 1, '4096 rows: 512 blocks at one warp a row');
    assert.equal(gemvFp8Choice(1, 1024, 4096, 7, 'cuda-core')!.warpsPerRow, 4, '1024 rows: 4 warps a row for 512 blocks');
    assert.equal(gemvFp8Choice(1, 4096, 14336, 7, 'cuda-core')!.warpsPerRow, 4, 'K 14336: 896 chunks, one pass at 4 warps');
    assert.equal(gemvFp8Choice(9, 64, 64, 7, 'cuda-core'), undefined);
    assert.equal(gemvFp8Choice(1, 64, 24, 7), undefined, 'K not a multiple of 16');
    assert.equal(gemvFp8Choice(0, 64, 64, 7), undefined);
  });
});
