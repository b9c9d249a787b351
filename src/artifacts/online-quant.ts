// Quantizing a float checkpoint's matrices at load (`--quantization q8_0|q4_0|fp8`, as vLLM's
// `--quantization`): every 2-D weight whose rows are whole blocks of 32 becomes ggml blocks of
// that type, computed on the host as llama.cpp's reference quantizers compute them (gguf-py's
// `gguf.quants.quantize` states them in numpy, float32 throughout; each operation here rounds to
// f32 where numpy does):
//   Q8_0  d = max|x| / 127, q = x * (1 / d) rounded half away from zero (0 when d = 0), d as f16;
//   Q4_0  m = the x of largest magnitude (the first), d = m / -8, q = trunc(x * (1 / d) + 8.5)
//         clamped to [0, 15], d as f16; nibbles: elements 0..15 low, 16..31 high.
// The CPU backend keeps such matrices quantized exactly as it keeps a GGUF's (WeightSource.quantized);
// every other use of the tensor (a backend or path that does not keep it) reads the blocks'
// dequantized values, so the model computes with the same weights either way.
//   fp8   (the CUDA backend, as vLLM's `--quantization fp8` but a scale a row, not a tensor): the
//         decoder layers' matrices with K % 16 == 0 (not the embedding or lm_head) as e4m3 bytes
//         and an f32 scale a row, s = max|x| / 448, q = e4m3(x / s) to nearest, ties to even
//         (e4m3.ts); kept FP8 as an FP8 checkpoint's are (WeightSource.fp8). A matrix already FP8
//         in the checkpoint keeps its own bytes and scales.

import { encodeHalf, f32ToF16 } from '../backends/common/half.ts';
import type { FloatDType, Fp8Matrix, QuantizedType, WeightSource } from '../contracts/backend.ts';
import { f32ToE4m3 } from './e4m3.ts';
import { E4M3_VALUES } from './fp8-checkpoint.ts';
import { dequantize } from './gguf/dequant.ts';
import { GGML_TYPE_BY_NAME } from './gguf/ggml-types.ts';
import { readSourceValues } from './source-values.ts';
import { WeightIndex } from './safetensors.ts';

/** what `--quantization` accepts */
export const ONLINE_QUANTIZATIONS = ['q8_0', 'q4_0', 'fp8'] as const;
export type OnlineQuantization = (typeof ONLINE_QUANTIZATIONS)[number];

/** the backend whose kernels multiply each online quantization's matrices as they are kept */
export const QUANTIZATION_BACKEND: Record<OnlineQuantization, 'cpu' | 'cuda'> = { q8_0: 'cpu', q4_0: 'cpu', fp8: 'cuda' };

const TYPE_OF: Record<Exclude<OnlineQuantization, 'fp8'>, QuantizedType> = { q8_0: 'Q8_0', q4_0: 'Q4_0' };
const BLOCK = 32;
const fr = Math.fround;

/** numpy's np_roundf (gguf-py): half away from zero */
function roundAway(x: number): number {
  const a = Math.abs(x), f = Math.floor(a);
  return Math.sign(x) * (f + Math.floor(2 * (a - f)));
}

/** x (a multiple of 32 values) as Q8_0 blocks: 2 bytes of f16 d, 32 int8 */
export function quantizeQ8_0(x: Float32Array): Uint8Array {
  const out = new Uint8Array((x.length / BLOCK) * 34);
  for (let b = 0, o = 0; b < x.length; b += BLOCK, o += 34) {
    let amax = 0;
    for (let j = 0; j < BLOCK; j++) amax = Math.max(amax, Math.abs(x[b + j]!));
    const d = fr(amax / 127), id = d === 0 ? 0 : fr(1 / d);
    const h = f32ToF16(d);
    out[o] = h & 0xff;
    out[o + 1] = h >> 8;
    for (let j = 0; j < BLOCK; j++) out[o + 2 + j] = roundAway(fr(x[b + j]! * id)) & 0xff;
  }
  return out;
}

/** x (a multiple of 32 values) as Q4_0 blocks: 2 bytes of f16 d, 16 bytes of nibbles */
export function quantizeQ4_0(x: Float32Array): Uint8Array {
  const out = new Uint8Array((x.length / BLOCK) * 18);
  const q = new Uint8Array(BLOCK);
  for (let b = 0, o = 0; b < x.length; b += BLOCK, o += 18) {
    let m = 0, best = -1;
    for (let j = 0; j < BLOCK; j++) {
      const a = Math.abs(x[b + j]!);
      if (a > best) {
        best = a;
        m = x[b + j]!;
      }
    }
    const d = fr(m / -8), id = d === 0 ? 0 : fr(1 / d);
    for (let j = 0; j < BLOCK; j++) q[j] = Math.min(15, Math.trunc(fr(fr(x[b + j]! * id) + 8.5)));
    const h = f32ToF16(d);
    out[o] = h & 0xff;
    out[o + 1] = h >> 8;
    for (let j = 0; j < 16; j++) out[o + 2 + j] = q[j]! | (q[j + 16]! << 4);
  }
  return out;
}

