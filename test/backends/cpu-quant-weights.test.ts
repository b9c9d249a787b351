// GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 matmul weights kept quantized on the CPU backend (native/quant_pack.c,
// gemm_q8.c; LLMTS_CPU_QUANT_WEIGHTS): read back and embedding rows are the exact dequantized
// values; a matmul is bit for bit a TypeScript model of the kernels' arithmetic (x quantized per
// block of 32, each block's exact integer dot times d_x * d_w into one f32 sum, blocks in order;
// Q4_K / Q5_K / Q4_1 / Q5_1 then subtract the block's sum of x times d_x * m_w; Q6_K sums each half of 16 with its own scale)
// on every ISA, one thread or the team; each row is the same whatever M is; the result is within a
// bound derived from x's rounding of the f32 matmul of the dequantized weights; other ops refuse
// the tensor by name.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type { QuantizedType, WeightSource } from '../../src/contracts/backend.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import type { CpuTensor } from '../../src/backends/cpu/cpu-tensor.ts';
import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';
import { encodeHalf } from '../../src/backends/common/half.ts';
import { dequantize, F16_TO_F32 } from '../../src/artifacts/gguf/dequant.ts';
import { GGML_TYPE_BY_NAME } from '../../src/artifacts/gguf/ggml-types.ts';
import { CPU_ISA_NAMES, forEachCpuIsa, randomF32, rng } from './helpers.ts';

const fr = Math.fround;
const BLOCK_BYTES: Record<QuantizedType, number> = { Q8_0: 34, Q4_0: 18, Q4_K: 144, Q6_K: 210, Q5_K: 176, IQ4_XS: 136, Q4_1: 20, Q5_1: 24 };
/** weights a ggml block holds */
const BLOCK_SIZE: Record<QuantizedType, number> = { Q8_0: 32, Q4_0: 32, Q4_K: 256, Q6_K: 256, Q5_K: 256, IQ4_XS: 256, Q4_1: 32, Q5_1: 32 };
/** a panel's bytes per block of 32 k (native/llm.h quant_p16_bytes) */
const PANEL_BLOCK_BYTES: Record<QuantizedType, number> = { Q8_0: 544, Q4_0: 288, Q4_K: 296, Q6_K: 420, Q5_K: 360, IQ4_XS: 276, Q4_1: 320, Q5_1: 384 };
/** ggml's kvalues_iq4nl */
const IQ4_VALUES = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

let quant: CpuBackend;
let plain: CpuBackend;

before(async () => {
  quant = await createCpuBackend({ settings: { quantWeights: true } });
  plain = await createCpuBackend({ settings: { quantWeights: false } });
});
after(async () => {
  await quant.close();
  await plain.close();
});

/**
 * Random ggml blocks of w[N][K]: scales of either sign (f16), every quant value possible (Q8_0's
 * -128 too); Q4_K / Q5_K: d and dmin so, and any 12 bytes of 6-bit scales and mins; Q6_K: d so (at the
 * block's end) and any int8 scales; IQ4_XS: d so and any 6-bit block scales.
 */
