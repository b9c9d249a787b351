// 16-bit float encodings (bit patterns in Uint16Array), exact in both directions where possible:
// decoding is exact; encoding rounds to nearest even, as PyTorch's .to(bfloat16 / float16).

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

export function bf16ToF32(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0]!;
}

export function f32ToBf16(x: number): number {
  f32[0] = x;
  const u = u32[0]!;
  if ((u & 0x7f800000) === 0x7f800000 && (u & 0x7fffff) !== 0) return (u >>> 16) | 0x40; // quiet NaN
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function f16ToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const man = h & 0x3ff;
  if (exp === 0) return sign * man * 2 ** -24;
  if (exp === 31) return man ? NaN : sign * Infinity;
  return sign * (1 + man / 1024) * 2 ** (exp - 15);
}

export function f32ToF16(x: number): number {
  f32[0] = x;
  const v = f32[0]!; // work on the f32 value, as a tensor cast does
  const sign = v < 0 || Object.is(v, -0) ? 0x8000 : 0;
  const a = Math.abs(v);
  if (Number.isNaN(v)) return 0x7e00;
  if (a >= 65520) return sign | 0x7c00; // rounds to infinity
  if (a < 2 ** -14) {
    // subnormal (or zero): units of 2^-24, round half to even
    return sign | roundHalfEven(a * 2 ** 24);
  }
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--; // guard log2 rounding
  if (2 ** (e + 1) <= a) e++;
  const m = roundHalfEven((a / 2 ** e - 1) * 1024);
  if (m === 1024) return sign | ((e + 16) << 10); // mantissa overflowed into the exponent
  return sign | ((e + 15) << 10) | m;
}

function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

export function decodeHalf(bits: Uint16Array, dtype: 'f16' | 'bf16'): Float32Array {
  const out = new Float32Array(bits.length);
  const dec = dtype === 'bf16' ? bf16ToF32 : f16ToF32;
  for (let i = 0; i < bits.length; i++) out[i] = dec(bits[i]!);
  return out;
}

export function encodeHalf(values: ArrayLike<number>, dtype: 'f16' | 'bf16'): Uint16Array {
  const out = new Uint16Array(values.length);
  const enc = dtype === 'bf16' ? f32ToBf16 : f32ToF16;
  for (let i = 0; i < values.length; i++) out[i] = enc(values[i]!);
  return out;
}
