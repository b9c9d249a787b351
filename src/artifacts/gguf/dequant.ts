// ggml blocks -> f32, one function per type, bit for bit what gguf-py's `gguf.quants.dequantize`
// computes (numpy, float32 throughout): every product and sum is rounded to f32 where numpy
// rounds it (Math.fround), in numpy's order of operations. A product of two f32 values is exact in
// a double, and so is rounding a double sum of two f32 values once, so each fround equals numpy's
// float32 operation. Block layouts: gguf-py quants.py / ggml-common.h.
//
// The raw blocks stay what the reader hands out (reader.ts readTensorBytes); this file only turns
// them into values, so later native kernels can take the same blocks as they are.

import type { GgmlType } from './ggml-types.ts';

const fr = Math.fround;

/** f16 bit pattern -> f32 value, all 65536 of them (exact: every f16 is an f32). */
export const F16_TO_F32: Float32Array = (() => {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1;
    const exp = (h >> 10) & 0x1f;
    const man = h & 0x3ff;
    if (exp === 0) t[h] = sign * man * 2 ** -24;
    else if (exp === 31) t[h] = man === 0 ? sign * Infinity : NaN;
    else t[h] = sign * (1 + man / 1024) * 2 ** (exp - 15);
  }
  return t;
})();

const IQ4NL_VALUES = new Int8Array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]);

type BlockFn = (b: Uint8Array, o: number, out: Float32Array, at: number) => void;

const h16 = (b: Uint8Array, o: number): number => F16_TO_F32[b[o]! | (b[o + 1]! << 8)]!;

/** Q4_0: d f16, 16 bytes of nibbles (low nibbles are elements 0..15, high 16..31); x = d * (q - 8) */
const q4_0: BlockFn = (b, o, out, at) => {
  const d = h16(b, o);
  for (let j = 0; j < 16; j++) {
    const q = b[o + 2 + j]!;
    out[at + j] = fr(d * ((q & 0xf) - 8));
    out[at + j + 16] = fr(d * ((q >> 4) - 8));
  }
};

/** Q4_1: d, m f16, 16 bytes of nibbles; x = d * q + m */
const q4_1: BlockFn = (b, o, out, at) => {
  const d = h16(b, o), m = h16(b, o + 2);
  for (let j = 0; j < 16; j++) {
    const q = b[o + 4 + j]!;
    out[at + j] = fr(fr(d * (q & 0xf)) + m);
    out[at + j + 16] = fr(fr(d * (q >> 4)) + m);
  }
};

/** Q5_0: d f16, qh u32 (bit j = fifth bit of element j), 16 bytes of nibbles; x = d * (q - 16) */
const q5_0: BlockFn = (b, o, out, at) => {
  const d = h16(b, o);
  const qh = (b[o + 2]! | (b[o + 3]! << 8) | (b[o + 4]! << 16) | (b[o + 5]! << 24)) >>> 0;
  for (let j = 0; j < 16; j++) {
    const q = b[o + 6 + j]!;
    out[at + j] = fr(d * (((q & 0xf) | (((qh >>> j) & 1) << 4)) - 16));
    out[at + j + 16] = fr(d * (((q >> 4) | (((qh >>> (j + 16)) & 1) << 4)) - 16));
  }
};

/** Q5_1: d, m f16, qh u32, 16 bytes of nibbles; x = d * q + m */
const q5_1: BlockFn = (b, o, out, at) => {
  const d = h16(b, o), m = h16(b, o + 2);
  const qh = (b[o + 4]! | (b[o + 5]! << 8) | (b[o + 6]! << 16) | (b[o + 7]! << 24)) >>> 0;
  for (let j = 0; j < 16; j++) {
    const q = b[o + 8 + j]!;
    out[at + j] = fr(fr(d * ((q & 0xf) | (((qh >>> j) & 1) << 4))) + m);
    out[at + j + 16] = fr(fr(d * ((q >> 4) | (((qh >>> (j + 16)) & 1) << 4))) + m);
  }
};

/** Q8_0: d f16, 32 int8; x = q * d */
const q8_0: BlockFn = (b, o, out, at) => {
  const d = h16(b, o);
  for (let j = 0; j < 32; j++) out[at + j] = fr(((b[o + 2 + j]! << 24) >> 24) * d);
};

/**
 * Q2_K: scales[16] (low nibble scale, high nibble min, one per 16 elements), qs[64] (2-bit values:
 * element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]), d, dmin f16; x = (d*sc) * q - (dmin*m)
 */
const q2_k: BlockFn = (b, o, out, at) => {
  const d = h16(b, o + 80), dmin = h16(b, o + 82);
  for (let g = 0; g < 16; g++) {
    const sc = b[o + g]!;
    const dl = fr(d * (sc & 0xf)), ml = fr(dmin * (sc >> 4));
    for (let i = 0; i < 16; i++) {
      const e = g * 16 + i;
      const q = (b[o + 16 + ((e >> 7) << 5) + (e & 31)]! >> (((e >> 5) & 3) * 2)) & 3;
      out[at + e] = fr(fr(dl * q) - ml);
    }
  }
};