function randomBlocks(r: () => number, type: QuantizedType, N: number, K: number): Uint8Array {
  const nb = (N * K) / BLOCK_SIZE[type], bb = BLOCK_BYTES[type];
  const raw = new Uint8Array(nb * bb);
  if (type === 'Q6_K') {
    const d = encodeHalf(Float32Array.from({ length: nb }, () => (r() < 0.5 ? -1 : 1) * (0.00002 + 0.0002 * r())), 'f16');
    for (let b = 0; b < nb; b++) {
      for (let j = 0; j < 208; j++) raw[b * bb + j] = (r() * 256) | 0;
      raw[b * bb + 208] = d[b]! & 0xff;
      raw[b * bb + 209] = d[b]! >> 8;
    }
    return raw;
  }
  // f16s at the block's start: Q4_K's and Q5_K's d and dmin (a tenth as large: 6-bit factors), IQ4_XS's d
  // (smaller still: 6-bit factors of 7-bit values)
  // Q4_1's and Q5_1's d and m
  const scaled = type === 'Q4_K' || type === 'Q5_K' || type === 'Q4_1' || type === 'Q5_1' ? 2 : 1;
  const size = type === 'Q4_K' || type === 'Q5_K' ? 0.0003 : type === 'IQ4_XS' ? 0.00002 : 0.02;
  const scales = encodeHalf(Float32Array.from({ length: nb * scaled }, () => (r() < 0.5 ? -1 : 1) * (size / 10 + size * r())), 'f16');
  for (let b = 0; b < nb; b++) {
    for (let s = 0; s < scaled; s++) {
      raw[b * bb + 2 * s] = scales[b * scaled + s]! & 0xff;
      raw[b * bb + 2 * s + 1] = scales[b * scaled + s]! >> 8;
    }
    for (let j = 2 * scaled; j < bb; j++) raw[b * bb + j] = (r() * 256) | 0;
  }
  return raw;
}

/** Q4_K sub-block j's 6-bit scale and min from the 12 bytes at s (ggml's get_scale_min_k4). */
function q4kScaleMin(b: Uint8Array, s: number, j: number): [number, number] {
  if (j < 4) return [b[s + j]! & 63, b[s + j + 4]! & 63];
  return [(b[s + j + 4]! & 0xf) | ((b[s + j - 4]! >> 6) << 4), (b[s + j + 4]! >> 4) | ((b[s + j]! >> 6) << 4)];
}

/** a matrix's integer weights [N][K], with a scale d per `sub` k (and Q4_K's min m: w = d q - m) */
interface WeightInts { q: Int32Array; d: Float32Array; sub: 16 | 32; m?: Float32Array }