/** `x` as blocks of `type` */
export function quantizeBlocks(type: QuantizedType, x: Float32Array): Uint8Array {
  if (x.length % BLOCK !== 0) throw new Error(`${type}: ${x.length} values are not whole blocks of ${BLOCK}`);
  if (type === 'Q8_0') return quantizeQ8_0(x);
  if (type === 'Q4_0') return quantizeQ4_0(x);
  throw new Error(`no quantizer for ${type}`);
}

/**
 * x [N, K] as e4m3 bytes and an f32 scale a row (s = max|x| / 448, q = e4m3(x / s); a row of zeros
 * takes scale 1), in Fp8Matrix's layout: one scale column of `scaleCols` (the power of two >= 16
 * that covers K). Throws on a value that is not finite, naming `name`.
 */
export function quantizeFp8Rows(x: Float32Array, N: number, K: number, name: string): Fp8Matrix {
  const bits = new Uint8Array(N * K), scales = new Float32Array(N);
  for (let r = 0; r < N; r++) {
    let amax = 0;
    for (let k = r * K; k < (r + 1) * K; k++) {
      const a = Math.abs(x[k]!);
      if (!(a <= 3.4028234663852886e38)) throw new Error(`${name}: row ${r} holds ${x[k]}; fp8 quantization needs finite weights`);
      if (a > amax) amax = a;
    }
    const s = fr(amax / 448) || 1;
    scales[r] = s;
    for (let k = r * K; k < (r + 1) * K; k++) bits[k] = f32ToE4m3(fr(x[k]! / s));
  }
  return { bits, scales, scaleCols: fp8RowScaleCols(K) };
}

/** the power of two (>= 16) that covers K: one scale column a row */
function fp8RowScaleCols(K: number): number {
  return 2 ** Math.max(4, Math.ceil(Math.log2(K)));
}

/** An Fp8Matrix's values (e4m3 x its row's scale, one f32 multiply) in `want`'s bytes. */
function fp8Values(m: Fp8Matrix, N: number, K: number, want: FloatDType): Uint8Array {
  const f = new Float32Array(N * K);
  const KB = Math.ceil(K / m.scaleCols);
  for (let i = 0; i < f.length; i++) f[i] = E4M3_VALUES[m.bits[i]!]! * m.scales[Math.floor(i / K) * KB + Math.floor((i % K) / m.scaleCols)]!;
  if (want === 'f32') return new Uint8Array(f.buffer);
  return new Uint8Array(encodeHalf(f, want).buffer);
}

/** The values of `type` blocks, in `want`'s bytes. */
function blockValues(type: QuantizedType, blocks: Uint8Array, n: number, want: FloatDType): Uint8Array {
  const f = new Float32Array(n);
  dequantize(GGML_TYPE_BY_NAME.get(type)!, blocks, f);
  if (want === 'f32') return new Uint8Array(f.buffer);
  return new Uint8Array(encodeHalf(f, want).buffer);
}

/**
 * A checkpoint's weights with its matrices quantized to `quantization` as they load: every 2-D
 * tensor with whole blocks of 32 per row carries the blocks (WeightSource.quantized) and their
 * values (decode); vectors and other shapes load as they are.
 */
export class QuantizingWeightIndex extends WeightIndex {
  constructor(private readonly base: WeightIndex, readonly quantization: OnlineQuantization) {
    super(base.source, base.files, new Map(base.names().map((n) => [n, base.entry(n)])));
  }

  override get(name: string): WeightSource {
    const src = this.base.get(name);
    const [N, K] = src.shape;
    if (this.quantization === 'fp8') {
      if (src.fp8 || src.shape.length !== 2 || !N || !K || K % 16 !== 0 || !name.includes('.layers.')) return src;
      const matrix = () => quantizeFp8Rows(readSourceValues(src), N, K, name);
      return { ...src, decode: (want) => fp8Values(matrix(), N, K, want), fp8: matrix, fp8ScaleCols: fp8RowScaleCols(K) };
    }
    if (src.shape.length !== 2 || !N || !K || K % BLOCK !== 0) return src;
    const type = TYPE_OF[this.quantization];
    const blocks = () => quantizeBlocks(type, readSourceValues(src));
    return { ...src, decode: (want) => blockValues(type, blocks(), N * K, want), quantized: { type, blocks } };
  }
}
