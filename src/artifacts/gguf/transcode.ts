// ggml types the CPU kernels have no layout of their own for, rewritten block by block into one
// they have, value for value: every weight of the result dequantizes (dequant.ts) to the bits the
// source's does, so a backend keeping the result quantized multiplies the file's own values.
//
//   Q5_0   -> Q8_0   d * (q - 16), q - 16 in [-16, 15]: the same f16 d over int8 values
//   IQ4_NL -> Q8_0   d * kv[q], the non-linear table's values int8 (-127..113): the same f16 d
//   Q3_K   -> Q6_K   (d * (sc - 32)) * (q - 4 [hmask bit clear]), the offset value in [-4, 3] is
//                    q6 - 32 for q6 in [28, 35]; sc - 32 is Q6_K's int8 scale of the same 16
//                    weights, d its super-block f16
//
// The result holds more bytes than the file (Q8_0 34 per 32 weights against Q5_0's 22 and
// IQ4_NL's 18; Q6_K 210 per 256 against Q3_K's 110), and fewer than the bf16 they would
// otherwise dequantize into (64 per 32): decode streams them once a token, and the integer dot
// products replace bf16 FMAs at prefill.

import type { QuantizedType } from '../../contracts/backend.ts';

/** ggml types rewritten into a kept one, and what into */
export const TRANSCODED: Readonly<Record<string, QuantizedType>> = { Q5_0: 'Q8_0', IQ4_NL: 'Q8_0', Q3_K: 'Q6_K' };

const IQ4NL_VALUES = new Int8Array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]);

const SRC_BYTES: Record<string, number> = { Q5_0: 22, IQ4_NL: 18, Q3_K: 110 };
const DST_BYTES: Partial<Record<QuantizedType, number>> = { Q8_0: 34, Q6_K: 210 };

/** `src` (whole blocks of `type`, a key of TRANSCODED) as blocks of TRANSCODED[type]. */
export function transcodeBlocks(type: string, src: Uint8Array): Uint8Array {
  const to = TRANSCODED[type];
  if (!to) throw new Error(`ggml type ${type} has no transcoding to a kept type`);
  const sb = SRC_BYTES[type]!, db = DST_BYTES[to]!;
  if (src.length % sb !== 0) throw new Error(`${type}: ${src.length} bytes is not a whole number of ${sb}-byte blocks`);
  const blocks = src.length / sb;
  const out = new Uint8Array(blocks * db);
  const block = type === 'Q5_0' ? q5_0ToQ8_0 : type === 'IQ4_NL' ? iq4nlToQ8_0 : q3kToQ6k;
  for (let i = 0; i < blocks; i++) block(src, i * sb, out, i * db);
  return out;
}

/** Q5_0 (d f16, qh u32: bit j the fifth bit of element j, 16 bytes of nibbles) -> Q8_0 (d f16, 32 int8) */
function q5_0ToQ8_0(s: Uint8Array, o: number, d: Uint8Array, at: number): void {
  d[at] = s[o]!;
  d[at + 1] = s[o + 1]!;
  const qh = (s[o + 2]! | (s[o + 3]! << 8) | (s[o + 4]! << 16) | (s[o + 5]! << 24)) >>> 0;
  for (let j = 0; j < 16; j++) {
    const q = s[o + 6 + j]!;
    d[at + 2 + j] = (((q & 0xf) | (((qh >>> j) & 1) << 4)) - 16) & 0xff;
    d[at + 2 + j + 16] = (((q >> 4) | (((qh >>> (j + 16)) & 1) << 4)) - 16) & 0xff;
  }
}

/** IQ4_NL (d f16, 16 bytes of nibbles: low nibbles elements 0..15, high 16..31) -> Q8_0 */
function iq4nlToQ8_0(s: Uint8Array, o: number, d: Uint8Array, at: number): void {
  d[at] = s[o]!;
  d[at + 1] = s[o + 1]!;
  for (let j = 0; j < 16; j++) {
    const q = s[o + 2 + j]!;
    d[at + 2 + j] = IQ4NL_VALUES[q & 0xf]! & 0xff;
    d[at + 2 + j + 16] = IQ4NL_VALUES[q >> 4]! & 0xff;
  }
}

/**
 * Q3_K (hmask[32]: element 32k + l's bit k of hmask[l], set = no -4; qs[64]: element 128h + 32s + l
 * is bits 2s..2s+1 of qs[32h + l]; scales[12]: 16 six-bit scales biased by 32; d f16) -> Q6_K
 * (ql[128]: element 128h + 64n + k is nibble n of ql[64h + k]; qh[64]: element 128h + 32s + l is
 * bits 2s..2s+1 of qh[32h + l]; scales int8[16]; d f16), values q6 = value + 32.
 */
function q3kToQ6k(s: Uint8Array, o: number, d: Uint8Array, at: number): void {
  for (let e = 0; e < 256; e++) {
    const l = e & 31;
    const ql = (s[o + 32 + ((e >> 7) << 5) + l]! >> (((e >> 5) & 3) * 2)) & 3;
    const off = ((s[o + l]! >> (e >> 5)) & 1) ^ 1;
    const q6 = ql - (off << 2) + 32;
    const h = e >> 7;
    d[at + (h << 6) + (e & 63)]! |= (q6 & 0xf) << (((e >> 6) & 1) * 4);
    d[at + 128 + (h << 5) + l]! |= (q6 >> 4) << (((e >> 5) & 3) * 2);
  }
  const sc = o + 96;
  for (let g = 0; g < 16; g++) {
    const lo = g < 8 ? s[sc + g]! & 0xf : s[sc + g - 8]! >> 4;
    const hi = (s[sc + 8 + (g & 3)]! >> ((g >> 2) * 2)) & 3;
    d[at + 192 + g] = ((lo | (hi << 4)) - 32) & 0xff;
  }
  d[at + 208] = s[o + 108]!;
  d[at + 209] = s[o + 109]!;
}