/** The weights' integer values and scales as ggml defines the blocks (Q6_K: a scale per 16 k, q - 32). */
function weightInts(type: QuantizedType, raw: Uint8Array, N: number, K: number): WeightInts {
  const KB = K / 32, bb = BLOCK_BYTES[type];
  const q = new Int32Array(N * K), d = new Float32Array(N * KB);
  if (type === 'Q6_K') {
    const d16 = new Float32Array(N * KB * 2);
    for (let sb = 0; sb < (N * K) / 256; sb++) {
      const o = sb * bb, dd = F16_TO_F32[raw[o + 208]! | (raw[o + 209]! << 8)]!;
      for (let g = 0; g < 16; g++) d16[sb * 16 + g] = fr(dd * ((raw[o + 192 + g]! << 24) >> 24));
      for (let e = 0; e < 256; e++) {
        const h = e >> 7;
        const lo = (raw[o + 64 * h + (e & 63)]! >> (((e >> 6) & 1) * 4)) & 0xf;
        const hi = (raw[o + 128 + 32 * h + (e & 31)]! >> (((e >> 5) & 3) * 2)) & 3;
        q[sb * 256 + e] = (lo | (hi << 4)) - 32;
      }
    }
    return { q, d: d16, sub: 16 };
  }
  if (type === 'Q4_K' || type === 'Q5_K') {
    const m = new Float32Array(N * KB), q5 = type === 'Q5_K';
    for (let sb = 0; sb < (N * K) / 256; sb++) {
      const o = sb * bb, dd = F16_TO_F32[raw[o]! | (raw[o + 1]! << 8)]!, dmin = F16_TO_F32[raw[o + 2]! | (raw[o + 3]! << 8)]!;
      for (let j = 0; j < 8; j++) {
        const [sc, mn] = q4kScaleMin(raw, o + 4, j);
        d[sb * 8 + j] = fr(dd * sc);
        m[sb * 8 + j] = fr(dmin * mn);
        for (let l = 0; l < 32; l++) {
          const nibble = (raw[o + (q5 ? 48 : 16) + 32 * (j >> 1) + l]! >> ((j & 1) * 4)) & 0xf;
          q[sb * 256 + j * 32 + l] = q5 ? nibble | (((raw[o + 16 + l]! >> j) & 1) << 4) : nibble;
        }
      }
    }
    return { q, d, m, sub: 32 };
  }
  if (type === 'IQ4_XS') {
    for (let sb = 0; sb < (N * K) / 256; sb++) {
      const o = sb * bb, dd = F16_TO_F32[raw[o]! | (raw[o + 1]! << 8)]!, sh = raw[o + 2]! | (raw[o + 3]! << 8);
      for (let j = 0; j < 8; j++) {
        const ls = ((raw[o + 4 + (j >> 1)]! >> ((j & 1) * 4)) & 0xf) | (((sh >> (2 * j)) & 3) << 4);
        d[sb * 8 + j] = fr(dd * (ls - 32));
        for (let e = 0; e < 16; e++) {
          const u = raw[o + 8 + 16 * j + e]!;
          q[sb * 256 + j * 32 + e] = IQ4_VALUES[u & 0xf]!;
          q[sb * 256 + j * 32 + e + 16] = IQ4_VALUES[u >> 4]!;
        }
      }
    }
    return { q, d, sub: 32 };
  }
  if (type === 'Q4_1' || type === 'Q5_1') {
    // w = d q + m: the model's d q - m' with m' = -m
    const m = new Float32Array(N * KB), q5 = type === 'Q5_1';
    for (let blk = 0; blk < N * KB; blk++) {
      const o = blk * bb;
      d[blk] = F16_TO_F32[raw[o]! | (raw[o + 1]! << 8)]!;
      m[blk] = -F16_TO_F32[raw[o + 2]! | (raw[o + 3]! << 8)]!;
      const qh = q5 ? (raw[o + 4]! | (raw[o + 5]! << 8) | (raw[o + 6]! << 16) | (raw[o + 7]! << 24)) >>> 0 : 0;
      const qs = o + (q5 ? 8 : 4);
      for (let j = 0; j < 32; j++) {
        const nibble = j < 16 ? raw[qs + j]! & 0xf : raw[qs + j - 16]! >> 4;
        q[blk * 32 + j] = nibble | (((qh >>> j) & 1) << 4);
      }
    }
    return { q, d, m, sub: 32 };
  }
  for (let blk = 0; blk < N * KB; blk++) {
    const o = blk * bb;
    d[blk] = F16_TO_F32[raw[o]! | (raw[o + 1]! << 8)]!;
    for (let j = 0; j < 32; j++) {
      q[blk * 32 + j] = type === 'Q8_0' ? (raw[o + 2 + j]! << 24) >> 24
        : (j < 16 ? raw[o + 2 + j]! & 0xf : raw[o + 2 + j - 16]! >> 4) - 8;
    }
  }
  return { q, d, sub: 32 };
}

/** Round to nearest, ties to even (what the kernels' conversions do). */
function rne(v: number): number {
  const f = Math.floor(v), diff = v - f;
  if (diff > 0.5) return f + 1;
  if (diff < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** x [M][K] quantized per block of 32: d = max|x| / 127, q = x / d rounded and clamped (0 when d is 0). */
function quantizeX(x: Float32Array, M: number, K: number): { q: Int32Array; d: Float32Array } {
  const KB = K / 32, q = new Int32Array(M * K), d = new Float32Array(M * KB);
  for (let blk = 0; blk < M * KB; blk++) {
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[blk * 32 + j]!));
    const s = fr(amax / 127);
    d[blk] = s;
    for (let j = 0; j < 32; j++) q[blk * 32 + j] = s > 0 ? Math.min(127, Math.max(-127, rne(fr(x[blk * 32 + j]! / s)))) : 0;
  }
  return { q, d };
}

/**
 * The kernels' arithmetic: per block of 32 (Q6_K: per half of 16 in turn), the exact int dot, times
 * fround(d_x * d_w), added in f32 (Q4_K: then the block's sum of x's values times fround(d_x * m_w)
 * subtracted), blocks in order; then + bias.
 */
