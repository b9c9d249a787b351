// The CUDA GEMV kernels (gemv-kernels.ts), run on the CPU by the warp simulator (cuda-sim/),
// against a float64 product of the same bf16 inputs; their GPU twin is cuda-ops.test.ts' GEMV
// test. Every kernel, 1-8 warps per output row, ragged K (not a multiple of a pass) and N (not a
// multiple of the rows a block takes), each kernel at fewer rows than it is built for.
// Tolerance as cuda-ops.test.ts' GEMMs: |sim - ref| <= 2e-3 + 8e-3 |ref| (bf16 output).
// The persistent kernels (k_gemvp_*) run with grids sized for 1-3 SMs, so each block loops over
// several row groups (a ring refilled from the wrong group fails them), and must give the one-shot
// kernels' bits (same chunks per lane, same summation order).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf, f32ToBf16 } from '../../src/backends/common/half.ts';
import { ACT_CODE } from '../../src/backends/cuda/cuda-tensor.ts';
import {
  GEMV_KERNEL_NAMES, GEMVP_KERNEL_NAMES, GEMVP_MAX_SHARED_BYTES, type GemvChoice, gemvCandidates, gemvFusedChoice, gemvGrid,
  gemvLabel, gemvLaunchGrid,
} from '../../src/backends/cuda/gemv-kernels.ts';
import { CUDA_DEFAULTS } from '../../src/backends/cuda/cuda-settings.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { runGemvLaunchSim, runGemvNormLaunchSim, runGemvSim, type SimLaunch } from './cuda-sim/gemv-sim.ts';
import { randomF32, rng } from './helpers.ts';

