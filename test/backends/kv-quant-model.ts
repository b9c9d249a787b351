// A TypeScript statement of the one-byte KV pool rows (native/kv_format.h, native/kv.c): what
// writeKv stores for a row of D floats, and the f32 values attention reads back. Every operation
// is the native code's f32 operation (Math.fround after each one), so the tests compare bytes and
// values exactly.

export type KvByteDtype = 'int8' | 'fp8';

/** rows whose largest magnitude is below this are zeros with scale 0 */
const AMAX_MIN = 2 ** -100;
const TOP: Record<KvByteDtype, number> = { int8: 127, fp8: 448 };

export { f32ToE4m3, rintEven } from '../../src/artifacts/e4m3.ts';
import { f32ToE4m3, rintEven } from '../../src/artifacts/e4m3.ts';

/** the value of an e4m3 byte */
export function e4m3Value(b: number): number {
  const sign = b & 0x80 ? -1 : 1, e = (b >> 3) & 0xf, m = b & 7;
  if (e === 15 && m === 7) return NaN;
  return sign * (e === 0 ? m * 2 ** -9 : (8 + m) * 2 ** (e - 10));
}

/** the D + 4 bytes writeKv stores for row x (D values, then the f32 scale little-endian) */
export function quantizeRow(x: ArrayLike<number>, dt: KvByteDtype): Uint8Array {
  const D = x.length, out = new Uint8Array(D + 4);
  let amax = 0, finite = true;
  for (let d = 0; d < D; d++) {
    const a = Math.abs(x[d]!);
    if (!(a <= 3.4028234663852886e38)) finite = false;
    else if (a > amax) amax = a;
  }
  const top = TOP[dt];
  let scale = 0;
  if (!finite) scale = NaN;
  else if (amax >= AMAX_MIN) {
    scale = Math.fround(amax / top);
    const inv = Math.fround(top / amax);
    for (let d = 0; d < D; d++) {
      const y = Math.fround(x[d]! * inv);
      out[d] = dt === 'int8' ? Math.max(-127, Math.min(127, rintEven(y))) & 0xff : f32ToE4m3(y);
    }
  }
  new DataView(out.buffer).setFloat32(D, scale, true);
  return out;
}

/** the f32 values attention reads from a row of quantizeRow's bytes */
export function dequantizeRow(row: Uint8Array, dt: KvByteDtype): Float32Array {
  const D = row.length - 4;
  const scale = new DataView(row.buffer, row.byteOffset, row.byteLength).getFloat32(D, true);
  return Float32Array.from(row.subarray(0, D), (q) => (dt === 'int8' ? ((q << 24) >> 24) : e4m3Value(q)) * scale);
}

/** quantizeRow over every row of D of `x`, concatenated */
export function quantizeRows(x: Float32Array, D: number, dt: KvByteDtype): Uint8Array {
  const n = x.length / D, out = new Uint8Array(n * (D + 4));
  for (let r = 0; r < n; r++) out.set(quantizeRow(x.subarray(r * D, (r + 1) * D), dt), r * (D + 4));
  return out;
}

/** dequantizeRow over every row of bytes of quantizeRows */
export function dequantizeRows(bytes: Uint8Array, D: number, dt: KvByteDtype): Float32Array {
  const n = bytes.length / (D + 4), out = new Float32Array(n * D);
  for (let r = 0; r < n; r++) out.set(dequantizeRow(bytes.subarray(r * (D + 4), (r + 1) * (D + 4)), dt), r * D);
  return out;
}