/**
 * Q3_K: hmask[32] (element 32k + l: bit k of hmask[l], set = no -4 offset), qs[64] (low 2 bits,
 * laid out as Q2_K's), scales[12] (16 six-bit scales, biased by 32), d f16; x = (d*sc) * q
 */
const q3_k: BlockFn = (b, o, out, at) => {
  const d = h16(b, o + 108);
  const s = o + 96;
  for (let g = 0; g < 16; g++) {
    const lo = g < 8 ? b[s + g]! & 0xf : b[s + g - 8]! >> 4;
    const hi = (b[s + 8 + (g & 3)]! >> ((g >> 2) * 2)) & 3;
    const dl = fr(d * (((lo | (hi << 4)) << 24 >> 24) - 32));
    for (let i = 0; i < 16; i++) {
      const e = g * 16 + i;
      const l = e & 31;
      const ql = (b[o + 32 + ((e >> 7) << 5) + l]! >> (((e >> 5) & 3) * 2)) & 3;
      const qh = ((b[o + l]! >> (e >> 5)) & 1) ^ 1;
      out[at + e] = fr(dl * (ql - (qh << 2)));
    }
  }
};

/** Q4_K / Q5_K six-bit scale and min of sub-block j (0..7) from the 12 scale bytes at s. */
function scaleMin(b: Uint8Array, s: number, j: number): [number, number] {
  if (j < 4) return [b[s + j]! & 0x3f, b[s + 4 + j]! & 0x3f];
  const md = b[s + 8 + j - 4]!;
  return [(md & 0x0f) | ((b[s + j - 4]! >> 2) & 0x30), (md >> 4) | ((b[s + j]! >> 2) & 0x30)];
}

/** Q4_K: d, dmin f16, scales[12], qs[128] (sub-block j: nibble j&1 of qs[32(j>>1) + l]); x = (d*sc) * q - (dmin*m) */
const q4_k: BlockFn = (b, o, out, at) => {
  const d = h16(b, o), dmin = h16(b, o + 2);
  for (let j = 0; j < 8; j++) {
    const [sc, m] = scaleMin(b, o + 4, j);
    const dl = fr(d * sc), ml = fr(dmin * m);
    const base = o + 16 + ((j >> 1) << 5), shift = (j & 1) * 4;
    for (let l = 0; l < 32; l++) out[at + j * 32 + l] = fr(fr(dl * ((b[base + l]! >> shift) & 0xf)) - ml);
  }
};

/** Q5_K: as Q4_K, plus qh[32] (bit j of qh[l] is the fifth bit of sub-block j's element l) */
const q5_k: BlockFn = (b, o, out, at) => {
  const d = h16(b, o), dmin = h16(b, o + 2);
  for (let j = 0; j < 8; j++) {
    const [sc, m] = scaleMin(b, o + 4, j);
    const dl = fr(d * sc), ml = fr(dmin * m);
    const base = o + 48 + ((j >> 1) << 5), shift = (j & 1) * 4;
    for (let l = 0; l < 32; l++) {
      const q = ((b[base + l]! >> shift) & 0xf) | (((b[o + 16 + l]! >> j) & 1) << 4);
      out[at + j * 32 + l] = fr(fr(dl * q) - ml);
    }
  }
};

/**
 * Q6_K: ql[128] (element 128h + 64n + k: nibble n of ql[64h + k]), qh[64] (element 128h + 32s + l:
 * bits 2s..2s+1 of qh[32h + l]), scales int8[16] (one per 16 elements), d f16; x = (d*sc) * (q - 32)
 */
const q6_k: BlockFn = (b, o, out, at) => {
  const d = h16(b, o + 208);
  for (let g = 0; g < 16; g++) {
    const dl = fr(d * ((b[o + 192 + g]! << 24) >> 24));
    for (let i = 0; i < 16; i++) {
      const e = g * 16 + i;
      const h = e >> 7;
      const ql = (b[o + (h << 6) + (e & 63)]! >> (((e >> 6) & 1) * 4)) & 0xf;
      const qh = (b[o + 128 + (h << 5) + (e & 31)]! >> (((e >> 5) & 3) * 2)) & 3;
      out[at + e] = fr(dl * ((ql | (qh << 4)) - 32));
    }
  }
};

/** IQ4_NL: d f16, 16 bytes of nibbles (Q4_0's order) indexing a fixed non-linear table; x = d * kv */
const iq4_nl: BlockFn = (b, o, out, at) => {
  const d = h16(b, o);
  for (let j = 0; j < 16; j++) {
    const q = b[o + 2 + j]!;
    out[at + j] = fr(d * IQ4NL_VALUES[q & 0xf]!);
    out[at + j + 16] = fr(d * IQ4NL_VALUES[q >> 4]!);
  }
};

