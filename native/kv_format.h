// How the KV pools hold one row (one token's keys or values of one kv head, D elements): f32 and
// bf16 rows are D elements; DT_KV_INT8 and DT_KV_FP8 rows are D one-byte values (int8, or fp8
// e4m3: 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities) followed by the row's
// f32 scale, little-endian, unaligned: element d = value(q_d) * scale. kv.c writes them (the
// rounding is stated there), attention reads them.
#ifndef KV_FORMAT_H
#define KV_FORMAT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "llm.h"
#include "simd.h"

static inline int dt_kv8(int dt) { return dt == DT_KV_INT8 || dt == DT_KV_FP8; }
// Whether the KV pools may hold dt.
static inline int dt_kv(int dt) { return dt == DT_F32 || dt == DT_BF16 || dt_kv8(dt); }

// Bytes of one pool row of D elements.
static inline size_t kv_row_bytes(int dt, int64_t D) {
  return dt_kv8(dt) ? (size_t)D + 4 : (size_t)D * dtype_size(dt);
}

// The largest magnitude of each one-byte format: int8 keeps [-127, 127] (symmetric), e4m3's
// largest finite value is 448.
#define KV_INT8_MAX 127.0f
#define KV_FP8_MAX 448.0f

// e4m3 bits -> the f16 whose bits are sign << 15 | (the 7 exponent and mantissa bits) << 7: the
// same value divided by 2^8, exactly, subnormals included (e4m3's exponent bias 7 is f16's 15
// minus 8). Readers convert with the hardware's f16 -> f32 instruction and fold the 2^8 into the
// row's scale (kv8_scale).
static inline uint16_t e4m3_as_f16_bits(uint8_t b) {
  return (uint16_t)(((uint16_t)(b & 0x80) << 8) | ((uint16_t)(b & 0x7f) << 7));
}

// The factor a row's one-byte values are multiplied by as readers widen them: its scale (int8), or
// its scale times 2^8 (fp8, widened through e4m3_as_f16_bits). Exact: a power-of-two factor.
static inline float kv8_scale(const void *row, int dt, int64_t D) {
  float s;
  memcpy(&s, (const uint8_t *)row + D, 4);
  return dt == DT_KV_FP8 ? s * 256.0f : s;
}

// Element d of a row of dt as f32 (scalar tails; the vector loads compute the same values).
static inline float kv_elem(const void *row, int dt, int64_t D, int64_t d) {
  if (dt == DT_F32) return ((const float *)row)[d];
  if (dt == DT_BF16) return bf16_to_f32(((const uint16_t *)row)[d]);
  const uint8_t q = ((const uint8_t *)row)[d];
  const float v = dt == DT_KV_INT8 ? (float)(int8_t)q : f16_to_f32(e4m3_as_f16_bits(q));
  return v * kv8_scale(row, dt, D);
}

// |y| <= 448 rounded to the nearest e4m3 value, ties to even (larger magnitudes saturate to 448).
static inline uint8_t f32_to_e4m3(float y) {
  const uint8_t sign = signbit(y) ? 0x80 : 0;
  const float a = fabsf(y);
  if (a >= KV_FP8_MAX) return sign | 0x7e;
  if (a < 0x1p-6f) return sign | (uint8_t)rintf(a * 0x1p9f); // subnormals: steps of 2^-9 (8 = 2^-6, the first normal)
  int e;
  frexpf(a, &e);                                                // a = f 2^e, f in [0.5, 1): a's exponent is e - 1
  const int m = (int)rintf(ldexpf(a, 4 - e));                   // 8..16: the implicit bit and 3 mantissa bits, rounded
  const int code = (e - 1 + 7) * 8 + (m - 8);                   // m = 16 carries into the exponent
  return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

#endif
