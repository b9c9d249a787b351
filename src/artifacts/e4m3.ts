// Rounding f32 to FP8 e4m3 (float8_e4m3fn: 4 exponent bits, bias 7, 3 mantissa bits, no
// infinities, 0x7f / 0xff NaN, largest 448), as PyTorch's conversion rounds: to nearest, ties to even.
// The oracle: test/fixtures/kv-quant/e4m3.json (tools/oracle/kv_quant_reference.py).

/** x rounded to the nearest integer, ties to even (C's rintf in the default rounding mode) */
export function rintEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** the e4m3 byte nearest |y| <= 448, ties to even; larger magnitudes saturate to 448 (0x7e) */
export function f32ToE4m3(y: number): number {
  const sign = y < 0 || Object.is(y, -0) ? 0x80 : 0;
  const a = Math.abs(y);
  if (a >= 448) return sign | 0x7e;
  if (a < 2 ** -6) return sign | rintEven(a * 2 ** 9);
  const e = Math.floor(Math.log2(a));
  // log2 can land one off at exact powers of two: settle the exponent so that a / 2^e is in [1, 2)
  const exp = a / 2 ** e >= 2 ? e + 1 : a / 2 ** e < 1 ? e - 1 : e;
  const m = rintEven(a / 2 ** (exp - 3)); // 8..16, exact: a power-of-two scaling
  return sign | Math.min((exp + 7) * 8 + (m - 8), 0x7e);
}