/**
 * IQ4_XS: d f16, scales_h u16 (2 high bits per sub-block), scales_l[4] (a nibble per sub-block),
 * qs[128] (sub-block j: 16 bytes, low nibbles first); x = (d * (sc - 32)) * kv
 */
const iq4_xs: BlockFn = (b, o, out, at) => {
  const d = h16(b, o);
  const sh = b[o + 2]! | (b[o + 3]! << 8);
  for (let j = 0; j < 8; j++) {
    const lo = (b[o + 4 + (j >> 1)]! >> ((j & 1) * 4)) & 0xf;
    const hi = (sh >> (2 * j)) & 3;
    const dl = fr(d * ((lo | (hi << 4)) - 32));
    const base = o + 8 + j * 16;
    for (let k = 0; k < 16; k++) {
      const q = b[base + k]!;
      out[at + j * 32 + k] = fr(dl * IQ4NL_VALUES[q & 0xf]!);
      out[at + j * 32 + k + 16] = fr(dl * IQ4NL_VALUES[q >> 4]!);
    }
  }
};

const BLOCK_FNS: Record<string, BlockFn> = {
  Q4_0: q4_0, Q4_1: q4_1, Q5_0: q5_0, Q5_1: q5_1, Q8_0: q8_0,
  Q2_K: q2_k, Q3_K: q3_k, Q4_K: q4_k, Q5_K: q5_k, Q6_K: q6_k,
  IQ4_NL: iq4_nl, IQ4_XS: iq4_xs,
};

/**
 * Dequantizes `src` (whole blocks of `type`) into `out` from element `at`. Plain float types
 * (F32, F16, BF16) convert too. Throws for a type with no dequantizer or a partial block.
 */
export function dequantize(type: GgmlType, src: Uint8Array, out: Float32Array, at = 0): void {
  if (src.length % type.typeSize !== 0) {
    throw new Error(`${type.name}: ${src.length} bytes is not a whole number of ${type.typeSize}-byte blocks`);
  }
  const blocks = src.length / type.typeSize;
  if (at + blocks * type.blockSize > out.length) throw new Error(`${type.name}: output too small`);
  switch (type.name) {
    case 'F32':
      out.set(new Float32Array(src.buffer.slice(src.byteOffset, src.byteOffset + src.length)), at);
      return;
    case 'F16':
      for (let i = 0; i < blocks; i++) out[at + i] = F16_TO_F32[src[2 * i]! | (src[2 * i + 1]! << 8)]!;
      return;
    case 'BF16': {
      const u = new Uint32Array(out.buffer, out.byteOffset + at * 4, blocks);
      for (let i = 0; i < blocks; i++) u[i] = ((src[2 * i]! | (src[2 * i + 1]! << 8)) << 16) >>> 0;
      return;
    }
  }
  const fn = BLOCK_FNS[type.name];
  if (!fn) throw new Error(`no dequantizer for ggml type ${type.name}`);
  for (let i = 0, o = 0, a = at; i < blocks; i++, o += type.typeSize, a += type.blockSize) fn(src, o, out, a);
}

/**
 * dequantize() straight into bf16 bits (round to nearest even): one block at a time through a
 * small f32 scratch, so a large tensor never exists as f32 (a 150k x 1024 embedding would be 600 MB).
 */
export function dequantizeToBf16(type: GgmlType, src: Uint8Array, out: Uint16Array): void {
  if (src.length % type.typeSize !== 0) {
    throw new Error(`${type.name}: ${src.length} bytes is not a whole number of ${type.typeSize}-byte blocks`);
  }
  const blocks = src.length / type.typeSize;
  if (blocks * type.blockSize > out.length) throw new Error(`${type.name}: output too small`);
  const fn = BLOCK_FNS[type.name];
  if (!fn) {
    const f = new Float32Array(blocks * type.blockSize);
    dequantize(type, src, f);
    out.set(f32ToBf16(f));
    return;
  }
  const bs = type.blockSize;
  const scratch = new Float32Array(bs);
  const u = new Uint32Array(scratch.buffer);
  for (let i = 0, o = 0, a = 0; i < blocks; i++, o += type.typeSize, a += bs) {
    fn(src, o, scratch, 0);
    for (let j = 0; j < bs; j++) {
      const n = u[j]!;
      out[a + j] = (n & 0x7fffffff) > 0x7f800000 ? ((n >>> 16) | 64) : ((n + 0x7fff + ((n >>> 16) & 1)) >>> 16);
    }
  }
}

/** f32 -> bf16 bits, round to nearest even, NaN kept quiet (ggml_compute_fp32_to_bf16). */
export function f32ToBf16(x: Float32Array): Uint16Array {
  const u = new Uint32Array(x.buffer, x.byteOffset, x.length);
  const out = new Uint16Array(x.length);
  for (let i = 0; i < u.length; i++) {
    const n = u[i]!;
    out[i] = (n & 0x7fffffff) > 0x7f800000 ? ((n >>> 16) | 64) : ((n + 0x7fff + ((n >>> 16) & 1)) >>> 16);
  }
  return out;
}