/** resident blocks an SM of the fused persistent launches, as the backend's default settings have them */
const BPS = CUDA_DEFAULTS.gemv.fusedBlocksPerSm;

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-gemv-sim: skipping: ${SKIP}`);

type OneShot = (typeof GEMV_KERNEL_NAMES)[number];
type Persistent = (typeof GEMVP_KERNEL_NAMES)[number];
const MMAX: Record<OneShot, number> = { k_gemv_m1_u16: 1, k_gemv_m1_u8: 1, k_gemv_m2_u16: 2, k_gemv_m4_u8: 4, k_gemv_m8_u4: 8 };
const PMMAX: Record<Persistent, number> = { k_gemvp_m1_u16: 1, k_gemvp_m2_u16: 2, k_gemvp_m4_u8: 4, k_gemvp_m8_u8: 8 };
/** the one-shot kernel of a persistent one's row class (same chunks per lane: the same bits) */
const ONE_SHOT: Record<Persistent, OneShot> = {
  k_gemvp_m1_u16: 'k_gemv_m1_u16', k_gemvp_m2_u16: 'k_gemv_m2_u16', k_gemvp_m4_u8: 'k_gemv_m4_u8', k_gemvp_m8_u8: 'k_gemv_m8_u4',
};

/** y = x · w^T in float64 of bf16 bits (x [M, K], w [N, K]) */
function product(M: number, N: number, K: number, x: ArrayLike<number>, w: Uint16Array): Float64Array {
  const out = new Float64Array(M * N);
  for (let m = 0; m < M; m++) {
    for (let n = 0; n < N; n++) {
      let v = 0;
      for (let k = 0; k < K; k++) v += x[m * K + k]! * bf16ToF32(w[n * K + k]!);
      out[m * N + n] = v;
    }
  }
  return out;
}

/** asserts |got - want| <= atol + rtol |want| for bf16 bits `got` */
function assertNear(label: string, got: Uint16Array, want: Float64Array, atol: number, rtol: number): void {
  const y = decodeHalf(got, 'bf16');
  for (let i = 0; i < want.length; i++) {
    assert.ok(Math.abs(y[i]! - want[i]!) <= atol + rtol * Math.abs(want[i]!), `${label}: y[${i}] = ${y[i]}, want ${want[i]}`);
  }
}

/** the index of the first differing element, or -1 */
function firstDiff(a: Uint16Array, b: Uint16Array): number {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : a.length;
}

/** rows, N, K, warps per row, blocks per SM, SMs: every case makes some block take several row groups */
type PCase = [number, number, number, number, number, number];
const PCASES: PCase[] = [
  [1, 13, 8, 1, 1, 1], // K one chunk; 2 groups on 1 block
  [1, 37, 24, 2, 1, 2], // 3 chunks; 10 groups on 2 blocks
  [2, 21, 4104, 8, 2, 1], // 513 chunks over 8 warps; 21 groups on 2 blocks
  [3, 17, 264, 4, 2, 1],
  [4, 19, 2056, 1, 1, 2], // 257 chunks a lane's row: 2 passes at UNR 8 and 16
  [5, 11, 520, 2, 1, 2],
  [8, 23, 136, 1, 2, 1],
  [2, 9, 4104, 1, 1, 1], // one warp a row, 513 chunks: passes of 32 UNR plus one chunk
  [7, 30, 4104, 1, 1, 2],
  [6, 27, 776, 4, 1, 3],
];

describe('GEMV launch choices (gemv-kernels.ts)', () => {
  it('candidates: one-shot and persistent launches with distinct labels; persistent grids stay within row groups and SMs x blocks', () => {
    for (const [M, K] of [[1, 4096], [2, 14336], [4, 4096], [8, 8], [8, 4104], [3, 2048]] as const) {
      const c = gemvCandidates(M, K);
      const labels = c.map(gemvLabel);
      assert.equal(new Set(labels).size, labels.length, `M=${M} K=${K}: ${labels.join(' ')}`);
      assert.ok(c.some((x) => !x.blocksPerSm) && c.some((x) => x.blocksPerSm === 1) && c.some((x) => x.blocksPerSm === 2), labels.join(' '));
      for (const x of c) {
        assert.ok([1, 2, 4, 8].includes(x.warpsPerRow));
        for (const N of [1, 7, 4096, 28672]) {
          const grid = gemvLaunchGrid(x, N, 132);
          if (!x.blocksPerSm) assert.equal(grid, gemvGrid(N, x.warpsPerRow));
          else assert.equal(grid, Math.min(gemvGrid(N, x.warpsPerRow), 132 * x.blocksPerSm), `${gemvLabel(x)} N=${N}`);
        }
      }
    }
    assert.deepEqual(gemvCandidates(9, 4096), []);
    assert.deepEqual(gemvCandidates(1, 12), []);
    // UNR 8 (4 rows): 512 chunks fill a lane's ring of 8 at 2 warps a row, not at 4
    assert.deepEqual(gemvCandidates(4, 4096).filter((x) => x.blocksPerSm).map(gemvLabel),
      ['k_gemvp_m4_u8/w1/b1', 'k_gemvp_m4_u8/w1/b2', 'k_gemvp_m4_u8/w2/b1', 'k_gemvp_m4_u8/w2/b2']);
  });

  it('the fused launch: a persistent kernel with M K 2 bytes of shared memory, only within 48 KiB', () => {
    const f = gemvFusedChoice(1, 4096, 14336, BPS)!;
    assert.equal(f.sharedBytes, 14336 * 2);
    assert.equal(f.glu, 'k_gemvp_glu_m1_u16');
    assert.equal(f.norm, 'k_gemvp_norm_m1_u16');
    assert.ok(f.choice.blocksPerSm);
    assert.equal(gemvFusedChoice(8, 100, 3072, BPS)!.sharedBytes, GEMVP_MAX_SHARED_BYTES);
    assert.equal(gemvFusedChoice(8, 100, 3080, BPS), undefined);
    assert.equal(gemvFusedChoice(2, 4096, 14336, BPS), undefined);
    assert.equal(gemvFusedChoice(3, 6144, 4096, BPS)!.norm, 'k_gemvp_norm_m4_u8');
    assert.equal(gemvFusedChoice(9, 10, 8, BPS), undefined);
    assert.equal(gemvFusedChoice(1, 128256, 4096, BPS), undefined); // lm_head: 1 GB of weights
    assert.equal(gemvFusedChoice(1, 4096, 14336, BPS)!.choice.warpsPerRow, 2); // a lane's ring is full at 2 warps a row
    assert.equal(gemvFusedChoice(1, 28672, 4096, BPS)!.choice.warpsPerRow, 1);
  });
});

describe('persistent GEMV kernels on the warp simulator', { skip: SKIP ?? false }, () => {
  it(`${GEMVP_KERNEL_NAMES.join(', ')}: 1-8 rows, 1-8 warps a row, 1-2 blocks an SM on 1-3 SMs: the one-shot kernels' bits`, () => {
    const r = rng(34);
    let cases = 0;
    for (const kernel of GEMVP_KERNEL_NAMES) {
      for (const [M, N, K, wpr, bps, sms] of PCASES) {
        if (M > PMMAX[kernel]) continue;
        const choice: GemvChoice = { kernel, warpsPerRow: wpr, blocksPerSm: bps };
        const label = `${gemvLabel(choice)} on ${sms} SMs M=${M} N=${N} K=${K}`;
        assert.ok(gemvLaunchGrid(choice, N, sms) < gemvGrid(N, wpr), `${label}: a block takes several row groups`);
        const w = encodeHalf(randomF32(r, N * K), 'bf16'), x = encodeHalf(randomF32(r, M * K), 'bf16');
        const got = runGemvLaunchSim({ choice, smCount: sms }, M, N, K, w, x);
        assertNear(label, got, product(M, N, K, decodeHalf(x, 'bf16'), w), 2e-3, 8e-3);
        const plain = runGemvSim(ONE_SHOT[kernel], wpr, M, N, K, w, x);
        assert.equal(firstDiff(got, plain), -1, `${label}: differs from ${ONE_SHOT[kernel]} at ${firstDiff(got, plain)}`);
        cases++;
      }
    }
    assert.ok(cases >= 20, `${cases} cases ran`);
  });

  it('the add + rmsnorm twins (k_gemvp_norm_*): x staged in shared memory, the residual from block 0', () => {
    const r = rng(35);
    let cases = 0;
    for (const kernel of GEMVP_KERNEL_NAMES) {
      // the last two: 8 rows x 3072 fill the 48 KiB exactly; 4104 = 4096 + 8
      for (const [M, N, K, wpr, bps, sms, rScale, off] of [[1, 29, 4096, 1, 2, 1, 1, 0], [PMMAX[kernel], 9, 520, 2, 1, 2, 0.5, 1],
        [Math.min(3, PMMAX[kernel]), 21, 1032, 4, 1, 3, 1, 0], [Math.min(5, PMMAX[kernel]), 11, 4104, 1, 1, 1, 1, 1],
        [PMMAX[kernel], 7, 24, 8, 2, 1, 2, 0], [8, 10, 3072, 1, 1, 1, 1, 0]] as [number, number, number, number, number, number, number, number][]) {
        if (M > PMMAX[kernel]) continue;
        const choice: GemvChoice = { kernel, warpsPerRow: wpr, blocksPerSm: bps };
        const l: SimLaunch = { choice, smCount: sms, kernel: kernel.replace('k_gemvp_', 'k_gemvp_norm_'), sharedBytes: M * K * 2 };
        const label = `${l.kernel}/w${wpr}/b${bps} on ${sms} SMs M=${M} N=${N} K=${K}`;
        assert.ok(gemvLaunchGrid(choice, N, sms) < gemvGrid(N, wpr), `${label}: a block takes several row groups`);
        assert.ok(M * K * 2 <= GEMVP_MAX_SHARED_BYTES);
        const w = encodeHalf(randomF32(r, N * K), 'bf16'), nw = encodeHalf(randomF32(r, K), 'bf16'), eps = 1e-5;
        const x = encodeHalf(randomF32(r, M * K, 2), 'bf16'), res = encodeHalf(randomF32(r, M * K, 2), 'bf16');
        const got = runGemvNormLaunchSim(l, M, N, K, w, x, res, nw, rScale, eps, off);
        const normed = new Float64Array(M * K);
        for (let m = 0; m < M; m++) {
          const sum = new Float64Array(K);
          let ss = 0;
          for (let k = 0; k < K; k++) {
            const bits = f32ToBf16(Math.fround(bf16ToF32(x[m * K + k]!) + Math.fround(rScale * bf16ToF32(res[m * K + k]!))));
            assert.equal(got.sum[m * K + k], bits, `${label}: sum[${m}, ${k}]`);
            sum[k] = bf16ToF32(bits);
            ss += sum[k]! * sum[k]!;
          }
          const inv = 1 / Math.sqrt(ss / K + eps);
          // the normed row as k_add_rmsnorm stores it: rounded to bf16 (which the GEMV then reads)
          normed.set(decodeHalf(encodeHalf(Float32Array.from(sum, (v, k) => v * inv * (off + bf16ToF32(nw[k]!))), 'bf16'), 'bf16'), m * K);
        }
        assertNear(label, got.y, product(M, N, K, normed, w), 4e-3, 1e-2);
        cases++;
      }
    }
    assert.ok(cases >= 16, `${cases} cases ran`);
  });

  it('the GLU twins (k_gemvp_glu_*): x = bf16(act(gate) up) staged in shared memory', () => {
    const r = rng(36);
    const acts: [string, number, (x: number) => number][] = [
      ['silu', ACT_CODE.silu!, (x) => x / (1 + Math.exp(-x))],
      ['gelu_tanh', ACT_CODE.gelu_tanh!, (x) => 0.5 * x * (1 + Math.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))],
    ];
    for (const kernel of GEMVP_KERNEL_NAMES) {
      for (const [M, N, K, wpr, bps, sms] of [[1, 11, 4104, 1, 1, 1], [PMMAX[kernel], 9, 520, 2, 2, 1],
        [Math.min(3, PMMAX[kernel]), 13, 2056, 4, 1, 2], [PMMAX[kernel], 17, 8, 8, 1, 3]] as PCase[]) {
        const [name, code, act] = acts[(M + N) % 2]!;
        const choice: GemvChoice = { kernel, warpsPerRow: wpr, blocksPerSm: bps };
        const l: SimLaunch = { choice, smCount: sms, kernel: kernel.replace('k_gemvp_', 'k_gemvp_glu_'), sharedBytes: M * K * 2 };
        const label = `${l.kernel}/w${wpr}/b${bps} on ${sms} SMs ${name} M=${M} N=${N} K=${K}`;
        assert.ok(gemvLaunchGrid(choice, N, sms) < gemvGrid(N, wpr), `${label}: a block takes several row groups`);
        const w = encodeHalf(randomF32(r, N * K), 'bf16'), gu = encodeHalf(randomF32(r, M * 2 * K, 3), 'bf16');
        const glu = new Float64Array(M * K);
        for (let m = 0; m < M; m++) {
          for (let k = 0; k < K; k++) {
            glu[m * K + k] = bf16ToF32(f32ToBf16(Math.fround(Math.fround(act(bf16ToF32(gu[m * 2 * K + k]!))) * bf16ToF32(gu[m * 2 * K + K + k]!))));
          }
        }
        const got = runGemvLaunchSim(l, M, N, K, w, gu, code);
        assertNear(label, got, product(M, N, K, glu, w), 4e-3, 1.2e-2);
      }
    }
  });

  it('the fused launches as cuda-fused-ops.ts makes them (gemvFusedChoice), and the simulator catches too little shared memory', () => {
    const r = rng(37);
    const [M, N, K] = [2, 40, 1032];
    const f = gemvFusedChoice(M, N, K, BPS)!;
    const w = encodeHalf(randomF32(r, N * K), 'bf16'), gu = encodeHalf(randomF32(r, M * 2 * K, 3), 'bf16');
    const l: SimLaunch = { choice: f.choice, smCount: 2, kernel: f.glu, sharedBytes: f.sharedBytes };
    runGemvLaunchSim(l, M, N, K, w, gu, ACT_CODE.silu!);
    assert.throws(() => runGemvLaunchSim({ ...l, sharedBytes: f.sharedBytes - 16 }, M, N, K, w, gu, ACT_CODE.silu!), /dynamic shared memory/);
    const x = encodeHalf(randomF32(r, M * K, 2), 'bf16'), res = encodeHalf(randomF32(r, M * K, 2), 'bf16');
    const nw = encodeHalf(randomF32(r, K), 'bf16');
    runGemvNormLaunchSim({ ...l, kernel: f.norm }, M, N, K, w, x, res, nw, 1, 1e-6, 0);
    assert.throws(() => runGemvNormLaunchSim({ ...l, kernel: f.norm, sharedBytes: f.sharedBytes - 16 }, M, N, K, w, x, res, nw, 1, 1e-6, 0),
      /dynamic shared memory/);
  });
});

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

  it('the persistent GLU twins (gluMatmul: x = bf16(act(gate) * up) from packed gate/up rows) equal the GEMV on the glu output, bit for bit', () => {
    const r = rng(32);
    const acts: [string, number, (x: number) => number][] = [
      ['silu', ACT_CODE.silu!, (x) => x / (1 + Math.exp(-x))],
      ['gelu_tanh', ACT_CODE.gelu_tanh!, (x) => 0.5 * x * (1 + Math.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))],
    ];
    for (const kernel of GEMVP_KERNEL_NAMES) {
      for (const [M, N, K, wpr] of [[1, 11, 1032, 2], [PMMAX[kernel], 9, 520, 1], [Math.min(3, PMMAX[kernel]), 13, 2056, 4]] as [number, number, number, number][]) {
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
          const choice: GemvChoice = { kernel, warpsPerRow: wpr, blocksPerSm: 1 };
          const fused = runGemvLaunchSim({ choice, smCount: 1, kernel: kernel.replace('k_gemvp_', 'k_gemvp_glu_'), sharedBytes: M * K * 2 },
            M, N, K, w, gu, code);
          const plain = runGemvLaunchSim({ choice, smCount: 1 }, M, N, K, w, x);
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