function modelMatmul(x: Float32Array, M: number, K: number, w: WeightInts, N: number, bias?: Float32Array): Float32Array {
  const KB = K / 32, xq = quantizeX(x, M, K), y = new Float32Array(M * N), per = K / w.sub;
  for (let m = 0; m < M; m++) {
    for (let n = 0; n < N; n++) {
      let acc = 0;
      for (let b = 0; b < KB; b++) {
        for (let g = b * (32 / w.sub); g < (b + 1) * (32 / w.sub); g++) {
          let dot = 0, sum = 0;
          for (let k = g * w.sub; k < (g + 1) * w.sub; k++) {
            dot += xq.q[m * K + k]! * w.q[n * K + k]!;
            sum += xq.q[m * K + k]!;
          }
          acc = fr(acc + fr(dot * fr(xq.d[m * KB + b]! * w.d[n * per + g]!)));
          if (w.m) acc = fr(acc - fr(sum * fr(xq.d[m * KB + b]! * w.m[n * per + g]!)));
        }
      }
      y[m * N + n] = bias ? fr(acc + bias[n]!) : acc;
    }
  }
  return y;
}

function source(type: QuantizedType, raw: Uint8Array, N: number, K: number, name = `${type}[${N}, ${K}]`): WeightSource {
  const values = new Float32Array(N * K);
  dequantize(GGML_TYPE_BY_NAME.get(type)!, raw, values);
  return {
    path: '/nonexistent', offset: 0, dtype: 'f32', shape: [N, K], name,
    decode: (want) => {
      if (want !== 'f32') throw new Error(`this test source decodes to f32 only, not ${want}`);
      return new Uint8Array(values.buffer.slice(0));
    },
    quantized: { type, blocks: () => raw },
  };
}

function firstDiff(a: Float32Array, b: Float32Array): string | undefined {
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) return `element ${i}: ${a[i]} vs ${b[i]}`;
  return undefined;
}

const TYPES: QuantizedType[] = ['Q8_0', 'Q4_0', 'Q4_K', 'Q6_K', 'Q5_K', 'IQ4_XS', 'Q4_1', 'Q5_1'];
// odd N (partial panels of 16), K a multiple of 32 (the K-quants: 256) from one block up
const SHAPES_32: [number, number][] = [[1, 32], [17, 32], [15, 64], [33, 96], [40, 256], [130, 1024]];
const SHAPES_256: [number, number][] = [[1, 256], [17, 256], [33, 512], [130, 1024]];
const shapesOf = (type: QuantizedType) => (BLOCK_SIZE[type] === 256 ? SHAPES_256 : SHAPES_32);

