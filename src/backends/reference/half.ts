// Exact bf16 / f16 -> f32 decoding on the host (the reference backend and tests use it).

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

export function bf16ToF32(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0];
}

export function f16ToF32(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const frac = bits & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24; // subnormal
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** Decodes little-endian raw bytes of the given dtype into f32. */
export function decodeToF32(bytes: Uint8Array, dtype: 'f32' | 'f16' | 'bf16'): Float32Array {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === 'f32') {
    const out = new Float32Array(bytes.byteLength / 4);
    for (let i = 0; i < out.length; i++) out[i] = dv.getFloat32(i * 4, true);
    return out;
  }
  const out = new Float32Array(bytes.byteLength / 2);
  const dec = dtype === 'bf16' ? bf16ToF32 : f16ToF32;
  for (let i = 0; i < out.length; i++) out[i] = dec(dv.getUint16(i * 2, true));
  return out;
}