describe('GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 weights kept quantized', () => {
  it('load quantized only when kept, and read back the exact dequantized values', async () => {
    const r = rng(21);
    for (const type of TYPES) {
      for (const [N, K] of shapesOf(type)) {
        const src = source(type, randomBlocks(r, type, N, K), N, K);
        const q = (await quant.loadWeight(src, 'keep', 'matmul')) as CpuTensor;
        const p = (await plain.loadWeight(src, 'keep', 'matmul')) as CpuTensor;
        assert.equal(q.layout, type.toLowerCase(), `${src.name}`);
        assert.equal(p.layout, 'rows');
        assert.deepEqual(q.shape, [N, K]);
        // panels of 16 rows: 16 x 34 (Q8_0: 512 quant bytes, 32 of scales), 16 x 18 (Q4_0), 16 x 18.5 (Q4_K) or 16 x 26.25 (Q6_K) bytes a block of 32
        assert.equal(q.bytes, Math.ceil(N / 16) * (K / 32) * PANEL_BLOCK_BYTES[type], `${src.name} bytes`);
        assert.equal(firstDiff((await quant.read(q)) as Float32Array, (await plain.read(p)) as Float32Array), undefined, src.name);
        quant.free(q);
        plain.free(p);
      }
      // not for matmul, or as f32: the dequantized values
      const k = BLOCK_SIZE[type] * 2;
      const src = source(type, randomBlocks(r, type, 4, k), 4, k);
      for (const t of [await quant.loadWeight(src, 'keep'), await quant.loadWeight(src, 'f32', 'matmul')]) {
        assert.equal((t as CpuTensor).layout, 'rows');
        quant.free(t);
      }
    }
  });

  it('refuse blocks of the wrong size', async () => {
    const src = source('Q8_0', randomBlocks(rng(22), 'Q8_0', 4, 64), 4, 64);
    const bad = { ...src, quantized: { type: 'Q8_0' as const, blocks: () => new Uint8Array(10) } };
    await assert.rejects(quant.loadWeight(bad, 'keep', 'matmul'), /10 bytes of Q8_0 blocks for \[4, 64\], want 272/);
  });

  it('embedding rows are the exact dequantized rows', async () => {
    const r = rng(23);
    for (const type of TYPES) {
      const [V, D] = [37, BLOCK_SIZE[type] === 256 ? 512 : 96];
      const src = source(type, randomBlocks(r, type, V, D), V, D);
      const q = await quant.loadWeight(src, 'keep', 'matmul');
      const p = await plain.loadWeight(src, 'keep', 'matmul');
      const ids = Int32Array.from({ length: 50 }, (_, i) => (i * 7) % V);
      const got = await quant.read(quant.embedding(q, quant.upload(ids, [ids.length]), 0.5));
      const want = await plain.read(plain.embedding(p, plain.upload(ids, [ids.length]), 0.5));
      assert.equal(firstDiff(got as Float32Array, want as Float32Array), undefined, type);
      quant.free(q);
      plain.free(p);
    }
  });

  it('matmul: bit for bit the model of its arithmetic, and batch invariant, every ISA, bias or none', async (tc) => {
    const r = rng(24);
    const lib = loadNativeLib();
    const kernels = new Set<string>();
    for (const type of TYPES) {
      for (const [N, K] of shapesOf(type)) {
        const raw = randomBlocks(r, type, N, K);
        const w = weightInts(type, raw, N, K);
        const t = await quant.loadWeight(source(type, raw, N, K), 'keep', 'matmul');
        const Mmax = 40; // past ROWS_MAX_M (16) and a 64-row work item's tiles of 4
        const x = randomF32(r, Mmax * K);
        x.fill(0, 0, 32); // a block of zeros: d = 0
        const bias = randomF32(r, N);
        const want = { none: modelMatmul(x, Mmax, K, w, N), bias: modelMatmul(x, Mmax, K, w, N, bias) };
        await forEachCpuIsa(quant, async (isa, parallel) => {
          const kernel = `${CPU_ISA_NAMES[isa]}${lib.quantVnni() ? ' (VNNI)' : ' (portable)'}`;
          kernels.add(kernel);
          const label = `${type} [${N}, ${K}] ${kernel}${parallel ? ' (team)' : ''}`;
          for (const b of ['none', 'bias'] as const) {
            const bt = b === 'bias' ? quant.upload(bias, [N]) : undefined;
            const all = (await quant.read(quant.matmul(quant.upload(x, [Mmax, K]), t, bt))) as Float32Array;
            assert.equal(firstDiff(all, want[b]), undefined, `${label} ${b}: M = ${Mmax} against the model`);
            // every M from 1 to 40 (small shapes), a spread of them for the largest
            const Ms = N * K > 50000 ? [1, 2, 3, 4, 5, 7, 16, 17, 33] : Array.from({ length: Mmax }, (_, i) => i + 1);
            for (const M of Ms) {
              const y = (await quant.read(quant.matmul(quant.upload(x.subarray(0, M * K), [M, K]), t, bt))) as Float32Array;
              assert.equal(firstDiff(y, all.subarray(0, M * N)), undefined, `${label} ${b}: rows of M = ${M}`);
            }
            for (let m = 0; m < Mmax; m += 13) {
              const y = (await quant.read(quant.matmul(quant.upload(x.subarray(m * K, (m + 1) * K), [1, K]), t, bt))) as Float32Array;
              assert.equal(firstDiff(y, all.subarray(m * N, (m + 1) * N)), undefined, `${label} ${b}: row ${m} alone`);
            }
          }
        });
        quant.free(t);
      }
    }
    tc.diagnostic(`kernels: ${[...kernels].join(', ')}`);
  });

  it('matmul: within the bound of x\'s rounding of the f32 matmul of the dequantized weights', async () => {
    // x's rounding moves each element by at most d_x / 2 = max|x in its block| / 254, so an output
    // moves by at most sum over blocks of that times sum |w| of the block; the f32 sums add at most
    // K * 2^-23 * sum |x w| beside (a generous bound on their rounding; Q4_K's terms are d q and m
    // apart, so its magnitude is sum |x| (|d q| + |m|)).
    const r = rng(25);
    for (const type of TYPES) {
      for (const [N, K] of (BLOCK_SIZE[type] === 256 ? [[33, 256], [130, 1024]] : [[33, 96], [130, 1024]]) as [number, number][]) {
        const raw = randomBlocks(r, type, N, K);
        const src = source(type, raw, N, K);
        const wv = new Float32Array(src.decode!('f32').buffer);
        const wi = ['Q4_K', 'Q5_K', 'Q4_1', 'Q5_1'].includes(type) ? weightInts(type, raw, N, K) : undefined;
        const t = await quant.loadWeight(src, 'keep', 'matmul');
        const M = 7, x = randomF32(r, M * K, 3);
        const y = (await quant.read(quant.matmul(quant.upload(x, [M, K]), t))) as Float32Array;
        let worst = 0;
        for (let m = 0; m < M; m++) {
          for (let n = 0; n < N; n++) {
            let exact = 0, bound = 0, mag = 0;
            for (let b = 0; b < K / 32; b++) {
              let amax = 0, wabs = 0;
              for (let j = 0; j < 32; j++) {
                const k = b * 32 + j;
                exact += x[m * K + k]! * wv[n * K + k]!;
                const blk = n * (K / 32) + b;
                mag += Math.abs(x[m * K + k]!) * (wi ? Math.abs(wi.d[blk]! * wi.q[n * K + k]!) + Math.abs(wi.m![blk]!) : Math.abs(wv[n * K + k]!));
                amax = Math.max(amax, Math.abs(x[m * K + k]!));
                wabs += Math.abs(wv[n * K + k]!);
              }
              bound += (amax / 254) * wabs;
            }
            const err = Math.abs(y[m * N + n]! - exact);
            const tol = bound * (1 + 1e-6) + K * 2 ** -23 * mag;
            assert.ok(err <= tol, `${type} [${N}, ${K}] y[${m}][${n}] = ${y[m * N + n]}, f32 ${exact}: |diff| ${err} > ${tol}`);
            worst = Math.max(worst, err / tol);
          }
        }
        assert.ok(worst > 0, 'x is rounded: some output differs from the f32 matmul');
        quant.free(t);
      }
    }
  });

  it('other ops refuse a quantized tensor by name', async () => {
    const t = await quant.loadWeight(source('Q4_0', randomBlocks(rng(26), 'Q4_0', 4, 32), 4, 32), 'keep', 'matmul');
    assert.throws(() => quant.reshape(t, [32, 4]), /reshape: t \[4, 32\] is a Q4_0 matmul weight kept quantized \(LLMTS_CPU_QUANT_WEIGHTS\)/);
    const x = quant.upload(new Float32Array(128), [4, 32]);
    assert.throws(() => quant.add(x, t, 1), /add: b \[4, 32\] is a Q4_0 matmul weight kept quantized/);
    quant.free(t);
  });
});
